"""An in-memory heterogeneous graph (what generators and importers hand to :func:`training.hetero.store.write_hetero`).

Local ids per type; ``edges[(src, rel, dst)]`` is an int64 ``[2, E]`` array, row 0 the ``src``
local ids, row 1 the ``dst`` local ids (PyG's ``edge_index_dict``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from training.data import DatasetError
from training.hetero.schema import EdgeType


@dataclass(frozen=True)
class HeteroGraph:
    """Node counts per type (in id-range order), typed edges, per-type features, labels of one type.

    ``features[t]`` is ``[num_nodes[t], F_t]`` of any dataset feature dtype, widths free per type;
    ``labels`` is int64 ``[num_nodes[target]]`` (``-1`` unlabelled); ``splits`` maps
    ``train_idx``/``valid_idx``/``test_idx`` to local ids of ``target``.
    """

    num_nodes: Mapping[str, int]
    edges: Mapping[EdgeType, np.ndarray]
    features: Mapping[str, np.ndarray] = field(default_factory=dict)
    target: str | None = None
    labels: np.ndarray | None = None
    num_classes: int = 0
    splits: Mapping[str, np.ndarray] = field(default_factory=dict)

    def check(self) -> None:
        """Raise :class:`DatasetError` on shapes or ids that do not fit the counts.

        Raises
        ------
        DatasetError
            An edge array is not ``[2, E]`` or has an id outside its type's count, a feature table
            has the wrong row count, labels or splits come without a target type or do not fit it.
        """
        for key, e in self.edges.items():
            src, _, dst = key
            for end in (src, dst):
                if end not in self.num_nodes:
                    raise DatasetError(f"relation {key}: node type {end!r} has no count in num_nodes")
            e = np.asarray(e)
            if e.ndim != 2 or e.shape[0] != 2:
                raise DatasetError(f"relation {key}: edges must be [2, E], have shape {list(e.shape)}")
            for row, end in ((0, src), (1, dst)):
                if e.shape[1] and (int(e[row].min()) < 0 or int(e[row].max()) >= self.num_nodes[end]):
                    raise DatasetError(f"relation {key}: a {end} id is outside [0, {self.num_nodes[end]})")
        for t, x in self.features.items():
            if t not in self.num_nodes or x.ndim != 2 or x.shape[0] != self.num_nodes[t]:
                raise DatasetError(f"features of {t!r}: shape {list(x.shape)} does not fit "
                                   f"{self.num_nodes.get(t)} nodes (expected [count, F])")
        if (self.labels is not None or self.splits) and self.target not in self.num_nodes:
            raise DatasetError(f"labels and splits need a target node type; {self.target!r} is not one")
        if self.labels is not None and self.target is not None and len(self.labels) != self.num_nodes[self.target]:
            raise DatasetError(f"labels: {len(self.labels)} of them for {self.num_nodes[self.target]} "
                               f"{self.target} nodes")
        for name, ids in self.splits.items():
            ids = np.asarray(ids)
            if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self.num_nodes[str(self.target)]):
                raise DatasetError(f"{name}: a {self.target} id is outside [0, {self.num_nodes[str(self.target)]})")


def add_reverse(graph: HeteroGraph, prefix: str = "rev_") -> HeteroGraph:
    """``graph`` with every relation ``(s, r, d)`` between different types also as ``(d, prefix + r, s)``.

    PyG's ``ToUndirected`` does the same for a ``HeteroData`` (it names the reverse ``rev_<r>``):
    without it a paper never hears from its authors' side in a graph stored as author -> paper
    only. A relation within one type (``paper cites paper``) is left as it is, as ToUndirected
    would make it symmetric instead; pass such a relation both ways if the model wants that.
    """
    edges: dict[EdgeType, np.ndarray] = dict(graph.edges)
    for (s, r, d), e in graph.edges.items():
        if s != d:
            edges[(d, prefix + r, s)] = np.asarray(e)[::-1].copy()
    return HeteroGraph(graph.num_nodes, edges, graph.features, graph.target, graph.labels, graph.num_classes,
                       graph.splits)


__all__ = ["HeteroGraph", "add_reverse"]
