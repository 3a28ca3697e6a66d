"""Where a run's feature rows come from: the whole matrix in memory, or a placement's feature store.

:func:`open_features` opens what a :class:`~training.specs.IOSpec` names
(a placement directory, else the dataset's own ``features.npy``) on the
training device; both sources satisfy :class:`FeatureSource`: the placement's
:class:`~iostack.store.FeatureStore` itself, or :class:`MemoryFeatures`. A placement made
from another dataset is refused (its manifest records the dataset's
fingerprint, :func:`training.place.run.check_placement_is_for`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from iostack.rowbuffers import RowBuffers
from iostack.transfer import CudaMemory, DeviceMemory, Gathered, HostMemory, Transfer
from training.data import Dataset
from training.errors import TrainError


class FeatureSource(Protocol):
    """Rows of the feature matrix by vertex id, with cumulative per-tier counters.

    ``transfer`` is the :class:`~iostack.transfer.Transfer` its rows (and the
    batch's other tensors) reach the training device through.
    """

    dim: int
    transfer: Transfer

    def gather(self, ids: Tensor) -> Tensor:
        """``[len(ids), dim]`` rows of ``ids`` (int64), in order."""
        ...

    def gather_landing(self, ids: Tensor, *, dtype: torch.dtype | None = None) -> Gathered:
        """The rows on the training device (cast to ``dtype`` there), to wait on where they are used."""
        ...

    def totals(self) -> dict[str, tuple[int, int]]:
        """Rows and bytes served so far, per tier."""
        ...

    def close(self) -> None: ...


class MemoryFeatures:
    """The whole feature matrix in host memory (tier ``"memory"``), indexed directly.

    On an accelerator the rows of a batch are gathered into pinned staging and
    copied up once, cast on the device.
    """

    def __init__(self, features: np.ndarray, transfer: Transfer | None = None) -> None:
        self._x = torch.from_numpy(np.array(features))  # a copy: the memmap's pages read once
        self.transfer = transfer if transfer is not None else Transfer()
        self.dim = int(self._x.shape[1])
        self._row_bytes = self.dim * self._x.element_size()
        self._rows = 0
        self._rows_out = RowBuffers(self.dim, self._x.dtype)

    def gather(self, ids: Tensor) -> Tensor:
        return self.gather_landing(ids).wait()

    def gather_landing(self, ids: Tensor, dtype: torch.dtype | None = None) -> Gathered:
        with self.transfer.batch() as tb:
            ids = tb.to_host(torch.as_tensor(ids)).to(torch.int64)
            self._rows += int(ids.numel())
            if self.transfer.accelerated:
                stage = tb.staging("rows", (ids.numel(), self.dim), self._x.dtype)
                x = tb.to_device(torch.index_select(self._x, 0, ids, out=stage), dtype)
            else:
                x = tb.cast(torch.index_select(self._x, 0, ids, out=self._rows_out.take(ids.numel())), dtype)
        return Gathered(x, tb.landing)

    def totals(self) -> dict[str, tuple[int, int]]:
        return {"memory": (self._rows, self._rows * self._row_bytes)}

    def memory_bytes(self) -> dict[str, int]:
        return {"host": self._x.numel() * self._x.element_size()}

    def close(self) -> None:
        pass


def open_features(ds: Dataset, placement_dir: str | None, backend: str = "auto", *,
                  memory: DeviceMemory | None = None, local_gpu_bins: Sequence[int] | None = None,
                  share_key: str | None = None, capacities: str | None = None) -> FeatureSource:
    """The dataset's features: the placement's :class:`~iostack.store.FeatureStore`, else in memory, served on
    ``memory``'s device.

    ``backend`` ``auto`` is chosen by measurement (``capacities``: a file of
    ``moment profile``); ``local_gpu_bins`` and ``share_key`` go to the store.
    """
    transfer = Transfer(memory if memory is not None else HostMemory())
    if placement_dir is None:
        if ds.features is None:
            raise TrainError(f"{ds.path}: the dataset has no features.npy and no `placement` was given; "
                             "import features or pass a placement with SSD bins")
        return MemoryFeatures(ds.features, transfer)
    from iostack.placement import load_placement

    if not Path(placement_dir).is_dir():
        raise TrainError(f"{placement_dir}: no such placement directory (write one with `moment place`)")
    from training.place.run import check_placement_is_for

    placement = load_placement(placement_dir)
    check_placement_is_for(placement, placement_dir, ds)
    if placement.num_vertices != ds.num_nodes:
        raise TrainError(f"{placement_dir}: the placement holds {placement.num_vertices} vertices but the dataset "
                         f"{ds.path} has {ds.num_nodes}; place this dataset's features")
    store = open_store(placement, placement_dir, ds.features, backend, transfer=transfer,
                       local_gpu_bins=local_gpu_bins, share_key=share_key, capacities=capacities)
    if ds.features is not None and store.dim != ds.feature_dim:
        store.close()
        raise TrainError(f"{placement_dir}: bins hold rows of dim {store.dim}, the dataset's features have "
                         f"{ds.feature_dim}; place this dataset's features")
    return store


def feature_dtype_of(features: Any, ds: Dataset) -> str | None:
    """The type the feature rows are held in: the placement's bins (e.g. ``int8``), else the dataset's."""
    held = getattr(features, "feature_dtype", None) or getattr(getattr(features, "store", None), "feature_dtype", None)
    return held if held is not None else ds.feature_dtype


def open_store(placement: Any, placement_dir: str | os.PathLike[str], features: np.ndarray | None,
               backend: str = "auto", *, transfer: Transfer, local_gpu_bins: Sequence[int] | None = None,
               share_key: str | None = None, capacities: str | None = None) -> Any:
    """A :class:`~iostack.store.FeatureStore` of ``placement`` on ``transfer``'s device, its backend chosen.

    ``backend`` ``auto`` is chosen by measurement (``capacities``: a file of
    ``moment profile``); ``features`` fill the cache tiers.
    """
    from iostack.backends import choose_backend
    from iostack.bins import bin_path
    from iostack.store import FeatureStore

    caps = None
    if capacities is not None and backend == "auto":
        from planner.capacities import load_capacities

        caps = load_capacities(capacities)
    choice = choose_backend(backend, cuda=isinstance(transfer.memory, CudaMemory), capacities=caps,
                            paths=[str(bin_path(placement_dir, b)) for b in placement.bins if b.kind == "ssd"])
    store = FeatureStore(placement, placement_dir, features=features, backend=choice.name,
                         memory=transfer.memory, local_gpu_bins=local_gpu_bins, share_key=share_key,
                         transfer=transfer)
    store.notes.insert(0, f"SSD reads: {choice.name} ({choice.reason})")
    return store


def share_key_of(ds: Dataset, placement_dir: str) -> str:
    """A name for the node-shared host tiers of a placement: changes whenever their contents could.

    The placement's directory and index files (path, size, mtime) and the
    dataset's fingerprint: ranks of one run agree on it, a re-placed or
    re-imported dataset gets another.
    """
    import hashlib

    from training.data import fingerprint

    h = hashlib.sha1(str(Path(placement_dir).resolve()).encode())
    for name in ("placement.json", "bin_of.npy", "row_of.npy"):
        try:
            st = (Path(placement_dir) / name).stat()
            h.update(f"{name}:{st.st_size}:{st.st_mtime_ns}".encode())
        except OSError:
            h.update(name.encode())
    h.update(json.dumps(fingerprint(ds), sort_keys=True).encode())
    return h.hexdigest()[:20]


__all__ = ["FeatureSource", "MemoryFeatures", "feature_dtype_of", "open_features", "open_store", "share_key_of"]
