"""A PyTorch Geometric ``FeatureStore`` over Moment's tiered stores.

Each ``(group_name, attr_name)`` (e.g. ``(None, "x")`` or ``("paper", "x")``)
maps to a :class:`~iostack.store.FeatureStore` (read-only: served by gathers
from its GPU, host and SSD tiers) or to a plain tensor put with ``put_tensor``
(labels, say). ``index`` in a :class:`~torch_geometric.data.TensorAttr`
selects vertex ids; ``None`` means all. With a graph store over the same
vertices (:class:`training.pyg.MomentGraphStore`) PyG's loaders take the pair as
a remote backend: ``NeighborLoader((feature_store, graph_store), ...)`` gathers
every batch's rows through :meth:`~iostack.store.FeatureStore.gather` (PyG's
``filter_custom_store`` asks for all of a batch's attributes in one
``multi_get_tensor``). This module imports ``torch_geometric``: import it only
where PyG is wanted.

>>> import numpy as np, torch
>>> from iostack.placement import simple_placement
>>> from iostack.store import FeatureStore
>>> feats = np.arange(8, dtype=np.float32).reshape(4, 2)
>>> fs = PygFeatureStore({(None, "x"): FeatureStore(simple_placement(4, [("cpu", 4)]), features=feats)})
>>> fs.get_tensor(group_name=None, attr_name="x", index=torch.tensor([3, 1]))[:, 0].tolist()
[6.0, 2.0]
"""

from __future__ import annotations

from typing import Any

import torch
from torch_geometric.data import FeatureStore as _PygFeatureStore
from torch_geometric.data import TensorAttr

from iostack.store import FeatureStore


class PygFeatureStore(_PygFeatureStore):
    """``torch_geometric.data.FeatureStore`` whose tensors are tiered stores (or plain tensors)."""

    def __init__(self, stores: dict[tuple[Any, str], FeatureStore | torch.Tensor] | None = None) -> None:
        super().__init__()
        self._entries: dict[tuple[Any, str], FeatureStore | torch.Tensor] = dict(stores or {})

    @staticmethod
    def _key(attr: TensorAttr) -> tuple[Any, str]:
        return (attr.group_name, attr.attr_name)

    def _put_tensor(self, tensor: torch.Tensor, attr: TensorAttr) -> bool:
        key = self._key(attr)
        cur = self._entries.get(key)
        if isinstance(cur, FeatureStore):
            return False  # tiered stores are written by write_bins, not row by row
        index = attr.index
        if index is None or cur is None:
            if index is not None and not isinstance(index, slice):
                return False  # rows of a tensor that does not exist yet
            self._entries[key] = tensor
            return True
        cur[index] = tensor
        return True

    def _get_tensor(self, attr: TensorAttr) -> torch.Tensor | None:
        entry = self._entries.get(self._key(attr))
        if entry is None:
            raise KeyError(f"no tensor {attr.attr_name!r} in group {attr.group_name!r}")
        index = attr.index
        if isinstance(entry, FeatureStore):
            n = entry.num_vertices
            if index is None:
                ids = torch.arange(n)
            elif isinstance(index, slice):
                ids = torch.arange(n)[index]
            elif isinstance(index, int):
                ids = torch.tensor([index])
            else:
                ids = torch.as_tensor(index, dtype=torch.int64)
            return entry.gather(ids.cpu())
        return entry if index is None else entry[index]

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        return self._entries.pop(self._key(attr), None) is not None

    def _get_tensor_size(self, attr: TensorAttr) -> tuple[int, ...] | None:
        entry = self._entries.get(self._key(attr))
        if entry is None:
            return None
        if isinstance(entry, FeatureStore):
            return (entry.num_vertices, entry.dim)
        return tuple(entry.shape)

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        return [TensorAttr(group_name=g, attr_name=a) for g, a in self._entries]

    def close(self) -> None:
        """Close the tiered stores it holds (it owns them once handed in)."""
        for entry in self._entries.values():
            if isinstance(entry, FeatureStore):
                entry.close()
