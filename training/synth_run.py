"""Running ``moment data synth`` at any size: phases, checkpoints, resume after ``kill -9``, progress.

:func:`synthesize` (re-exported by :mod:`training.synth`) writes the dataset
:mod:`training.synth` describes, in phases, into a fixed work directory
``.<name>.partial`` beside the destination:

=====================  ===============================================  ============================
phase                  what                                             checkpointed after
=====================  ===============================================  ============================
model                  labels, relabelling, popularity (O(nodes))       (recomputed on resume)
generating edges       edges made once, spilled to id-range buckets     every chunk
sorting buckets        buckets sorted into the CSR                      every bucket
writing features       feature rows, ``pwrite`` in row blocks           every block
labels, splits         small; rewritten on resume                       the phase
degree statistics      in/out degree skew read back from the CSR        the phase
checksums, commit      CRC-32 of every file, ``meta.json``, rename      (redone on resume)
=====================  ===============================================  ============================

The checkpoint is ``progress.json`` in the work directory, replaced
atomically after the work it records is written; a re-run with the same spec
reads it and continues. Every random draw is keyed by the seed and a fixed
block number, so the resumed files are byte-identical to an uninterrupted
run's. A re-run with a different spec refuses (``--force`` starts over).

Memory (what stays resident, ``N`` nodes): the model, about 22 bytes a node
(int32 relabelling, int16 labels, int32 class order, float64 class weights,
int32 guide table; 8 more for Chung–Lu's weights) and about 30 more while it
is built; one chunk of edges (about 60 bytes per chunk edge); one bucket while
sorting (about 40 bytes per bucket edge, 2**24 edges per bucket); about 24
bytes a node for the degree statistics (after the model is freed). Nothing
holds the edges, the CSR or the features: the files are written with
``pwrite``, whose pages are the kernel's page cache, not this process's memory.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import numpy as np
from numpy.typing import DTypeLike

from momentbase.space import write_all
from planner.progress import Progress, report
from training.bucketcsr import (
    BUCKET_EDGES,
    NPY_HEADER_BYTES,
    BucketPlan,
    BuildState,
    SpillState,
    build,
    npy_header,
    plan_buckets,
    spill,
)
from training.data import DatasetError, count_ids, index_dtype
from training.writer import DatasetWriter, output_lock

#: test hook: ``"<phase>:<count>"`` makes the process SIGKILL itself right after checkpoint
#: ``count`` of ``phase`` (how the resume test stops a run at a chunk boundary)
KILL_ENV = "MOMENT_SYNTH_KILL_AT"


def _npy_write_slice(path: Path, arr: np.ndarray, at: int) -> None:
    """``pwrite`` ``arr`` at element ``at`` of a 1-D ``.npy`` this module made (header of fixed size)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        write_all(fd, np.ascontiguousarray(arr).data, path, NPY_HEADER_BYTES + at * arr.itemsize)
    finally:
        os.close(fd)


def _npy_read_slice(path: Path, dtype: DTypeLike, start: int, stop: int) -> np.ndarray:
    """Elements ``start:stop`` of a 1-D ``.npy`` read into memory (no mapping: its pages are not kept)."""
    return np.fromfile(
        path, dtype=dtype, count=stop - start, offset=NPY_HEADER_BYTES + start * np.dtype(dtype).itemsize
    )


class Checkpoint:
    """``progress.json`` in the work directory: the spec it belongs to and each phase's state."""

    def __init__(self, work: Path, source: dict) -> None:
        self.path = work / "progress.json"
        self.source = source
        self.state: dict = {}
        if self.path.exists():
            saved = json.loads(self.path.read_text())
            if saved.get("source") != source:
                raise DatasetError(
                    f"{work}: holds an unfinished run of a different spec; pass `overwrite=True` to start over, "
                    "or re-run with the spec it was started with")
            self.state = saved.get("state", {})

    def get(self, key: str, default=None):
        return self.state.get(key, default)

    def save(self, key: str, value, count: int | None = None) -> None:
        self.state[key] = value
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"source": self.source, "state": self.state}))
        os.replace(tmp, self.path)  # atomic: a kill leaves the old checkpoint or the new one
        hook = os.environ.get(KILL_ENV)
        if hook and count is not None and hook == f"{key}:{count}":
            os.kill(os.getpid(), signal.SIGKILL)


def work_dir_of(path: Path) -> Path:
    """Where an unfinished ``synthesize(path, ...)`` keeps its files and checkpoint."""
    return path.parent / f".{path.name}.partial"


def _edges(spec, model, work: Path, ck: Checkpoint, chunk_edges: int, bucket_edges: int,
           progress: Progress | None) -> tuple[int, int]:
    """Phases "generating edges" and "sorting buckets": the CSR in the work directory; (stored edges, largest
    bucket)."""
    from training.synth import EDGE_BLOCK, iter_edge_chunks

    n = spec.num_nodes
    generated = spec.num_edges * (2 if spec.undirected else 1)
    if ck.get("num_buckets") is None:  # a resumed run keeps the buckets it spilled to
        ck.save("num_buckets", plan_buckets(n, generated, bucket_edges).num_buckets)
    plan = BucketPlan(n, int(ck.get("num_buckets")))
    total_blocks = -(-spec.num_edges // EDGE_BLOCK)
    per_chunk = max(1, -(-chunk_edges // EDGE_BLOCK))
    spilled = SpillState.from_json(ck.get("spill")) if ck.get("spill") else SpillState.empty(plan)
    built = BuildState.from_json(ck.get("build")) if ck.get("build") else BuildState()
    if built.buckets_done == 0 and spilled.blocks_done < total_blocks:
        def chunks():
            for src, dst in iter_edge_chunks(spec, model, chunk_edges=chunk_edges, first_block=spilled.blocks_done):
                keep = src != dst  # self-loops are dropped before they cost disk
                src, dst = src[keep], dst[keep]
                if spec.undirected:
                    src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
                yield src, dst

        spill(work, plan, chunks(), spilled, blocks_per_chunk=per_chunk, total_blocks=total_blocks,
              checkpoint=lambda s: ck.save("spill", s.to_json(), s.blocks_done), progress=progress)
    # called even when every bucket is in: it writes the headers last, which a kill may have missed
    built = build(work, plan, work / "indptr.npy", work / "indices.npy", index_dtype(n), built,
                  checkpoint=lambda s: ck.save("build", s.to_json(), s.buckets_done), progress=progress)
    return built.edges, built.largest_bucket


def _features(spec, model, w: DatasetWriter, ck: Checkpoint, feature_chunk_bytes: int,
              progress: Progress | None) -> None:
    """Phase "writing features": row blocks ``pwrite`` into ``features.npy``, checkpointed per block."""
    from training.synth import feature_rows

    n = spec.num_nodes
    row_bytes = spec.feature_dim * np.dtype(spec.feature_dtype).itemsize
    rows = max(1, feature_chunk_bytes // max(1, row_bytes))
    start = int(ck.get("feature_rows", 0))
    w.open_features(spec.feature_dim, spec.feature_dtype, reuse=start > 0)
    for lo in range(start, n, rows):
        hi = min(n, lo + rows)
        w.write_feature_rows(lo, feature_rows(spec, model, lo, hi))
        ck.save("feature_rows", hi, hi)
        report(progress, "writing features", hi, n)


def _node_files(spec, model, w: DatasetWriter, chunk: int) -> None:
    """Labels (int64 on disk, from the model's narrow copy, a chunk at a time) and the splits."""
    from training.synth import split_indices

    n = spec.num_nodes
    path = w.tmp_dir / "labels.npy"
    with open(path, "wb") as f:
        f.write(npy_header(np.int64, (n,)))
    for a in range(0, n, chunk):
        _npy_write_slice(path, model.labels[a:a + chunk].astype(np.int64), a)
    w.record_file("labels", np.int64, [n])
    w.num_classes = spec.num_classes
    w.write_splits(**split_indices(spec))


def _top_share(counts: np.ndarray) -> float:
    """Share of ``counts.sum()`` held by the largest 1% of entries (at least one)."""
    total = int(counts.sum())
    k = max(1, counts.size // 100)
    if total == 0:
        return 0.0
    return float(np.partition(counts, counts.size - k)[counts.size - k:].sum() / total)


def degree_stats(work: Path, n: int, num_edges: int, idt: np.dtype, chunk: int, progress: Progress | None) -> dict:
    """The stored graph's degree skew, read back from the CSR files in ``work`` in chunks.

    The out-degree is counted by :func:`training.data.count_ids` (linear in the edges,
    where a bincount per small chunk would be a pass over all nodes per chunk).
    """
    step = max(chunk, n // 4, 1)
    in_degree = np.empty(n, dtype=np.int64)
    for a in range(0, n, step):
        b = min(n, a + step)
        in_degree[a:b] = np.diff(_npy_read_slice(work / "indptr.npy", np.int64, a, b + 1))
    stats = {"max_in_degree": int(in_degree.max()) if n else 0, "top1pct_in_share": round(_top_share(in_degree), 6)}
    isolated = in_degree == 0
    del in_degree
    out_degree = count_ids(lambda a, b: _npy_read_slice(work / "indices.npy", idt, a, b), num_edges, n,
                           chunk=chunk, progress=progress, stage="degree statistics")
    isolated &= out_degree == 0
    return {"max_in_degree": stats["max_in_degree"], "max_out_degree": int(out_degree.max()) if n else 0,
            "top1pct_in_share": stats["top1pct_in_share"], "top1pct_out_share": round(_top_share(out_degree), 6),
            "isolated_nodes": int(isolated.sum())}  # meta.json's order


def synthesize(path, spec, *, chunk_edges: int = 1 << 22, feature_chunk_bytes: int = 64 << 20,
               overwrite: bool = False, name: str | None = None, progress: Progress | None = None,
               bucket_edges: int = BUCKET_EDGES):
    """Generate ``spec`` and write it as a dataset directory at ``path``; resumable after a kill.

    The phases, their checkpoints and the memory bound are this module's (its
    docstring): the edges are generated once, spilled to id-range bucket files and
    sorted bucket by bucket into the CSR; features are written in row blocks of about
    ``feature_chunk_bytes``. Memory grows with ``num_nodes`` (the model, about 22 bytes
    a node), ``chunk_edges`` and ``bucket_edges`` (the CSR build's sort unit,
    :mod:`training.bucketcsr`), never with ``num_edges``; the chunk sizes never change
    the files. A run stopped at any point and re-run with the same spec continues
    where it stopped and ends with the same bytes. ``overwrite`` replaces an existing
    dataset and discards an unfinished run of another spec. ``progress(stage, done,
    total)`` is called as every phase advances.

    Raises
    ------
    SynthError
        ``chunk_edges`` is below 1.
    DatasetError
        The output directory exists and may not be replaced.

    Examples
    --------
    >>> import tempfile
    >>> from training.data import open_dataset
    >>> from training.synth import SynthSpec
    >>> d = tempfile.mkdtemp()
    >>> r = synthesize(f"{d}/g", SynthSpec(num_nodes=500, num_edges=3000, feature_dim=4, seed=7))
    >>> ds = open_dataset(f"{d}/g")
    >>> (ds.num_nodes, ds.num_edges == r.num_edges, ds.features.shape, ds.meta["source"]["seed"])
    (500, True, (500, 4), 7)
    """
    from training.synth import SynthError

    spec.validate()
    if chunk_edges < 1:
        raise SynthError(f"chunk_edges {chunk_edges}: expected 1 or more")
    path = Path(path)
    if not path.parent.is_dir():
        raise DatasetError(f"{path.parent}: no such directory to write the dataset into")
    with output_lock(path):  # before the work directory is read, resumed or removed: one synth at a time
        return _synthesize(path, spec, chunk_edges, feature_chunk_bytes, overwrite, name, progress, bucket_edges)


def _synthesize(path: Path, spec, chunk_edges: int, feature_chunk_bytes: int, overwrite: bool, name: str | None,
                progress: Progress | None, bucket_edges: int):
    from training.synth import SynthReport, build_model, source_block

    n, source = spec.num_nodes, source_block(spec)
    work = work_dir_of(path)
    if path.exists() and not overwrite:
        raise DatasetError(f"{path}: already exists; remove it or pass `overwrite=True` to replace it")
    try:
        ck = Checkpoint(work, source) if work.is_dir() else None
    except DatasetError:
        if not overwrite:
            raise
        ck = None
    if ck is None:
        shutil.rmtree(work, ignore_errors=True)
    writer = DatasetWriter(path, num_nodes=n, name=name, source=source, overwrite=overwrite,
                           chunk_edges=chunk_edges, progress=progress, work_dir=work, lock=False)
    with writer as w:
        ck = ck or Checkpoint(work, source)
        report(progress, "building the model", 0, 1)
        model = build_model(spec)
        report(progress, "building the model", 1, 1)
        model_bytes = model.nbytes
        num_edges, largest = _edges(spec, model, work, ck, chunk_edges, bucket_edges, progress)
        idt = index_dtype(n)
        w.record_csr(num_edges, idt, directed=not spec.undirected)
        if spec.feature_dim > 0:
            _features(spec, model, w, ck, feature_chunk_bytes, progress)
        _node_files(spec, model, w, max(chunk_edges, 1 << 20))
        del model
        stats = ck.get("stats")
        if stats is None:
            stats = degree_stats(work, n, num_edges, idt, chunk_edges, progress)
            ck.save("stats", stats)
        stats = {"generated_edges": spec.num_edges * (2 if spec.undirected else 1), **stats}
        w.set_meta(source={**source, "stored": {**stats, "index_dtype": str(idt),
                                                "dropped_self_loops_and_duplicates":
                                                    stats["generated_edges"] - num_edges}})
    # the commit renamed the work directory, checkpoint and all, into place
    (path / "progress.json").unlink(missing_ok=True)
    return SynthReport(path=str(path), num_nodes=n, num_edges=num_edges, model_bytes=model_bytes,
                       largest_bucket_edges=largest, **stats)


__all__ = ["KILL_ENV", "degree_stats", "synthesize", "work_dir_of"]
