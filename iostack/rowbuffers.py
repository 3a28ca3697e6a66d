"""Host output tensors for gathered rows, reused once nothing else holds them (:class:`RowBuffers`)."""

from __future__ import annotations

import threading

import torch
from torch import Tensor


class RowBuffers:
    """Host output tensors for gathered rows, reused once nothing else holds them.

    A batch's rows (tens of MB) are larger than glibc's largest ``mmap`` threshold
    (32 MiB), so each fresh output is a new mapping that faults in page by page:
    gathering 87k rows of 512 B into a new tensor took 31 ms, into a reused one 7 ms
    (``index_select``, one thread). A buffer is handed out again only when its storage
    is held by this ring alone (the batch, its views and autograd's saved tensors all
    count), so reuse can never overwrite rows still in use; otherwise a new buffer is
    made, which is what every gather did before.

    >>> rb = RowBuffers(4, torch.float32)
    >>> a = rb.take(3); a.shape
    torch.Size([3, 4])
    >>> b = rb.take(2); b.data_ptr() == a.data_ptr()  # ``a`` is still alive
    False
    >>> del a; rb.take(2).data_ptr() != b.data_ptr()
    True
    """

    def __init__(self, dim: int, dtype: torch.dtype, slots: int = 4) -> None:
        self.dim = int(dim)
        self.dtype = dtype
        self.slots = int(slots)
        self._bufs: list[Tensor] = []
        self._lock = threading.Lock()

    @staticmethod
    def _free(buf: Tensor) -> bool:
        # the ring's own reference and the temporary storage object made for the query
        return torch._C._storage_Use_Count(buf.untyped_storage()._cdata) <= 2

    def take(self, rows: int) -> Tensor:
        """A ``[rows, dim]`` tensor whose values are undefined (to be overwritten)."""
        with self._lock:
            for i, buf in enumerate(self._bufs):
                if self._free(buf):
                    if buf.shape[0] < rows:
                        # a little headroom: the next batch is rarely the same size
                        buf = self._bufs[i] = torch.empty((rows + rows // 8, self.dim), dtype=self.dtype)
                    return buf[:rows]
            buf = torch.empty((rows, self.dim), dtype=self.dtype)
            if len(self._bufs) < self.slots:
                self._bufs.append(buf)
            return buf[:rows]  # a view: the ring's own tensor is never the one handed out
