"""A PyTorch Geometric ``FeatureStore`` over Moment's tiered stores.

Each ``(group_name, attr_name)`` (e.g. ``(None, "x")`` or ``("paper", "x")``)
maps to a :class:`~iostack.store.FeatureStore` (read-only: served by gathers) or
to a plain tensor put with ``put_tensor``. ``index`` in a
:class:`~torch_geometric.data.TensorAttr` selects vertex ids; ``None`` means all.

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
                ids = torch.as_tensor(index)
            return entry.gather(ids)
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
