"""PyTorch Geometric's remote-backend interfaces over a Moment dataset and its placement.

:func:`open_pyg_stores` gives a ``(feature_store, graph_store)`` pair that
PyG's loaders take in place of a ``Data`` object: features (``x``) gathered
from the placement's tiered store (:class:`iostack.pyg.PygFeatureStore`),
labels (``y``), and the graph (:class:`MomentGraphStore`) as the dataset's CSR,
which is PyG's CSC over incoming edges: vertex ``v``'s neighbour list
``indices[indptr[v]:indptr[v + 1]]`` holds the sources ``u`` of the edges
``u → v`` that ``v`` aggregates from, so ``colptr = indptr``, ``row = indices``,
already sorted by destination and handed to the sampler without a conversion.

PyG's own :class:`~torch_geometric.sampler.NeighborSampler` samples through
``pyg-lib`` or ``torch-sparse``; where neither is installed,
:class:`MomentPygSampler` samples the same CSC with Moment's sampler
(:class:`training.sampler.NeighborSampler`, the same output layout) and is
handed to ``NeighborLoader(..., neighbor_sampler=...)``.

This module imports ``torch_geometric``: import it only where PyG is wanted.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import EdgeAttr, GraphStore
from torch_geometric.sampler import NeighborSampler as _PygNeighborSampler
from torch_geometric.sampler import SamplerOutput
from torch_geometric.sampler.base import NumNeighbors

from iostack.pyg import PygFeatureStore
from iostack.store import FeatureStore
from training.data import open_dataset
from training.errors import TrainError
from training.features import open_features
from training.sampler import NeighborSampler

__all__ = ["MomentGraphStore", "MomentPygSampler", "open_pyg_stores"]


class MomentGraphStore(GraphStore):
    """A read-only ``torch_geometric.data.GraphStore`` of one homogeneous graph in CSC (see the module doc).

    Parameters
    ----------
    indptr : array-like
        int ``[num_nodes + 1]``: vertex ``v``'s incoming edges are positions ``indptr[v]..indptr[v+1]``.
    indices : array-like
        int ``[num_edges]``: the source of each edge.
    """

    def __init__(self, indptr: Tensor | np.ndarray, indices: Tensor | np.ndarray) -> None:
        super().__init__()
        # int64: what PyG's samplers index with (a dataset stores int32 indices when they fit)
        self._colptr = torch.as_tensor(np.asarray(indptr), dtype=torch.int64)
        self._row = torch.as_tensor(np.asarray(indices), dtype=torch.int64)
        n = int(self._colptr.numel()) - 1
        self._attr = EdgeAttr(edge_type=None, layout="csc", is_sorted=True, size=(n, n))

    def _put_edge_index(self, edge_index: Any, edge_attr: EdgeAttr) -> bool:  # Any: PyG's EdgeTensorType
        return False  # the dataset's graph is written by `moment data import`, not through PyG

    def _get_edge_index(self, edge_attr: EdgeAttr) -> tuple[Tensor, Tensor] | None:
        if edge_attr.edge_type is not None or edge_attr.layout != self._attr.layout:
            return None  # GraphStore.csc()/coo()/csr() convert from the stored layout themselves
        return self._row, self._colptr

    def _remove_edge_index(self, edge_attr: EdgeAttr) -> bool:
        return False

    def get_all_edge_attrs(self) -> list[EdgeAttr]:
        return [self._attr]


class MomentPygSampler(_PygNeighborSampler):
    """PyG's ``NeighborSampler`` sampling homogeneous graphs with Moment's sampler (no pyg-lib needed).

    Built like PyG's (``data``: a ``Data`` or a ``(FeatureStore, GraphStore)`` pair; ``num_neighbors``),
    plus ``seed``: every batch is sampled from the stream ``seed`` starts, in order, so two loaders with
    the same seed over the same graph give the same batches. Sampling without replacement, directional.

    Raises
    ------
    TrainError
        A heterogeneous graph (Moment's sampler samples one vertex and edge type).
    """

    # Any: PyG's data argument (Data, HeteroData or a store pair) and its sampler's keyword options
    def __init__(self, data: Any, num_neighbors: list[int], *, seed: int = 0, **kwargs: Any) -> None:
        super().__init__(data, num_neighbors, **kwargs)  # reads the CSC (PyG's to_csc or graph_store.csc())
        if self.is_hetero:
            raise TrainError("`data`: a heterogeneous graph; MomentPygSampler samples homogeneous ones "
                             "(use PyG's own NeighborSampler with pyg-lib)")
        fanouts = NumNeighbors(num_neighbors).get_values()
        self._moment = NeighborSampler(self.colptr, self.row, tuple(int(f) for f in fanouts), seed=seed)

    def _sample(self, seed: Tensor, seed_time: Tensor | None = None, **kwargs: Any) -> SamplerOutput:  # Any: PyG's
        b = self._moment.sample(seed.to(torch.int64))
        return SamplerOutput(node=b.n_id, row=b.edge_index[0], col=b.edge_index[1], edge=None,
                             num_sampled_nodes=list(b.num_sampled_nodes),
                             num_sampled_edges=list(b.num_sampled_edges))


def open_pyg_stores(dataset_dir: str | os.PathLike[str], placement_dir: str | os.PathLike[str] | None = None,
                    backend: str = "auto") -> tuple[PygFeatureStore, MomentGraphStore]:
    """PyG's ``(feature_store, graph_store)`` over a dataset and the placement ``moment place`` wrote for it.

    The feature store holds ``x`` (the placement's tiered store; without ``placement_dir``, the
    dataset's features in memory) and ``y`` (the labels, when the dataset has them); its ``close()``
    closes the tiered store.

    Raises
    ------
    TrainError
        A dataset without features and no placement, or a placement of another dataset.
    """
    ds = open_dataset(dataset_dir, validate=False)
    entries: dict[tuple[str | None, str], FeatureStore | Tensor] = {}
    if placement_dir is None:
        if ds.features is None:
            raise TrainError(f"{ds.path}: the dataset has no features.npy; pass the `placement_dir` of its bins")
        entries[(None, "x")] = torch.from_numpy(np.array(ds.features))
    else:
        store = open_features(ds, str(placement_dir), backend)
        assert isinstance(store, FeatureStore)  # a placement is always served by its store
        entries[(None, "x")] = store
    if ds.labels is not None:
        entries[(None, "y")] = torch.from_numpy(np.asarray(ds.labels, np.int64))
    return PygFeatureStore(entries), MomentGraphStore(ds.indptr, ds.indices)
