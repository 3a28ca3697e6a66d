"""The ``hetero`` section of ``meta.json``: node types as id ranges, relations, the target type.

A heterogeneous dataset is an ordinary one whose global node ids ``[0, num_nodes)`` are cut
into one contiguous range per node type, in the order the schema lists them: type ``t`` holds
global ids ``offset_t .. offset_t + count_t - 1`` and its local id ``i`` is global
``offset_t + i``. A relation ``(src, rel, dst)`` is a typed edge set; its CSR is indexed by
``dst``'s local ids and holds ``src``'s local ids (``dst`` aggregates from ``src``, as in the
homogeneous format and PyG's ``edge_index_dict[(src, rel, dst)]``).

>>> s = HeteroSchema((NodeType("paper", 0, 3), NodeType("author", 3, 2)),
...                  (Relation("author", "writes", "paper", 4),), target="paper")
>>> s.num_nodes, s.type_of(np.array([0, 2, 3, 4])).tolist()
(5, [0, 0, 1, 1])
>>> HeteroSchema.from_json(s.to_json(), "meta.json") == s
True
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from momentbase.jsontypes import JsonObject, JsonValue
from training.data import DatasetError
from training.vocab import DATASET_FEATURE_DTYPES

#: node type and relation names become parts of file names: letters, digits and ``_`` only
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")

#: a relation's key, as PyG spells an edge type
EdgeType = tuple[str, str, str]


@dataclass(frozen=True)
class NodeType:
    """One node type: its name, first global id, node count, and feature width and dtype (0 / None: none)."""

    name: str
    offset: int
    count: int
    feature_dim: int = 0
    feature_dtype: str | None = None

    @property
    def feature_file(self) -> str:
        """The key (file name less ``.npy``) of this type's feature table."""
        return f"feat_{self.name}"


@dataclass(frozen=True)
class Relation:
    """One relation ``src --rel--> dst`` and its edge count (``dst`` aggregates from ``src``)."""

    src: str
    rel: str
    dst: str
    num_edges: int

    @property
    def key(self) -> EdgeType:
        return (self.src, self.rel, self.dst)

    @property
    def file_prefix(self) -> str:
        """Its CSR files are ``<prefix>_indptr.npy`` and ``<prefix>_indices.npy``."""
        return f"rel_{self.src}__{self.rel}__{self.dst}"


def check_name(name: object, what: str, where: str) -> str:
    """``name`` when it is a valid node type or relation name; :class:`DatasetError` otherwise.

    Raises
    ------
    DatasetError
        ``name`` is not a string of letters, digits and ``_`` starting with a letter.
    """
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise DatasetError(f"{where}: {what} {name!r} is not a name of letters, digits and '_' starting with a "
                           "letter (it becomes part of a file name); rename it")
    return name


@dataclass(frozen=True)
class HeteroSchema:
    """Node types (contiguous id ranges, in order), relations, and the type that carries labels."""

    node_types: tuple[NodeType, ...]
    relations: tuple[Relation, ...]
    target: str | None = None

    @property
    def num_nodes(self) -> int:
        return sum(t.count for t in self.node_types)

    @property
    def num_edges(self) -> int:
        return sum(r.num_edges for r in self.relations)

    def node_type(self, name: str) -> NodeType:
        """The node type called ``name``; :class:`DatasetError` naming the known ones otherwise.

        Raises
        ------
        DatasetError
            No node type is called ``name``.
        """
        for t in self.node_types:
            if t.name == name:
                return t
        raise DatasetError(f"no node type {name!r}; the dataset has {', '.join(t.name for t in self.node_types)}")

    def relation(self, key: EdgeType) -> Relation:
        """The relation ``(src, rel, dst)``; :class:`DatasetError` naming the known ones otherwise.

        Raises
        ------
        DatasetError
            No relation has that key.
        """
        for r in self.relations:
            if r.key == tuple(key):
                return r
        raise DatasetError(f"no relation {tuple(key)}; the dataset has {', '.join(map(str, self.keys()))}")

    def keys(self) -> list[EdgeType]:
        return [r.key for r in self.relations]

    def offsets(self) -> np.ndarray:
        """int64 [num_types + 1]: type ``i`` holds global ids ``offsets[i] .. offsets[i + 1] - 1``."""
        return np.array([t.offset for t in self.node_types] + [self.num_nodes], dtype=np.int64)

    def type_of(self, global_ids: np.ndarray) -> np.ndarray:
        """The type index (position in :attr:`node_types`) of every global id, int64, same shape."""
        return np.searchsorted(self.offsets(), np.asarray(global_ids), side="right") - 1

    def to_json(self) -> JsonObject:
        return {
            "node_types": [{"name": t.name, "offset": t.offset, "count": t.count, "feature_dim": t.feature_dim,
                            "feature_dtype": t.feature_dtype} for t in self.node_types],
            "relations": [{"src": r.src, "rel": r.rel, "dst": r.dst, "num_edges": r.num_edges}
                          for r in self.relations],
            "target": self.target,
        }

    @classmethod
    def from_json(cls, obj: JsonValue, where: str) -> HeteroSchema:
        """Parse and check the ``hetero`` section (``where`` names it in errors).

        Raises
        ------
        DatasetError
            A field is missing or of the wrong kind, a name is invalid or repeated, the types'
            ranges are not contiguous from 0, a relation names an unknown type, or the target
            is not a node type.
        """
        if not isinstance(obj, dict):
            raise DatasetError(f"{where}: 'hetero' must be an object; re-import the dataset")
        try:
            types = tuple(NodeType(check_name(t["name"], "node type", where), int(t["offset"]), int(t["count"]),
                                   int(t.get("feature_dim", 0)), t.get("feature_dtype"))
                          for t in obj["node_types"])
            rels = tuple(Relation(check_name(r["src"], "node type", where), check_name(r["rel"], "relation", where),
                                  check_name(r["dst"], "node type", where), int(r["num_edges"]))
                         for r in obj["relations"])
        except (KeyError, TypeError, ValueError) as exc:
            raise DatasetError(f"{where}: 'hetero' is malformed ({type(exc).__name__}: {exc}); "
                               "re-import the dataset") from None
        target = obj.get("target")
        schema = cls(types, rels, None if target is None else str(target))
        schema.check(where)
        return schema

    def check(self, where: str) -> None:
        """Raise :class:`DatasetError` unless the schema is consistent (see :meth:`from_json`).

        Raises
        ------
        DatasetError
            As :meth:`from_json` lists.
        """
        names = [t.name for t in self.node_types]
        if not names or len(set(names)) != len(names):
            raise DatasetError(f"{where}: node types {names} must be at least one, each named once")
        at = 0
        for t in self.node_types:
            check_name(t.name, "node type", where)
            if t.offset != at or t.count < 0:
                raise DatasetError(f"{where}: node type {t.name!r} starts at {t.offset} with {t.count} nodes; types "
                                   f"must be contiguous ranges from 0 (expected it to start at {at})")
            if t.feature_dim < 0 or (t.feature_dim > 0) != (t.feature_dtype is not None) or (
                    t.feature_dtype is not None and t.feature_dtype not in DATASET_FEATURE_DTYPES):
                raise DatasetError(f"{where}: node type {t.name!r} has features {t.feature_dim} x "
                                   f"{t.feature_dtype}; the dtype must be one of {DATASET_FEATURE_DTYPES} "
                                   "when the width is above 0, null when it is 0")
            at += t.count
        keys = self.keys()
        if len(set(keys)) != len(keys):
            raise DatasetError(f"{where}: a relation is listed twice in {keys}")
        for r in self.relations:
            check_name(r.rel, "relation", where)
            for end in (r.src, r.dst):
                if end not in names:
                    raise DatasetError(f"{where}: relation {r.key} names node type {end!r}, not one of {names}")
            if r.num_edges < 0:
                raise DatasetError(f"{where}: relation {r.key} has {r.num_edges} edges")
        if self.target is not None and self.target not in names:
            raise DatasetError(f"{where}: target type {self.target!r} is not one of {names}")


__all__ = ["EdgeType", "HeteroSchema", "NodeType", "Relation", "check_name"]
