"""Record the feature-read stream of training: the rows each step of ``moment train`` gathers.

:func:`record_stream` samples the batches a ``moment train`` run with the same dataset,
fan-outs, batch size, seed and rank would train on (batches depend only on ``(seed,
epoch, rank, step)``, :mod:`training.batches`) and saves each step's vertex ids with
:func:`iostack.bench.emulate.save_stream`, for ``moment bench emulate`` to replay through the
tiered store without the model.

>>> import tempfile, numpy as np
>>> from pathlib import Path
>>> from training.synth import SynthSpec
>>> from training.synth_run import synthesize
>>> from iostack.bench.emulate import make_stream
>>> from iostack.bench.workload import StreamSpec
>>> with tempfile.TemporaryDirectory() as d:
...     _ = synthesize(f"{d}/g", SynthSpec(num_nodes=500, num_edges=3000, feature_dim=4, train_share=0.2))
...     _ = record_stream(f"{d}/g", f"{d}/s.npz", fanouts=(5, 5), batch_size=32)
...     s = make_stream(StreamSpec("recorded", f"{d}/s.npz"), 500)
...     s.steps, bool(s.step(0).size >= 32)
(4, True)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from training.batches import LocalBatchSource
from training.data import open_dataset
from training.sampler import NeighborSampler


def record_stream(dataset: str | os.PathLike[str], out: str | os.PathLike[str], *, fanouts: Sequence[int],
                  batch_size: int, seed: int = 0, epochs: int = 1, rank: int = 0, world_size: int = 1,
                  progress: Callable[[int, int], None] | None = None) -> Path:
    """Sample ``epochs`` epochs of rank ``rank``'s batches and save their vertex ids (and sampling times) to ``out``.

    The same construction as :func:`training.trainer.train` (sampler seeded with ``seed``,
    :class:`~training.batches.LocalBatchSource`), so the stream is the one training reads.
    """
    from iostack.bench.emulate import save_stream

    ds = open_dataset(dataset, validate=False)
    if ds.train_idx is None or len(ds.train_idx) == 0:
        from training.data import DatasetError

        raise DatasetError(f"{ds.path}: no training split to record the stream of")
    sampler = NeighborSampler(ds.indptr, ds.indices, tuple(fanouts), seed=seed)
    source = LocalBatchSource(sampler, np.asarray(ds.train_idx, np.int64), batch_size, rank=rank,
                              world_size=world_size, seed=seed)
    batches, times = [], []
    total = source.steps(0) * epochs
    for epoch in range(epochs):
        it = source.batches(epoch)
        while True:
            t0 = time.perf_counter()
            b = next(it, None)
            if b is None:
                break
            times.append(time.perf_counter() - t0)
            batches.append(b.n_id.numpy().astype(np.int64))
            if progress is not None:
                progress(len(batches), total)
    meta = {"dataset": str(ds.path), "fanouts": list(fanouts), "batch_size": batch_size, "seed": seed,
            "epochs": epochs, "rank": rank, "world_size": world_size}
    return save_stream(out, batches, times, meta)
