"""Writing and opening a heterogeneous dataset: :func:`write_hetero`, :func:`open_hetero`.

The directory is an ordinary dataset (``training.data``) whose CSR is the union of every
relation in global ids (so the homogeneous sampler, hotness and DDAK work over all rows), plus:

- ``edge_type.npy``: int16 ``[num_edges]``, the relation (its index in the schema) of every
  entry of ``indices`` (R-GCN's ``edge_type`` over the homogeneous view);
- per relation ``rel_<src>__<rel>__<dst>_indptr.npy`` (int64 ``[count(dst) + 1]``) and
  ``..._indices.npy`` (``src`` local ids), rows sorted, repeats dropped;
- per featured type ``feat_<type>.npy`` ``[count, F_type]`` (page-aligned like ``features.npy``);
- ``labels.npy`` over global ids, ``-1`` outside the target type; splits as global ids.

All listed in ``files`` and under the checksums; ``meta.json`` gains ``"hetero"``
(:class:`training.hetero.schema.HeteroSchema`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from momentbase.jsontypes import JsonValue
from momentbase.space import write_all
from training.data import Dataset, DatasetError, _check_range, index_dtype, open_dataset, open_paged_npy
from training.hetero.graph import HeteroGraph
from training.hetero.schema import EdgeType, HeteroSchema, NodeType, Relation, check_name
from training.writer import DatasetWriter


def relation_csr(edges: np.ndarray, num_src: int, num_dst: int, *,
                 same_type: bool) -> tuple[np.ndarray, np.ndarray]:
    """CSR by ``dst`` of ``[2, E]`` local-id edges: rows sorted, repeats dropped (self-loops too when ``same_type``)."""
    src, dst = np.asarray(edges[0], dtype=np.int64), np.asarray(edges[1], dtype=np.int64)
    if same_type:
        keep = src != dst
        src, dst = src[keep], dst[keep]
    # np.unique over one int64 key per pair: sorts by dst then src and drops repeats in one call
    pair = np.unique(dst * max(num_src, 1) + src)
    dst, src = pair // max(num_src, 1), pair % max(num_src, 1)
    indptr = np.zeros(num_dst + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=num_dst), out=indptr[1:])
    return indptr, src.astype(index_dtype(num_src))


@dataclass(frozen=True)
class FeatureBlocks:
    """A feature table given as row blocks (in row order) of ``dim`` columns of ``dtype``, afresh per call."""

    dim: int
    dtype: str
    blocks: Callable[[], Iterable[np.ndarray]]


def schema_for(num_nodes: Mapping[str, int], widths: Mapping[str, tuple[int, str]], target: str | None,
               counts: Mapping[EdgeType, int], where: str) -> HeteroSchema:
    """The schema of types ``num_nodes`` (in id-range order) with features ``widths[t] = (dim, dtype)`` and
    relations of ``counts`` edges (in that order), checked.

    Raises
    ------
    DatasetError
        A name is not a valid type or relation name, or the schema is inconsistent
        (:meth:`HeteroSchema.check`).
    """
    types, at = [], 0
    for t, c in num_nodes.items():
        dim, dtype = widths.get(t, (0, None))
        types.append(NodeType(check_name(t, "node type", where), at, int(c), int(dim), dtype))
        at += int(c)
    rels = tuple(Relation(s, check_name(r, "relation", where), d, int(k)) for (s, r, d), k in counts.items())
    schema = HeteroSchema(tuple(types), rels, target)
    schema.check(where)
    return schema


def array_blocks(x: np.ndarray, rows: int = 1 << 16) -> Iterator[np.ndarray]:
    """The rows of ``x`` (a memory map, say) in blocks of ``rows``, each read into memory."""
    return (np.asarray(x[a:a + rows]) for a in range(0, x.shape[0], rows))


def _feature_blocks(x: np.ndarray | FeatureBlocks) -> Iterable[np.ndarray]:
    return x.blocks() if isinstance(x, FeatureBlocks) else array_blocks(x)


def _write_features(w: DatasetWriter, t: NodeType, x: np.ndarray | FeatureBlocks) -> None:
    """``feat_<type>.npy`` from ``x``'s row blocks, with ``pwrite`` (the written pages never count in RSS)."""
    fpath = w.tmp_dir / f"{t.feature_file}.npy"
    out = open_paged_npy(fpath, np.dtype(t.feature_dtype), (t.count, t.feature_dim))
    at, row_bytes = out.offset, t.feature_dim * out.dtype.itemsize
    del out
    row, fd = 0, os.open(fpath, os.O_WRONLY)
    try:
        for block in _feature_blocks(x):
            block = np.ascontiguousarray(block, dtype=t.feature_dtype)
            if block.ndim != 2 or block.shape[1] != t.feature_dim or row + block.shape[0] > t.count:
                raise DatasetError(f"features of {t.name!r}: a block of shape {list(block.shape)} at row {row} "
                                   f"does not fit [{t.count}, {t.feature_dim}]")
            write_all(fd, block.reshape(-1).data.cast("B"), fpath, at + row * row_bytes)
            row += block.shape[0]
    finally:
        os.close(fd)
    if row != t.count:
        raise DatasetError(f"features of {t.name!r}: {row} rows for {t.count} nodes")
    w.record_file(t.feature_file, str(t.feature_dtype), (t.count, t.feature_dim))


def write_node_data(w: DatasetWriter, schema: HeteroSchema, features: Mapping[str, np.ndarray | FeatureBlocks],
                    labels: np.ndarray | None, num_classes: int, splits: Mapping[str, np.ndarray]) -> None:
    """Write the per-type feature tables (in row blocks), the global labels and the splits (global ids).

    Raises
    ------
    DatasetError
        A feature table's blocks do not add up to its type's count or have another width, the
        labels or splits come without a target type, do not fit it, or name an id outside it.
    """
    for t in schema.node_types:
        if t.feature_dim:
            _write_features(w, t, features[t.name])
    if (labels is not None or splits) and schema.target is None:
        raise DatasetError("labels and splits need a target node type; none is given")
    tgt = schema.node_type(str(schema.target)) if schema.target is not None else None
    if labels is not None and tgt is not None:
        if len(labels) != tgt.count:
            raise DatasetError(f"labels: {len(labels)} of them for {tgt.count} {tgt.name} nodes")
        full = np.full(schema.num_nodes, -1, dtype=np.int64)
        full[tgt.offset:tgt.offset + tgt.count] = labels
        w.write_labels(full, num_classes=num_classes or None)
    if splits and tgt is not None:
        for k, ids in splits.items():
            ids = np.asarray(ids)
            if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= tgt.count):
                raise DatasetError(f"{k}: a {tgt.name} id is outside [0, {tgt.count})")
        w.write_splits(**{k.removesuffix("_idx"): np.asarray(v, np.int64) + tgt.offset for k, v in splits.items()})


def write_hetero(path: str | os.PathLike, graph: HeteroGraph, *, name: str | None = None,
                 source: dict[str, JsonValue] | None = None, overwrite: bool = False) -> Path:
    """Write ``graph`` as a heterogeneous dataset directory at ``path`` (atomically); returns the path.

    Memory: the edges of all relations at once; :func:`training.hetero.stream.write_hetero_stream` writes
    the same directory with bounded memory.

    Raises
    ------
    DatasetError
        ``graph`` does not fit its own counts (:meth:`HeteroGraph.check`), a name is not a valid
        type or relation name, or ``path`` exists without ``overwrite``.
    """
    graph.check()
    csrs = {}
    for (s, r, d), e in graph.edges.items():
        csrs[(s, r, d)] = relation_csr(e, graph.num_nodes[s], graph.num_nodes[d], same_type=s == d)
    widths = {t: (int(x.shape[1]), np.dtype(x.dtype).name) for t, x in graph.features.items()}
    schema = schema_for(graph.num_nodes, widths, graph.target, {k: int(ip[-1]) for k, (ip, _) in csrs.items()},
                        "write_hetero")
    off = {t.name: t.offset for t in schema.node_types}
    n = schema.num_nodes
    # the union CSR in global ids: every relation's (dst, src, type), sorted by dst, then src, then type
    dst = np.concatenate([np.repeat(np.arange(len(ip) - 1) + off[k[2]], np.diff(ip)) for k, (ip, _) in csrs.items()]
                         or [np.zeros(0, np.int64)])
    src = np.concatenate([ix.astype(np.int64) + off[k[0]] for k, (_, ix) in csrs.items()] or [np.zeros(0, np.int64)])
    etype = np.concatenate([np.full(len(ix), i, np.int16) for i, (_, ix) in enumerate(csrs.values())]
                           or [np.zeros(0, np.int16)])
    order = np.lexsort((etype, src, dst))
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    with DatasetWriter(path, num_nodes=n, name=name, source=source, overwrite=overwrite) as w:
        w.write_csr(indptr, src[order], directed=True)
        _save(w, "edge_type", etype[order])
        for rel in schema.relations:
            ip, ix = csrs[rel.key]
            _save(w, f"{rel.file_prefix}_indptr", ip)
            _save(w, f"{rel.file_prefix}_indices", ix)
        write_node_data(w, schema, graph.features, graph.labels, graph.num_classes, graph.splits)
        w.set_meta(hetero=schema.to_json())
    return Path(path)


def _save(w: DatasetWriter, key: str, arr: np.ndarray) -> None:
    np.save(w.tmp_dir / f"{key}.npy", arr, allow_pickle=False)
    w.record_file(key, arr.dtype, arr.shape)


@dataclass(frozen=True)
class HeteroDataset:
    """An opened heterogeneous dataset: the homogeneous :class:`Dataset` plus its typed views (memory maps)."""

    base: Dataset
    schema: HeteroSchema
    edge_type: np.ndarray
    rel_indptr: dict[EdgeType, np.ndarray]
    rel_indices: dict[EdgeType, np.ndarray]
    features: dict[str, np.ndarray]

    def labels_of(self, node_type: str) -> np.ndarray | None:
        """The labels of ``node_type``'s nodes by local id (a view), or None without labels."""
        if self.base.labels is None:
            return None
        t = self.schema.node_type(node_type)
        return self.base.labels[t.offset:t.offset + t.count]

    def split(self, name: str) -> np.ndarray | None:
        """``train_idx``/``valid_idx``/``test_idx`` as local ids of the target type (None when absent)."""
        ids = getattr(self.base, name)
        if ids is None:
            return None
        return np.asarray(ids) - self.schema.node_type(str(self.schema.target)).offset


def _load_file(ds: Dataset, key: str, dtype: str | None, shape: list[int]) -> np.ndarray:
    decl = ds.meta["files"].get(key) if isinstance(ds.meta["files"], dict) else None
    fpath = ds.path / f"{key}.npy"
    if decl is None:
        raise DatasetError(f"{ds.path / 'meta.json'}: files.{key} is missing; re-import the dataset")
    try:
        arr = np.load(fpath, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{fpath}: missing or not a readable .npy ({exc}); re-import the dataset") from None
    if (dtype is not None and str(arr.dtype) != dtype) or list(arr.shape) != shape or str(arr.dtype) != decl["dtype"]:
        raise DatasetError(f"{fpath}: {arr.dtype} {list(arr.shape)}, expected {dtype or decl['dtype']} {shape}; "
                           "the file is truncated or stale, re-import the dataset")
    return arr


def open_hetero(path: str | os.PathLike, *, validate: bool = True, verify: str = "sample") -> HeteroDataset:
    """Open a heterogeneous dataset directory and check its typed files against ``meta["hetero"]``.

    Raises
    ------
    DatasetError
        The directory is not a dataset or not a heterogeneous one, a typed file is missing or of
        the wrong dtype or shape, the relations' edge counts do not add up to ``num_edges``, a
        relation's CSR is out of order or range, or a label or split node lies outside the target type.
    """
    ds = open_dataset(path, validate=validate, verify=verify)
    where = str(ds.path / "meta.json")
    if "hetero" not in ds.meta:
        raise DatasetError(f"{ds.path}: not a heterogeneous dataset (meta.json has no 'hetero'); "
                           "write it with `training.hetero.store.write_hetero` or import a heterogeneous layout")
    schema = HeteroSchema.from_json(ds.meta["hetero"], where)
    if schema.num_nodes != ds.num_nodes or schema.num_edges != ds.num_edges:
        raise DatasetError(f"{where}: the node types hold {schema.num_nodes} nodes and the relations "
                           f"{schema.num_edges} edges; the dataset has {ds.num_nodes} and {ds.num_edges}")
    edge_type = _load_file(ds, "edge_type", "int16", [ds.num_edges])
    ips, ixs = {}, {}
    for rel in schema.relations:
        dst = schema.node_type(rel.dst)
        ips[rel.key] = _load_file(ds, f"{rel.file_prefix}_indptr", "int64", [dst.count + 1])
        ixs[rel.key] = _load_file(ds, f"{rel.file_prefix}_indices", None, [rel.num_edges])
    feats = {t.name: _load_file(ds, t.feature_file, t.feature_dtype, [t.count, t.feature_dim])
             for t in schema.node_types if t.feature_dim}
    out = HeteroDataset(ds, schema, edge_type, ips, ixs, feats)
    if validate:
        _validate(out)
    return out


def _validate(hd: HeteroDataset) -> None:
    ds, schema = hd.base, hd.schema
    _check_range(hd.edge_type, 0, len(schema.relations), str(ds.path / "edge_type.npy"), "relation index",
                 1 << 22)
    for rel in schema.relations:
        ip, where = hd.rel_indptr[rel.key], ds.path / f"{rel.file_prefix}_indptr.npy"
        if int(ip[0]) != 0 or int(ip[-1]) != rel.num_edges or bool((np.diff(ip) < 0).any()):
            raise DatasetError(f"{where}: must run from 0 to {rel.num_edges} without decreasing; "
                               "re-import the dataset")
        _check_range(hd.rel_indices[rel.key], 0, schema.node_type(rel.src).count,
                     str(ds.path / f"{rel.file_prefix}_indices.npy"), f"{rel.src} id", 1 << 22)
    tgt = schema.node_type(str(schema.target)) if schema.target else None
    for name in ("train_idx", "valid_idx", "test_idx"):
        ids = getattr(ds, name)
        if ids is not None and len(ids):
            lo, hi = (tgt.offset, tgt.offset + tgt.count) if tgt is not None else (0, 0)
            _check_range(ids, lo, hi, str(ds.path / f"{name}.npy"), f"node id (of the target type {schema.target!r})",
                         1 << 22)
    if ds.labels is not None:
        lab = np.asarray(ds.labels)
        outside = np.ones(len(lab), bool)
        if tgt is not None:
            outside[tgt.offset:tgt.offset + tgt.count] = False
        if (lab[outside] != -1).any():
            v = int(np.flatnonzero(outside & (lab != -1))[0])
            raise DatasetError(f"{ds.path / 'labels.npy'}: node {v} is labelled but not of the target type "
                               f"{schema.target!r}; re-import the dataset")


__all__ = ["FeatureBlocks", "HeteroDataset", "array_blocks", "open_hetero", "relation_csr", "schema_for",
           "write_hetero", "write_node_data"]
