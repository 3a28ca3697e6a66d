"""The ``kvikio`` backend: KvikIO ``CuFile.pread`` into GPU buffers (GPUDirect Storage when present).

KvikIO loads libcuda even for host buffers, so it is imported only when
``torch.cuda.is_available()``; anywhere else constructing this backend raises
:class:`StoreError` naming the missing CUDA. Not exercised on this (CPU-only)
machine beyond that check.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from iostack.backends.base import BinHandle, ReadBackend
from iostack.bins import PAGE, BinFile
from iostack.errors import StoreError


class KvikioBackend(ReadBackend):
    """Reads extents with ``CuFile.pread`` (asynchronous, many in flight) into a device buffer."""

    name = "kvikio"

    def __init__(self, *, device: str = "cuda", **_ignored: Any) -> None:
        import torch

        if not torch.cuda.is_available():
            raise StoreError("the kvikio backend needs CUDA, and torch.cuda.is_available() is False "
                             "here (no NVIDIA GPU or driver): use backend='posix' or 'auto'")
        try:
            import kvikio  # noqa: F401 - lazily, on a CUDA machine only
        except ImportError:
            raise StoreError("the kvikio backend needs KvikIO: pip install kvikio-cu12 "
                             "(or use backend='posix')") from None
        self._kvikio = kvikio
        self._torch = torch
        self.device = torch.device(device)
        self.direct = True
        self._files: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._next = 0

    def open(self, info: BinFile) -> BinHandle:
        with self._lock:
            fid = self._next
            self._next += 1
            self._files[fid] = self._kvikio.CuFile(info.path, "r")
        gds = bool(getattr(self._kvikio.defaults, "compat_mode", lambda: True)() is False) \
            if hasattr(self._kvikio, "defaults") else False
        return BinHandle(info=info, fid=fid, direct=gds,
                         note=None if gds else "KvikIO compatibility mode (no GPUDirect Storage)")

    def read_rows(self, handle: BinHandle, rows: np.ndarray, out: np.ndarray) -> int:
        info, torch = handle.info, self._torch
        rows = np.asarray(rows, np.int64)
        if rows.size == 0:
            return 0
        ext = PAGE if info.rows_per_page > 1 else info.row_stride_bytes
        key = rows // info.rows_per_page if info.rows_per_page > 1 else rows
        uniq, inv = np.unique(key, return_inverse=True)
        dev = torch.empty((uniq.size, ext), dtype=torch.uint8, device=self.device)
        f = self._files[handle.fid]
        futures = [f.pread(dev[i], ext, int(u) * ext) for i, u in enumerate(uniq.tolist())]
        for fut in futures:
            fut.get()
        if info.rows_per_page > 1:
            k = info.rows_per_page
            within = dev[:, :k * info.row_bytes].reshape(uniq.size, k, info.row_bytes)
            sel = within[torch.as_tensor(inv, device=self.device), torch.as_tensor(rows % k, device=self.device)]
        else:
            sel = dev[torch.as_tensor(inv, device=self.device), :info.row_bytes]
        out[:] = sel.cpu().numpy()
        return int(uniq.size)

    def close_handle(self, handle: BinHandle) -> None:
        with self._lock:
            f = self._files.pop(handle.fid, None)
        if f is not None:
            f.close()

    def close(self) -> None:
        for fid in list(self._files):
            self._files.pop(fid).close()
