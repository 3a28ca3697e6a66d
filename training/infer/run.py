"""Layer-wise inference for every vertex, out of core: :func:`infer`.

A trained model is applied one layer at a time to all vertices (the pattern of
PyG's ``inference(x_all, subgraph_loader)`` in ``examples/reddit.py``, with the
layer's input behind the tiered store instead of in memory): layer ``l`` runs
over every vertex in chunks (:mod:`training.infer.blocks`), each chunk's rows
gathered through a :class:`~iostack.store.FeatureStore` and the chunk's outputs
written to a new SSD bin, the table layer ``l + 1`` reads
(:mod:`training.infer.tables`). Memory holds one chunk's rows and the next
chunk's, gathered on a background thread while this one computes, never a
layer's whole table. The last layer writes the logits, the predicted classes
and, when asked, the last hidden layer's embeddings as ``.npy`` files, renamed
into place together when all are complete.

With full neighbourhoods (the default) every layer's output equals the model's
forward on the whole graph in memory (up to float rounding: the sums run in
another order). A GCN is normalised with whole-graph degrees, which on the whole
graph is what its ``local`` normalisation computes too.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import torch

from iostack.transfer import Transfer, memory_for
from momentbase.jsontypes import JsonObject
from planner.progress import Progress, report
from training.data import Dataset, open_dataset
from training.infer.blocks import Block, chunk_ranges, full_block, sampled_block
from training.infer.model import InferError, LoadedModel, load_model
from training.infer.tables import NpyOut, open_mapped, open_table, write_table

__all__ = ["InferResult", "InferSpec", "infer", "OUTPUTS"]

#: a chunk of a layer's output: ``(start, stop, outputs [stop - start, out_dim], the targets' input rows or None)``
_Out = tuple[int, int, np.ndarray, "np.ndarray | None"]

#: the files an inference writes into its output directory
OUTPUTS = ("logits.npy", "predictions.npy", "embeddings.npy", "infer.json")


@dataclass(frozen=True)
class InferSpec:
    """What to infer: the dataset, the ``moment train`` checkpoint, the output directory ``out``.

    ``placement``: the dataset's placement (``moment place``) the first layer reads through; ``None``: the
    dataset's ``features.npy``, memory-mapped. ``fanouts``: neighbours per layer (``-1`` all); ``None``: all
    in every layer (exact). ``chunk_bytes``: what a chunk may gather (a layer's chunks hold at most
    ``chunk_bytes / (2 × its input row bytes)`` targets and as many edges, so at most ``chunk_bytes`` of rows);
    ``chunk_rows``: that bound in rows instead, the same for every layer. ``embeddings``:
    also write the last hidden layer. ``work_dir``: where the hidden layers' tables go (default ``out``).
    ``overwrite``: replace the results already in ``out``. ``device``: where layers run (default the host).
    """

    dataset: str
    checkpoint: str
    out: str
    placement: str | None = None
    backend: str = "auto"
    fanouts: tuple[int, ...] | None = None
    chunk_bytes: int = 32 << 20
    chunk_rows: int | None = None
    embeddings: bool = False
    work_dir: str | None = None
    overwrite: bool = False
    seed: int = 0
    device: str | None = None
    capacities: str | None = None

    def __post_init__(self) -> None:
        if self.chunk_rows is not None and self.chunk_rows < 1:
            raise InferError(f"`chunk_rows` {self.chunk_rows}: expected a positive number of rows")
        if self.chunk_bytes < 1:
            raise InferError(f"`chunk_bytes` {self.chunk_bytes}: expected a positive size")
        if self.fanouts is not None and any(f == 0 or f < -1 for f in self.fanouts):
            raise InferError(f"`fanouts` {','.join(map(str, self.fanouts))}: expected -1 (all) or a positive count "
                             "per layer")


@dataclass(frozen=True)
class InferResult:
    """What an inference wrote and cost: per layer its seconds, chunks and rows and bytes read per tier."""

    num_nodes: int
    seconds: float
    layers: tuple[JsonObject, ...]
    outputs: dict[str, str]
    peak_rss_bytes: int
    notes: tuple[str, ...] = field(default=())

    @property
    def nodes_per_s(self) -> float:
        """Vertices through every layer per second."""
        return self.num_nodes / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> JsonObject:
        return {"num_nodes": self.num_nodes, "seconds": self.seconds, "nodes_per_s": self.nodes_per_s,
                "peak_rss_bytes": self.peak_rss_bytes, "layers": list(self.layers), "outputs": dict(self.outputs),
                "notes": list(self.notes)}


def _open_input(ds: Dataset, spec: InferSpec, transfer: Transfer):
    """Layer 0's store: the placement's, else the dataset's features memory-mapped."""
    if spec.placement is not None:
        from training.features import open_features

        if not Path(spec.placement).is_dir():
            raise InferError(f"`placement` {spec.placement}: no such placement directory (write one with "
                             "`moment place`, or leave it out to read the dataset's features)")
        return open_features(ds, spec.placement, spec.backend, memory=transfer.memory, capacities=spec.capacities)
    if ds.features is None:
        raise InferError(f"{ds.path}: the dataset has no features.npy; pass the `placement` that holds its rows")
    return open_mapped(ds.features, transfer)


def _check_out(out: Path, spec: InferSpec) -> list[str]:
    """The result files this run writes, after checking none would be overwritten unasked."""
    names = [n for n in OUTPUTS if n != "embeddings.npy" or spec.embeddings]
    if out.exists() and not out.is_dir():
        raise InferError(f"`out` {out}: is a file; name a directory for the results")
    there = [n for n in OUTPUTS if (out / n).exists()]
    if there and not spec.overwrite:
        raise InferError(f"`out` {out}: already holds {', '.join(there)}; pass `overwrite=True` to replace them "
                         "or choose another `out`")
    return names


def _lookups(ds: Dataset, fanouts: Sequence[int], budgets: Sequence[int], seed: int):
    """Per layer, its chunk ranges (at most ``budgets[layer]`` targets and edges each) and how a chunk's block
    is made."""
    indptr, indices = np.asarray(ds.indptr), ds.indices
    out: list[tuple[list[tuple[int, int]], Callable[[int, int], Block]]] = []
    for f, chunk_rows in zip(fanouts, budgets, strict=True):
        if f == -1:
            out.append((chunk_ranges(indptr, chunk_rows), partial(full_block, indptr, indices)))
        else:
            from training.sampler import NeighborSampler

            sampler = NeighborSampler(indptr, indices, [f], seed=seed)
            out.append((chunk_ranges(indptr, chunk_rows, fanout=f), partial(_sampled, sampler, seed)))
    return out


def _sampled(sampler, seed: int, start: int, stop: int) -> Block:
    return sampled_block(sampler, start, stop, seed)


def _chunks(loaded: LoadedModel, layer: int, store, ranges: list[tuple[int, int]],
            make: Callable[[int, int], Block], *, indptr: np.ndarray | None, normalize: bool, keep_input: bool,
            device: torch.device, tick: Callable[[int], None]) -> Iterator[_Out]:
    """Layer ``layer`` over every chunk: ``(start, stop, outputs, the targets' input rows or None)``, in order.

    The next chunk's block is made and gathered on a background thread while this one computes.
    """

    def prepare(r: tuple[int, int]):
        blk = make(*r)
        x = store.gather(blk.n_id, dtype=torch.float32)
        if normalize:  # row-normalised input, as training gathered it (training.pipeline.preparer)
            x = x / x.sum(1, keepdim=True).clamp(min=1.0)
        deg = None
        if indptr is not None:
            ids = blk.n_id.numpy()
            deg = torch.from_numpy((indptr[ids + 1] - indptr[ids]).astype(np.float32)).to(device)
        return blk, x, deg

    with ThreadPoolExecutor(1, thread_name_prefix="infer-gather") as pool:
        todo = iter(ranges)
        pending = deque(pool.submit(prepare, r) for r in [next(todo)] if ranges)
        while pending:
            blk, x, deg = pending.popleft().result()
            nxt = next(todo, None)
            if nxt is not None:
                pending.append(pool.submit(prepare, nxt))
            with torch.no_grad():
                h = loaded.model.layer_forward(layer, x, blk.edge_index.to(device), blk.num_out, deg=deg)
            stop = blk.start + blk.num_out
            tick(stop)
            yield blk.start, stop, h.cpu().numpy(), x[:blk.num_out].cpu().numpy() if keep_input else None


def _tiers(store) -> JsonObject:
    return {k: {"rows": r, "bytes": n} for k, (r, n) in store.totals().items()}


def _write_results(chunks, out: Path, names: list[str], num_nodes: int, loaded: LoadedModel) -> dict[str, str]:
    """The last layer's chunks as ``logits.npy``, ``predictions.npy`` (and ``embeddings.npy``), renamed into
    place together once all are whole; on any failure none is."""
    emb_dim = loaded.model.out_dims[-2] if "embeddings.npy" in names else 0
    files: dict[str, NpyOut] = {}
    try:
        files["logits.npy"] = NpyOut(out / "logits.npy", np.float32, (num_nodes, loaded.num_classes))
        files["predictions.npy"] = NpyOut(out / "predictions.npy", np.int64, (num_nodes,))
        if emb_dim:
            files["embeddings.npy"] = NpyOut(out / "embeddings.npy", np.float32, (num_nodes, emb_dim))
        for _, _, h, x in chunks:
            files["logits.npy"].write(h)
            files["predictions.npy"].write(h.argmax(1))
            if emb_dim:
                files["embeddings.npy"].write(x)
        for f in files.values():
            f.commit()
    except BaseException:
        for f in files.values():
            f.discard()
        raise
    return {name: str(f.path) for name, f in files.items()}


def _tick(progress: Progress | None, stage: str, total: int, done: int) -> None:
    report(progress, stage, done, total)


def _drop_table(path: Path) -> None:
    for p in (path, path.with_name(path.name + ".json")):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


def _run_layers(loaded: LoadedModel, ds: Dataset, source, spec: InferSpec, fanouts: Sequence[int],
                transfer: Transfer, out: Path, names: list[str], progress: Progress | None
                ) -> tuple[list[JsonObject], dict[str, str]]:
    """Every layer over every vertex, each hidden layer's output a table in a scratch directory (removed)."""
    from training.writer import sweep_leftovers

    n, num_layers = ds.num_nodes, loaded.num_layers
    root = Path(spec.work_dir) if spec.work_dir else out
    sweep_leftovers(root / "layers")  # the scratch tables of a killed run
    work = root / f".layers.tmp-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    in_bytes = [4 * int(source.dim), *(4 * d for d in loaded.model.out_dims[:-1])]  # float32 rows gathered
    budgets = [spec.chunk_rows or max(1, spec.chunk_bytes // (2 * b)) for b in in_bytes]
    plan = _lookups(ds, fanouts, budgets, spec.seed)
    indptr = np.asarray(ds.indptr) if loaded.spec.arch == "gcn" else None
    device = transfer.memory.device
    loaded.model.to(device)
    store, records, outputs = source, [], {}
    table: Path | None = None
    try:
        for layer in range(num_layers):
            ranges, make = plan[layer]
            t0, stage = time.perf_counter(), f"layer {layer + 1}/{num_layers}"
            report(progress, stage, 0, n)
            chunks = _chunks(loaded, layer, store, ranges, make, indptr=indptr,
                             normalize=layer == 0 and loaded.spec.normalize_features,
                             keep_input=layer == num_layers - 1 and "embeddings.npy" in names, device=device,
                             tick=partial(_tick, progress, stage, n))
            if layer < num_layers - 1:
                nxt = work / f"layer{layer + 1}.bin"
                write_table(nxt, n, loaded.model.out_dims[layer], ((a, b, h) for a, b, h, _ in chunks))
            else:
                outputs = _write_results(chunks, out, names, n, loaded)
            records.append({"layer": layer, "fanout": int(fanouts[layer]), "chunks": len(ranges),
                            "read_from": "the placement" if layer == 0 and spec.placement else
                            "features.npy (memory map)" if layer == 0 else f"layer {layer - 1}'s table (SSD bin)",
                            "out_dim": loaded.model.out_dims[layer], "seconds": time.perf_counter() - t0,
                            "tiers": _tiers(store)})
            if store is not source:
                store.close()
            if table is not None:
                _drop_table(table)
            if layer < num_layers - 1:
                table = nxt
                store = open_table(table, n, spec.backend, transfer)
    finally:
        if store is not source:
            store.close()
        shutil.rmtree(work, ignore_errors=True)
    return records, outputs


def infer(spec: InferSpec, *, progress: Progress | None = None) -> InferResult:
    """Apply the checkpoint's model to every vertex of the dataset, layer by layer (see the module doc).

    ``progress`` hears ``("layer l/L", vertices done, vertices)`` per chunk. Writes :data:`OUTPUTS` into
    ``spec.out``: ``logits.npy`` (float32 ``[V, classes]``), ``predictions.npy`` (int64 ``[V]``),
    ``embeddings.npy`` (float32 ``[V, hidden]``, with ``embeddings``) and ``infer.json`` (this result).

    Raises
    ------
    InferError
        A checkpoint that does not fit the dataset, fan-outs of another layer count, a missing placement,
        results in ``out`` already (without ``overwrite``), embeddings of a one-layer model.
    DatasetError
        Another inference writes into ``out`` now.
    """
    from training.writer import output_lock

    t0 = time.perf_counter()
    ds = open_dataset(spec.dataset, validate=False)
    out = Path(spec.out)
    names = _check_out(out, spec)
    transfer = Transfer(memory_for(spec.device or "cpu"))
    source = _open_input(ds, spec, transfer)
    try:
        loaded = load_model(spec.checkpoint, int(source.dim), ds.num_classes, str(ds.path))
        fanouts = spec.fanouts or (-1,) * loaded.num_layers
        if len(fanouts) != loaded.num_layers:
            raise InferError(f"`fanouts` {','.join(map(str, fanouts))}: the model has {loaded.num_layers} layers; "
                             "give one fan-out per layer")
        if spec.embeddings and loaded.num_layers < 2:
            raise InferError("`embeddings`: a model of one layer has no hidden layer to write")
        out.mkdir(parents=True, exist_ok=True)
        with output_lock(out / "infer"):
            layers, outputs = _run_layers(loaded, ds, source, spec, fanouts, transfer, out, names, progress)
            result = InferResult(ds.num_nodes, time.perf_counter() - t0, tuple(layers), outputs,
                                 resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                                 tuple(getattr(source, "notes", ())))
            record = {"dataset": str(ds.path), "checkpoint": str(loaded.path), "model": loaded.spec.arch,
                      "trained_on": loaded.trained_on, "placement": spec.placement, "fanouts": list(fanouts),
                      **result.to_dict()}
            tmp = out / f".infer.json.tmp-{os.getpid()}"
            tmp.write_text(json.dumps(record, indent=1) + "\n")
            os.replace(tmp, out / "infer.json")
    finally:
        source.close()
    return InferResult(result.num_nodes, result.seconds, result.layers,
                       {**result.outputs, "infer.json": str(out / "infer.json")}, result.peak_rss_bytes, result.notes)
