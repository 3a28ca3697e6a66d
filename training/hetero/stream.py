"""A heterogeneous dataset written from edge chunks with bounded memory: :func:`write_hetero_stream`.

The same directory, byte for byte, as the in-memory :func:`training.hetero.store.write_hetero`
(tests/test_hetero_stream.py checks it), for graphs whose edges do not fit in memory (MAG240M's
1.7 billion, IGBH-full's 5.8 billion). Each relation's edges arrive as a callable that yields
``(src, dst)`` local-id chunks afresh on each call (it is called twice: a counting pass and a
placing pass); its CSR is built as the homogeneous writer builds one (:mod:`training.csr`:
count the rows, place the edges by a counting sort into a memory-mapped file, sort and
de-duplicate the rows in blocks). The union CSR in global ids and ``edge_type.npy`` are then
merged from the relations' CSRs in blocks of global rows, each block sorted by
``(dst, src, relation)`` and appended to the files.

Memory (anonymous), whatever the edge count: per-node int64 arrays, the union's ``indptr``
(8 bytes a node) and, while one relation is built, its ``dst`` type's counts, row pointers and
placing cursors (:mod:`training.csr`: about 32 bytes a node of that type), the labels of the
target type (8 bytes a node), and the temporaries of one chunk of ``chunk_edges`` edges (about
90 bytes an edge at the sort's peak: ~370 MiB at the default 4 Mi edges). Measured
(tools/bench_hetero_write.py, ogbn-mag-shaped): 388 MiB at 10^7 edges (1.0 M nodes), 686 MiB
at 10^8 (10.2 M nodes), 432 MiB at 10^8 with a 1 Mi-edge chunk: about 35 bytes a node (the
writer's per-node arrays and the generator's own labels, class index and splits) plus about
85 bytes an edge of the chunk. The relations' files are written
through memory maps, whose pages the kernel takes back; the union is appended with ``pwrite``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from momentbase.jsontypes import JsonValue
from momentbase.space import reserve, write_all
from planner.progress import Progress
from training.csr import count_rows, edge_chunks, place_edges, sort_rows
from training.data import DEFAULT_CHUNK_EDGES, DatasetError, index_dtype
from training.hetero.graph import HeteroGraph
from training.hetero.schema import EdgeType, HeteroSchema, check_name
from training.hetero.store import FeatureBlocks, schema_for, write_node_data
from training.writer import DatasetWriter

#: a relation's edges: a callable returning a fresh iterable of ``(src, dst)`` local-id chunks
EdgeChunks = Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]]


@dataclass(frozen=True)
class HeteroSource:
    """What :func:`write_hetero_stream` writes: :class:`~training.hetero.graph.HeteroGraph`'s fields with
    edges as chunk sources and features as arrays (memory maps welcome: copied in row blocks) or
    :class:`FeatureBlocks`."""

    num_nodes: Mapping[str, int]
    edges: Mapping[EdgeType, EdgeChunks]
    features: Mapping[str, np.ndarray | FeatureBlocks] = field(default_factory=dict)
    target: str | None = None
    labels: np.ndarray | None = None
    num_classes: int = 0
    splits: Mapping[str, np.ndarray] = field(default_factory=dict)


def array_chunks(edges: np.ndarray, chunk_edges: int = DEFAULT_CHUNK_EDGES) -> EdgeChunks:
    """The chunk source of a ``[2, E]`` array (or memory map): column blocks of ``chunk_edges``."""
    def gen() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for a in range(0, edges.shape[1], chunk_edges):
            yield np.asarray(edges[0, a:a + chunk_edges]), np.asarray(edges[1, a:a + chunk_edges])
    return gen


def reversed_chunks(chunks: EdgeChunks) -> EdgeChunks:
    """The chunk source of the reverse relation (every edge ``d -> s``)."""
    def gen() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for s, d in chunks():
            yield d, s
    return gen


def add_reverse_chunks(edges: Mapping[EdgeType, EdgeChunks], prefix: str = "rev_") -> dict[EdgeType, EdgeChunks]:
    """``edges`` with every relation between different types also reversed as ``(d, prefix + r, s)``, after
    all the given ones (as :func:`training.hetero.graph.add_reverse` orders them)."""
    out = dict(edges)
    for (s, r, d), fn in edges.items():
        if s != d:
            out[(d, prefix + r, s)] = reversed_chunks(fn)
    return out


def to_graph(source: HeteroSource) -> HeteroGraph:
    """``source`` held whole in memory as a :class:`HeteroGraph` (what the in-memory writer takes)."""
    edges = {}
    for key, fn in source.edges.items():
        parts = [np.stack([np.asarray(s, np.int64), np.asarray(d, np.int64)]) for s, d in fn()]
        edges[key] = np.concatenate(parts, axis=1) if parts else np.zeros((2, 0), np.int64)
    feats = {t: np.concatenate(list(x.blocks())) if isinstance(x, FeatureBlocks) else np.asarray(x)
             for t, x in source.features.items()}
    return HeteroGraph(source.num_nodes, edges, feats, source.target, source.labels, source.num_classes,
                       source.splits)


def _reporter(progress: Progress | None) -> Progress:
    """``progress``, or a callable that reports nowhere."""
    return progress if progress is not None else _silent


def _silent(stage: str, done: int, total: int | None, /) -> None:
    pass


def _relation_csr(w: DatasetWriter, key: EdgeType, chunks: EdgeChunks, num_src: int, num_dst: int,
                  prefix: str) -> int:
    """Build one relation's CSR files in the writer's directory (:mod:`training.csr`'s passes); its edge count."""
    checked = edge_chunks(chunks, num_dst, w.chunk_edges, drop_self_loops=key[0] == key[2], num_src=num_src,
                          where=f"relation {key}: ")
    report = _reporter(w.progress)
    indptr = count_rows(checked, num_dst, report)
    raw = w.tmp_dir / f"{prefix}_indices.unsorted.npy"
    idt = index_dtype(num_src)
    place_edges(checked, indptr, raw, idt, report)
    indptr = sort_rows(raw, indptr, w.tmp_dir / f"{prefix}_indices.npy", w.chunk_edges, report, num_cols=num_src)
    raw.unlink()
    np.save(w.tmp_dir / f"{prefix}_indptr.npy", indptr, allow_pickle=False)
    w.record_file(f"{prefix}_indptr", np.int64, indptr.shape)
    w.record_file(f"{prefix}_indices", idt, [int(indptr[-1])])
    return int(indptr[-1])


class _Appender:
    """A ``.npy`` of a known length filled front to back with ``pwrite`` (written pages never count in RSS)."""

    def __init__(self, path: Path, dtype: np.dtype, length: int) -> None:
        np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=(length,))  # the header np.save writes
        reserve(path)
        with open(path, "rb") as f:
            np.lib.format.read_magic(f)
            np.lib.format.read_array_header_1_0(f)
            self.at = f.tell()
        self.path, self.dtype = path, dtype
        self.fd = os.open(path, os.O_WRONLY)

    def append(self, values: np.ndarray) -> None:
        data = np.ascontiguousarray(values, dtype=self.dtype)
        self.at += write_all(self.fd, data.data.cast("B"), self.path, self.at)

    def close(self) -> None:
        os.close(self.fd)


def _union_block(schema: HeteroSchema, ips: list[np.ndarray], ixs: list[np.ndarray], v: int, hi: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The union CSR's entries of global rows ``[v, hi)``: (global src, relation) sorted by (row, src, relation)."""
    rows, srcs, types = [], [], []
    for i, rel in enumerate(schema.relations):
        dt, st = schema.node_type(rel.dst), schema.node_type(rel.src)
        lo, up = max(v, dt.offset) - dt.offset, min(hi, dt.offset + dt.count) - dt.offset
        if lo >= up:
            continue
        ip = np.asarray(ips[i][lo:up + 1])
        a, b = int(ip[0]), int(ip[-1])
        rows.append(np.repeat(np.arange(lo + dt.offset - v, up + dt.offset - v, dtype=np.int64), np.diff(ip)))
        srcs.append(np.asarray(ixs[i][a:b]).astype(np.int64) + st.offset)
        types.append(np.full(b - a, i, np.int64))
    if not rows:
        return np.zeros(0, np.int64), np.zeros(0, np.int16)
    row, src, et = np.concatenate(rows), np.concatenate(srcs), np.concatenate(types)
    n, r = max(schema.num_nodes, 1), max(len(schema.relations), 1)
    if (hi - v) * n * r < 2**62:  # one packed int64 key, one sort (entries are unique: no ties)
        key = (row * n + src) * r + et
        key.sort()
        return (key // r) % n, (key % r).astype(np.int16)
    order = np.lexsort((et, src, row))
    return src[order], et[order].astype(np.int16)


def _write_union(w: DatasetWriter, schema: HeteroSchema, prefixes: list[str]) -> None:
    """The union CSR (``indptr``/``indices``) and ``edge_type``, merged from the relations' CSRs in row blocks."""
    n, tmp = schema.num_nodes, w.tmp_dir
    ips = [np.load(tmp / f"{p}_indptr.npy", mmap_mode="r") for p in prefixes]
    ixs = [np.load(tmp / f"{p}_indices.npy", mmap_mode="r") for p in prefixes]
    indptr = np.zeros(n + 1, dtype=np.int64)
    for i, rel in enumerate(schema.relations):
        dt = schema.node_type(rel.dst)
        deg: np.ndarray = np.diff(np.asarray(ips[i], dtype=np.int64))
        indptr[dt.offset + 1:dt.offset + dt.count + 1] += deg
    np.cumsum(indptr, out=indptr)
    total = int(indptr[-1])
    np.save(tmp / "indptr.npy", indptr, allow_pickle=False)
    idt = index_dtype(n)
    out_ix = _Appender(tmp / "indices.npy", idt, total)
    out_et = _Appender(tmp / "edge_type.npy", np.dtype(np.int16), total)
    try:
        v = 0
        while v < n:
            hi = min(max(int(np.searchsorted(indptr, indptr[v] + w.chunk_edges, side="right")) - 1, v + 1), n)
            src, et = _union_block(schema, ips, ixs, v, hi)
            out_ix.append(src)
            out_et.append(et)
            _reporter(w.progress)("merging relations", int(indptr[hi]), total)
            v = hi
    finally:
        out_ix.close()
        out_et.close()
    w.record_csr(total, idt, directed=True)
    w.record_file("edge_type", np.int16, [total])


def write_hetero_stream(path: str | os.PathLike, source: HeteroSource, *, name: str | None = None,
                        meta_source: dict[str, JsonValue] | None = None, overwrite: bool = False,
                        chunk_edges: int = DEFAULT_CHUNK_EDGES, progress: Progress | None = None) -> Path:
    """Write ``source`` as a heterogeneous dataset at ``path`` (atomically) with bounded memory; returns the path.

    The directory equals :func:`training.hetero.store.write_hetero`'s for the same graph; the
    memory bound is the module docstring's (``chunk_edges`` sets the chunk).

    Raises
    ------
    DatasetError
        A relation names a type without a count, an edge id lies outside its type's count, a
        feature table or the labels do not fit their type, a name is not a valid type or relation
        name, or ``path`` exists without ``overwrite``.
    """
    for key in source.edges:  # before any file is named after them
        check_name(key[1], "relation", "write_hetero_stream")
        for end in (key[0], key[2]):
            check_name(end, "node type", "write_hetero_stream")
            if end not in source.num_nodes:
                raise DatasetError(f"relation {key}: node type {end!r} has no count in num_nodes")
    widths = {t: ((x.dim, x.dtype) if isinstance(x, FeatureBlocks) else (int(x.shape[1]), np.dtype(x.dtype).name))
              for t, x in source.features.items()}
    n = sum(int(c) for c in source.num_nodes.values())
    with DatasetWriter(path, num_nodes=n, name=name, source=meta_source, overwrite=overwrite,
                       chunk_edges=chunk_edges, progress=progress) as w:
        counts = {}
        for (s, r, d), chunks in source.edges.items():
            counts[(s, r, d)] = _relation_csr(w, (s, r, d), chunks, int(source.num_nodes[s]),
                                              int(source.num_nodes[d]), f"rel_{s}__{r}__{d}")
        schema = schema_for(source.num_nodes, widths, source.target, counts, "write_hetero_stream")
        _write_union(w, schema, [rel.file_prefix for rel in schema.relations])
        # meta.json lists the union first, as write_hetero does: the same directory, meta.json included
        w.files = {k: w.files[k] for k in ("indptr", "indices", "edge_type", *w.files)}
        write_node_data(w, schema, source.features, source.labels, source.num_classes, source.splits)
        w.set_meta(hetero=schema.to_json())
    return Path(path)


__all__ = ["EdgeChunks", "HeteroSource", "add_reverse_chunks", "array_chunks", "reversed_chunks",
           "to_graph", "write_hetero_stream"]
