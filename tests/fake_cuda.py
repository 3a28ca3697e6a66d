"""A fake accelerator for CPU tests: host tensors labelled as device or pinned memory.

:class:`FakeDeviceMemory` implements :class:`iostack.transfer.DeviceMemory`
with ``accelerated = True``, so the feature store, the transfer module and the
trainer take their GPU code paths (results assembled in "device" memory, rows
staged in "pinned" buffers, copies counted) on a machine without a GPU. Memory
is labelled by storage: a tensor is "device" memory if its storage was made
by :meth:`empty`, "pinned" if made by :meth:`empty_pinned` or registered by
:meth:`pin_in_place`, else "pageable" — so a fresh ``index_select`` result is
pageable here exactly as it would be on CUDA. What it cannot show: real
asynchrony, real stream ordering, real device placement.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref

import torch

from iostack.transfer import DeviceMemory


class _Mark:
    __slots__ = ("t", "stream")

    def __init__(self, stream) -> None:
        self.t, self.stream = time.perf_counter(), stream


class FakeDeviceMemory(DeviceMemory):
    """See the module docstring. ``free`` is the free "device" memory it reports, in bytes."""

    accelerated = True

    def __init__(self, free: int = 1 << 40) -> None:
        super().__init__()
        self.free = free
        self._kinds: dict[int, str] = {}  # storage data_ptr -> "device" / "pinned"
        self._lock = threading.Lock()
        self.pinned_in_place: list[int] = []  # bytes of each pin_in_place
        self.unpinned = 0
        self.streams = 0
        self.consumer_waits = 0
        self.host_waits = 0
        self.set_device_calls: list[str] = []
        self._current = threading.local()

    def _label(self, t: torch.Tensor, kind: str) -> torch.Tensor:
        st = t.untyped_storage()
        ptr = st.data_ptr()
        with self._lock:
            self._kinds[ptr] = kind
        weakref.finalize(st, self._forget, ptr)
        return t

    def _forget(self, ptr: int) -> None:
        with self._lock:
            self._kinds.pop(ptr, None)

    def kind_of(self, t: torch.Tensor) -> str:
        with self._lock:
            return self._kinds.get(t.untyped_storage().data_ptr(), "pageable")

    def empty(self, shape, dtype):
        return self._label(torch.empty(shape, dtype=dtype), "device")

    def empty_pinned(self, nbytes):
        return self._label(torch.empty(int(nbytes), dtype=torch.uint8), "pinned")

    def adopt(self, t):
        return self._label(t, "device") if self.kind_of(t) == "pageable" else t

    def pin_in_place(self, t):
        if self.kind_of(t) != "pageable" or t.numel() == 0:
            return False
        self._label(t, "pinned")
        self.pinned_in_place.append(t.numel() * t.element_size())
        return True

    def unpin(self, t):
        if self.kind_of(t) == "pinned":
            self._forget(t.untyped_storage().data_ptr())
            self.unpinned += 1

    def free_bytes(self):
        return self.free

    def new_stream(self):
        self.streams += 1
        return f"stream{self.streams}"

    @contextlib.contextmanager
    def on_stream(self, stream):
        before = getattr(self._current, "stream", None)
        self._current.stream = stream
        try:
            yield
        finally:
            self._current.stream = before

    @property
    def current_stream(self):
        return getattr(self._current, "stream", None)

    def mark(self, stream=None):
        return _Mark(stream if stream is not None else self.current_stream)

    def seconds(self, start, end):
        return end.t - start.t

    def host_wait(self, mark):
        self.host_waits += 1

    def consumer_wait(self, mark, tensors):
        self.consumer_waits += 1

    def set_device(self):
        self.set_device_calls.append(threading.current_thread().name)
