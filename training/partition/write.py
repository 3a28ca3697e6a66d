"""Writing a partitioned dataset: relabel the vertices by partition, then every partition's slice, streamed.

The format is :mod:`training.partition`'s. :func:`write_partition` takes
``part_of`` (from any partitioner) and writes ``OUT`` in a temporary sibling
``.<name>.tmp-<pid>-*``, renamed into place when every file is complete, under
the writer's lock of :mod:`training.writer` (one writer of ``OUT`` at a time; a
killed writer's leftovers are swept by the next). An ``OUT`` that exists and
is not empty is replaced only with ``overwrite=True``.

Memory: O(N) integers plus one block. The relabelling keeps ``old_ids`` and
``new_of_old`` (int64, 16 bytes a vertex), ``part_of`` (2 bytes) and a halo
mark (1 byte) in memory, and the seed ids; the CSR's indices, the features and
the new indices pass through in blocks of at most ``chunk_edges`` entries, each
with about 50 bytes an entry of temporaries (positions, ids, rows, the packed
sort keys): about ``19 N + 50 chunk_edges`` bytes of anonymous memory
besides the memory maps' page cache, whatever the edge count (200 MB of
blocks at the default 4 M entries). Measured by ``tools/bench_partition.py``
(``docs/design-notes.md``, "Partitioning the graph"): 414 MiB above opening the
dataset at 10^8 entries over 10^7 vertices, growing 25.5 bytes a vertex from
3·10^7 on (the sort's scratch on top of the arrays above); about 2.7 GiB at
10^9 entries over 10^8 vertices by that line.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from iostack.placement import save_json
from momentbase.jsontypes import JsonObject
from momentbase.space import reserve
from planner.progress import Progress
from training.data import DEFAULT_CHUNK_EDGES, SPLITS, Dataset, fingerprint
from training.partition import PartitionError

FORMAT = "moment.partition"
PART_FORMAT = "moment.partition-part"
VERSION = 1
MANIFEST = "partition.json"


def part_dir(out: str | os.PathLike[str], k: int) -> Path:
    """``OUT/part-<k>``."""
    return Path(out) / f"part-{k}"


def digest_of(obj: object) -> str:
    """A short SHA-1 of ``obj``'s JSON (sorted keys): what a partition records of its source."""
    return hashlib.sha1(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:20]


@dataclass(frozen=True)
class Relabel:
    """The new numbering: ``old_ids`` (new → old, int64 [N]), ``new_of_old`` (its inverse), ``node_offsets``."""

    old_ids: np.ndarray
    new_of_old: np.ndarray
    node_offsets: np.ndarray

    @classmethod
    def of(cls, part_of: np.ndarray, parts: int) -> Relabel:
        """Partition ``k``'s vertices get the new ids ``node_offsets[k] ..``, in increasing old id."""
        counts = np.bincount(part_of, minlength=parts)
        offsets = np.zeros(parts + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        # stable: increasing old id inside a part
        old_ids = np.argsort(part_of, kind="stable").astype(np.int64, copy=False)
        new_of_old = np.empty_like(old_ids)
        step = 1 << 22  # by blocks: a whole arange would be 8 more bytes a vertex at the peak
        for a in range(0, old_ids.size, step):
            new_of_old[old_ids[a:a + step]] = np.arange(a, min(a + step, old_ids.size), dtype=np.int64)
        return cls(old_ids, new_of_old, offsets)


def check_part_of(ds: Dataset, part_of: np.ndarray, parts: int) -> np.ndarray:
    """``part_of`` as int16 ``[N]`` with every value in ``[0, parts)``.

    Raises
    ------
    PartitionError
        Another length, or a vertex outside the partitions.
    """
    p = np.asarray(part_of)
    if p.shape != (ds.num_nodes,):
        raise PartitionError(f"`part_of` has shape {p.shape}, the dataset {ds.path} has {ds.num_nodes:,} vertices")
    if p.size and (int(p.min()) < 0 or int(p.max()) >= parts):
        raise PartitionError(f"`part_of` holds partitions outside 0..{parts - 1}")
    return p.astype(np.int16, copy=False)


def _new_indptr(ds: Dataset, rel: Relabel, path: Path, chunk: int) -> np.ndarray:
    """The relabelled row pointers, written to ``path``; returned read from it (a memmap)."""
    n = ds.num_nodes
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.int64, shape=(n + 1,))
    out[0] = 0
    run = 0
    for a in range(0, n, chunk):
        olds = rel.old_ids[a:a + chunk]
        deg = np.asarray(ds.indptr[olds + 1]) - np.asarray(ds.indptr[olds])
        cum = np.cumsum(deg) + run
        out[a + 1:a + 1 + olds.size] = cum
        run = int(cum[-1]) if cum.size else run
    out.flush()
    del out
    return np.load(path, mmap_mode="r")


def _row_blocks(indptr: np.ndarray, lo: int, hi: int, chunk: int):
    """``(a, b)`` new-id blocks of ``[lo, hi)`` holding about ``chunk`` CSR entries each (at least one row)."""
    a = lo
    while a < hi:
        b = int(np.searchsorted(indptr, int(indptr[a]) + chunk, side="right")) - 1
        b = min(max(b, a + 1), hi, a + chunk)  # rows bounded too (empty rows)
        yield a, b
        a = b


def _write_indices(ds: Dataset, rel: Relabel, indptr: np.ndarray, k: int, path: Path, halo_mark: np.ndarray,
                   chunk: int) -> int:
    """Partition ``k``'s slice of the relabelled indices (rows sorted by new id) to ``path``; its remote entries.

    ``halo_mark`` (bool ``[N]``, all False on entry) is left True at its halo vertices.
    """
    n = ds.num_nodes
    lo, hi = int(rel.node_offsets[k]), int(rel.node_offsets[k + 1])
    e0, e1 = int(indptr[lo]), int(indptr[hi])
    out = np.lib.format.open_memmap(path, mode="w+", dtype=ds.indices.dtype, shape=(e1 - e0,))
    reserve(path)  # before the first store: a full disk is a one-line error, not SIGBUS
    remote = 0
    for a, b in _row_blocks(indptr, lo, hi, chunk):
        olds = rel.old_ids[a:b]
        starts = np.asarray(ds.indptr[olds])
        lens = np.asarray(indptr[a + 1:b + 1]) - np.asarray(indptr[a:b])
        total = int(lens.sum())
        if total == 0:
            continue
        # positions of the old rows, gathered in one fancy index (increasing: old ids increase in a part)
        first = np.cumsum(lens) - lens
        pos = np.repeat(starts - first, lens) + np.arange(total, dtype=np.int64)
        cols = rel.new_of_old[np.asarray(ds.indices[pos])]
        rows = np.repeat(np.arange(b - a, dtype=np.int64), lens)
        if n < 2**31:  # one packed int64 key sorts every row by new id (rows < chunk: no overflow)
            key = rows * n + cols
            key.sort()
            cols = key % n
        else:
            cols = cols[np.lexsort((cols, rows))]
        out[int(indptr[a]) - e0:int(indptr[b]) - e0] = cols
        far = cols[(cols < lo) | (cols >= hi)]
        remote += int(far.size)
        halo_mark[far] = True
    out.flush()
    del out
    return remote


def _write_rows(src: np.ndarray, olds: np.ndarray, path: Path, chunk_rows: int) -> None:
    """``src[olds]`` to ``path`` (a ``.npy`` of ``src``'s dtype), block by block."""
    out = np.lib.format.open_memmap(path, mode="w+", dtype=src.dtype, shape=(olds.size, *src.shape[1:]))
    reserve(path)
    for a in range(0, olds.size, chunk_rows):
        out[a:a + chunk_rows] = src[olds[a:a + chunk_rows]]
    out.flush()
    del out


def _write_part(ds: Dataset, rel: Relabel, indptr: np.ndarray, k: int, root: Path, halo_mark: np.ndarray,
                splits: dict[str, np.ndarray], chunk: int) -> JsonObject:
    """Everything of partition ``k`` under ``root/part-k``; its ``meta.json`` record (also returned)."""
    d = part_dir(root, k)
    d.mkdir()
    lo, hi = int(rel.node_offsets[k]), int(rel.node_offsets[k + 1])
    olds = rel.old_ids[lo:hi]
    files: JsonObject = {}

    def note(name: str) -> None:
        arr = np.load(d / f"{name}.npy", mmap_mode="r")
        files[name] = {"dtype": str(arr.dtype), "shape": [int(s) for s in arr.shape]}

    remote = _write_indices(ds, rel, indptr, k, d / "indices.npy", halo_mark, chunk)
    note("indices")
    if ds.features is not None:
        _write_rows(ds.features, olds, d / "features.npy", max(1, chunk // max(1, ds.feature_dim)))
        note("features")
    if ds.labels is not None:
        _write_rows(ds.labels, olds, d / "labels.npy", chunk)
        note("labels")
    seeds: JsonObject = {}
    for s, new in splits.items():
        mine = new[np.searchsorted(new, lo):np.searchsorted(new, hi)]
        np.save(d / f"{s}.npy", mine)
        note(s)
        seeds[s[:-len("_idx")]] = int(mine.size)
    halo = np.flatnonzero(halo_mark).astype(np.int64)
    halo_mark[halo] = False
    np.save(d / "halo.npy", halo)
    note("halo")
    rec: JsonObject = {"format": PART_FORMAT, "version": VERSION, "part": k, "nodes": hi - lo,
                       "node_range": [lo, hi], "edge_range": [int(indptr[lo]), int(indptr[hi])],
                       "edges": int(indptr[hi]) - int(indptr[lo]), "remote_edges": remote, "halo": int(halo.size),
                       "seeds": seeds, "files": files}
    save_json(d / "meta.json", rec)
    return rec


def _place(tmp: Path, out: Path, overwrite: bool) -> None:
    """Rename ``tmp`` to ``out``; an existing ``out`` (allowed by the caller) goes only once ``tmp`` is in place."""
    old = None
    if out.exists():
        if not overwrite and any(out.iterdir()):
            raise PartitionError(f"{out}: exists and is not empty; pass `overwrite=True` to replace it")
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_partition(ds: Dataset, part_of: np.ndarray, parts: int, out: str | os.PathLike[str], *, method: str,
                    overwrite: bool = False, chunk_edges: int = DEFAULT_CHUNK_EDGES,
                    progress: Progress | None = None) -> JsonObject:
    """Relabel ``ds`` by ``part_of`` (``[N]``, values in ``[0, parts)``) and write ``out``; its ``partition.json``.

    Raises
    ------
    PartitionError
        ``part_of`` malformed, ``out`` not empty without ``overwrite``, its parent missing.
    DatasetError
        Another writer holds ``out`` (from :func:`training.writer.output_lock`).
    """
    from training.writer import output_lock, sweep_leftovers

    po = check_part_of(ds, part_of, parts)
    out = Path(out)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not overwrite)):
        raise PartitionError(f"{out}: exists and is not empty; pass `overwrite=True` to replace it")
    if not out.parent.is_dir():
        raise PartitionError(f"{out.parent}: no such directory to write the partitions into")
    with output_lock(out):
        sweep_leftovers(out)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{os.getpid()}-", dir=out.parent))
        try:
            man = _write_all(ds, po, parts, tmp, method, chunk_edges, progress)
            _place(tmp, out, overwrite)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return man


def _write_all(ds: Dataset, po: np.ndarray, parts: int, root: Path, method: str, chunk: int,
               progress: Progress | None) -> JsonObject:
    """Every file of the format into ``root``; the manifest, written last."""
    rel = Relabel.of(po, parts)
    np.save(root / "old_ids.npy", rel.old_ids)
    np.save(root / "part_of.npy", po)
    indptr = _new_indptr(ds, rel, root / "indptr.npy", chunk)
    splits = {s: np.sort(rel.new_of_old[np.asarray(getattr(ds, s))]) for s in SPLITS if getattr(ds, s) is not None}
    halo_mark = np.zeros(ds.num_nodes, bool)
    records = []
    for k in range(parts):
        if progress is not None:
            progress("writing partitions", k, parts)
        records.append(_write_part(ds, rel, indptr, k, root, halo_mark, splits, chunk))
    fp = fingerprint(ds)
    man: JsonObject = {
        "format": FORMAT, "version": VERSION, "parts": parts, "method": method, "name": ds.name,
        "num_nodes": ds.num_nodes, "num_edges": ds.num_edges, "directed": ds.directed,
        "index_dtype": str(ds.indices.dtype), "feature_dim": ds.feature_dim, "feature_dtype": ds.feature_dtype,
        "num_classes": ds.num_classes,
        "node_offsets": [int(x) for x in rel.node_offsets],
        "edge_offsets": [int(indptr[x]) for x in rel.node_offsets],
        "edge_cut": sum(int(r["remote_edges"]) for r in records),
        "parts_detail": [{key: r[key] for key in ("part", "nodes", "edges", "remote_edges", "halo", "seeds")}
                         for r in records],
        "digest": hashlib.sha1(np.ascontiguousarray(po).tobytes()).hexdigest()[:20],
        "source": {"path": str(Path(ds.path).resolve()), "fingerprint": fp, "digest": digest_of(fp)},
    }
    save_json(root / MANIFEST, man)
    if progress is not None:
        progress("writing partitions", parts, parts)
    return man


__all__ = ["FORMAT", "MANIFEST", "PART_FORMAT", "VERSION", "Relabel", "check_part_of", "part_dir",
           "write_partition"]
