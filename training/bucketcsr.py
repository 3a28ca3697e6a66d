"""A CSR from a stream of edges larger than memory, by bucketing: one pass over the edges, resumable.

:mod:`training.csr` builds a CSR in three passes over the edges (count, place,
sort), so the edges are produced twice and placed by random writes into a
memory-mapped file as large as the graph. For a generator whose edges cost far
more to make than to store (``moment data synth`` at 10**9 edges) this module
makes them once:

1. **Spill.** Every edge ``src -> dst`` becomes one int64 key ``dst * n + src``
   appended to the bucket file of ``dst``'s id range (``num_buckets`` equal
   ranges, sized so that a bucket holds about :data:`BUCKET_EDGES` edges). A
   chunk's keys are grouped by a stable radix argsort on the bucket number.
2. **Build.** Bucket by bucket, in id order: read the keys, sort, drop
   repeats, append the sources to ``indices.npy`` and the row ends to
   ``indptr.npy`` (both written with ``pwrite``, never mapped, so their pages
   do not count in this process's memory), delete the bucket file.

Rows come out sorted and de-duplicated, exactly as :func:`training.csr.sort_rows`
leaves them, so the files are the same as the three-pass builder's.

Resume: :class:`SpillState` and :class:`BuildState` are small JSON-able records
the caller checkpoints after every chunk / bucket (bucket file lengths, edges
written); given them back, :func:`spill` truncates each bucket file to its
recorded length and :func:`build` starts at the next bucket, so a run killed at
any point ends with the same bytes as one never stopped.

Memory: the spill holds one chunk (about 40 bytes per chunk edge); the build
one bucket (about 40 bytes per bucket edge: the keys, their sorted copy, the
split-out sources and targets). Neither depends on the number of edges; the
bucket size is about ``num_edges / num_buckets`` plus the largest in-degree,
and :func:`plan_buckets` picks ``num_buckets`` so that it is about
:data:`BUCKET_EDGES`.

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> plan = plan_buckets(3, 4)
>>> st = spill(d, plan, [(np.array([0, 2, 2, 1]), np.array([1, 1, 1, 0]))], SpillState.empty(plan))
>>> total = build(d, plan, d / "indptr.npy", d / "indices.npy", np.int32, BuildState())
>>> total.edges, np.load(d / "indptr.npy").tolist(), np.load(d / "indices.npy").tolist()
(3, [0, 1, 3, 3], [1, 0, 2])
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from numpy.typing import DTypeLike

from momentbase.space import reserve, write_all
from planner.progress import Progress, report

#: edges per bucket the plan aims at: 2**24 keys are 128 MiB on disk and about 0.7 GB sorted
BUCKET_EDGES = 1 << 24
#: the ``.npy`` header this module writes (numpy pads 1-D headers to 64-byte multiples; any
#: shape of up to 19 digits fits in 128 bytes), so data offsets are known before the length is
NPY_HEADER_BYTES = 128


@dataclass(frozen=True)
class BucketPlan:
    """``num_buckets`` equal ranges of target ids over ``num_nodes``: bucket ``b`` holds
    the targets ``ceil(b * n / B) .. ceil((b + 1) * n / B) - 1``."""

    num_nodes: int
    num_buckets: int

    def bucket_of(self, dst: np.ndarray) -> np.ndarray:
        """The bucket number of every target id (int64 arithmetic: ``dst * B`` fits for n < 2**31)."""
        return (dst.astype(np.int64, copy=False) * self.num_buckets) // self.num_nodes

    def first_node(self, b: int) -> int:
        return -(-b * self.num_nodes // self.num_buckets)

    def path(self, root: Path, b: int) -> Path:
        return Path(root) / f"bucket-{b:05d}.keys"


def plan_buckets(num_nodes: int, expected_edges: int, bucket_edges: int = BUCKET_EDGES) -> BucketPlan:
    """A plan whose buckets hold about ``bucket_edges`` edges each (at most one per node).

    >>> plan_buckets(10**8, 1.6e9).num_buckets
    96
    """
    buckets = max(1, -(-int(expected_edges) // int(bucket_edges)))
    return BucketPlan(int(num_nodes), min(buckets, max(1, int(num_nodes))))


@dataclass(frozen=True)
class SpillState:
    """Where the spill stands: ``blocks_done`` units of the input consumed (the caller's unit:
    chunks, or generator blocks), ``bucket_bytes[b]`` the length of bucket file ``b`` after them."""

    blocks_done: int
    bucket_bytes: tuple[int, ...]

    @classmethod
    def empty(cls, plan: BucketPlan) -> SpillState:
        return cls(0, (0,) * plan.num_buckets)

    def to_json(self) -> dict:
        return {"blocks_done": self.blocks_done, "bucket_bytes": list(self.bucket_bytes)}

    @classmethod
    def from_json(cls, d: dict) -> SpillState:
        return cls(int(d["blocks_done"]), tuple(int(x) for x in d["bucket_bytes"]))


def spill(root: Path, plan: BucketPlan, chunks: Iterable[tuple[np.ndarray, np.ndarray]], state: SpillState, *,
          blocks_per_chunk: int = 1, checkpoint: Callable[[SpillState], None] | None = None,
          progress: Progress | None = None, total_blocks: int | None = None) -> SpillState:
    """Append the keys of every ``(src, dst)`` chunk (ids already checked, self-loops already dropped) to the
    bucket files under ``root``, resuming from ``state``; return the final state.

    ``chunks`` must yield the chunks *after* ``state.blocks_done`` (the caller skips the
    rest); each advances ``blocks_done`` by ``blocks_per_chunk`` (the last may be short:
    the count is capped at ``total_blocks``). ``checkpoint(state)`` is called after each
    chunk is on disk (in the page cache: a killed process loses nothing written, a power
    cut may). Bucket files longer than ``state`` says (a chunk cut short) are truncated first.

    Raises
    ------
    FileNotFoundError
        A bucket file the checkpoint records is missing.
    """
    root = Path(root)
    n = plan.num_nodes
    for b, length in enumerate(state.bucket_bytes):
        p = plan.path(root, b)
        if p.exists() and p.stat().st_size != length:
            os.truncate(p, length)
        elif not p.exists() and length:
            raise FileNotFoundError(f"{p}: missing, but the checkpoint records {length} bytes in it")
    sizes = list(state.bucket_bytes)
    done = state.blocks_done
    key_dtype = np.uint16 if plan.num_buckets < 2**16 else np.int64
    fds = [os.open(plan.path(root, b), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
           for b in range(plan.num_buckets)]
    try:
        for src, dst in chunks:
            dst = dst.astype(np.int64, copy=False)
            keys = dst * n + src.astype(np.int64, copy=False)
            bucket = plan.bucket_of(dst).astype(key_dtype)
            # stable radix sort on the (narrow) bucket number: linear, and keeps the
            # generator's order inside a bucket (not needed for the result, which is
            # sorted later, but it makes the bucket files themselves reproducible)
            order = np.argsort(bucket, kind="stable")
            keys = keys[order]
            ends = np.cumsum(np.bincount(bucket, minlength=plan.num_buckets))
            del order, bucket
            start = 0
            for b, end in enumerate(ends.tolist()):
                if end > start:
                    sizes[b] += write_all(fds[b], keys[start:end].data, plan.path(root, b))
                start = end
            done += blocks_per_chunk
            if total_blocks is not None:
                done = min(done, total_blocks)
            state = SpillState(done, tuple(sizes))
            if checkpoint is not None:
                checkpoint(state)
            report(progress, "generating edges", done, total_blocks)
    finally:
        for fd in fds:
            os.close(fd)
    return state


@dataclass(frozen=True)
class BuildState:
    """Where the build stands: buckets ``0 .. buckets_done - 1`` are in the CSR, ``edges`` entries of it;
    ``largest_bucket`` the most keys one bucket held so far (what sets the build's memory)."""

    buckets_done: int = 0
    edges: int = 0
    largest_bucket: int = 0

    def to_json(self) -> dict:
        return {"buckets_done": self.buckets_done, "edges": self.edges, "largest_bucket": self.largest_bucket}

    @classmethod
    def from_json(cls, d: dict) -> BuildState:
        return cls(int(d["buckets_done"]), int(d["edges"]), int(d.get("largest_bucket", 0)))


def npy_header(dtype: DTypeLike, shape: tuple[int, ...]) -> bytes:
    """The version 1.0 ``.npy`` header of a C-ordered array, exactly :data:`NPY_HEADER_BYTES` long.

    Raises
    ------
    ValueError
        The header would not be :data:`NPY_HEADER_BYTES` long (a shape numpy cannot pad to it).
    """
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                                "fortran_order": False, "shape": tuple(shape)})
    head = buf.getvalue()
    if len(head) != NPY_HEADER_BYTES:  # numpy pads to 64 bytes; a shape this long cannot happen
        raise ValueError(f".npy header of shape {shape} is {len(head)} bytes, not {NPY_HEADER_BYTES}")
    return head


def _pwrite_all(fd: int, arr: np.ndarray, at: int, path: Path) -> None:
    write_all(fd, np.ascontiguousarray(arr).data, path, at)


def build(root: Path, plan: BucketPlan, indptr_path: Path, indices_path: Path, idt: np.dtype, state: BuildState, *,
          checkpoint: Callable[[BuildState], None] | None = None, progress: Progress | None = None) -> BuildState:
    """Sort the bucket files under ``root`` into ``indptr_path`` (int64 ``[n + 1]``) and ``indices_path``
    (``idt``), resuming at ``state``; return the final state (``edges`` = the CSR's entries).

    Each bucket's file is deleted once ``checkpoint`` has recorded it. Memory: one bucket.
    """
    n, root = plan.num_nodes, Path(root)
    idt = np.dtype(idt)
    flags = os.O_WRONLY | os.O_CREAT
    ip_fd, ix_fd = os.open(indptr_path, flags, 0o644), os.open(indices_path, flags, 0o644)
    try:
        if state.buckets_done == 0:
            os.ftruncate(ip_fd, NPY_HEADER_BYTES + (n + 1) * 8)
            reserve(indptr_path, fd=ip_fd)  # its length is known: room first, named in one line
            _pwrite_all(ip_fd, np.zeros(1, np.int64), NPY_HEADER_BYTES, indptr_path)  # indptr[0] = 0
        for b in range(state.buckets_done):  # done but not yet deleted when the run stopped
            plan.path(root, b).unlink(missing_ok=True)
        for b in range(state.buckets_done, plan.num_buckets):
            lo, hi = plan.first_node(b), plan.first_node(b + 1)
            p = plan.path(root, b)
            keys = np.fromfile(p, dtype=np.int64) if p.exists() else np.zeros(0, np.int64)
            largest = max(state.largest_bucket, int(keys.size))
            keys.sort()
            if keys.size:
                fresh = np.empty(keys.size, dtype=bool)
                fresh[0] = True
                np.not_equal(keys[1:], keys[:-1], out=fresh[1:])
                keys = keys[fresh]
                del fresh
            rows = keys // n - lo
            counts = np.bincount(rows, minlength=hi - lo)
            del rows
            _pwrite_all(ix_fd, (keys % n).astype(idt), NPY_HEADER_BYTES + state.edges * idt.itemsize, indices_path)
            ends = state.edges + np.cumsum(counts)
            _pwrite_all(ip_fd, ends, NPY_HEADER_BYTES + (lo + 1) * 8, indptr_path)
            state = replace(state, buckets_done=b + 1, edges=int(state.edges + keys.size), largest_bucket=largest)
            del keys, ends, counts
            if checkpoint is not None:
                checkpoint(state)
            p.unlink(missing_ok=True)
            report(progress, "sorting buckets into the CSR", b + 1, plan.num_buckets)
        # the lengths are known only now: headers last, and the indices cut to their length
        os.pwrite(ip_fd, npy_header(np.int64, (n + 1,)), 0)
        os.pwrite(ix_fd, npy_header(idt, (state.edges,)), 0)
        os.ftruncate(ix_fd, NPY_HEADER_BYTES + state.edges * idt.itemsize)
    finally:
        os.close(ip_fd)
        os.close(ix_fd)
    return state


__all__ = ["BUCKET_EDGES", "BucketPlan", "BuildState", "SpillState", "build", "npy_header", "plan_buckets", "spill"]
