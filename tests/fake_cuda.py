"""A fake accelerator for CPU tests: host tensors labelled as device or pinned memory, with CUDA's ordering rules.

:class:`FakeDeviceMemory` implements the primitives of
:class:`iostack.transfer.AcceleratedMemory`, so the feature store, the
transfer module and the trainer take their GPU code paths, and the ordering
rules (which wait, which ``record_stream``) are the library's own code. Memory
is labelled by storage: a tensor is "device" memory (of device ``index``) if
its storage was made by :meth:`empty` or computed from device tensors,
"pinned" if made by :meth:`empty_pinned` or registered by :meth:`pin_in_place`,
else "pageable".

``deferred=True`` models what a real GPU does to a program that forgets a
synchronisation (PyTorch's CUDA semantics: docs "CUDA semantics", "Stream",
"Event", ``Tensor.record_stream``):

* a copy is queued on the current stream; its destination reads as poison
  (NaN, or the dtype's minimum) until the copy runs, and it takes its source
  only then (from pageable memory it takes the source at once, as
  ``cudaMemcpyAsync`` stages it). Queued work runs when the host waits for an
  event after it (:meth:`synchronize`), when a reader on the same stream, or on
  a stream ordered after it (``wait_event``/``wait_stream``, transitively), needs
  its result, or at a random later point (``flush_p``);
* kernels run at once on the host but count as queued on their stream until
  that stream is waited for: overwriting memory that queued work still reads
  (the host refilling a staging buffer, KvikIO writing outside any stream, the
  caching allocator handing a block back) is a *violation*;
* a read, on another stream, of a copy's destination that the reader never
  waited for sees the poison and is a violation;
* a device tensor freed while a stream it was not allocated on still uses it,
  without ``record_stream`` for that stream, is a violation; a block freed
  while its own stream's work still uses it makes the next block allocated on
  that stream unsafe for writes outside any stream;
* one op on tensors of two devices raises, as CUDA does;
* ``cudaHostRegister`` fails on request (``register_error``).

Violations are collected in :attr:`violations` (``check()`` raises them); the
deferred mode intercepts torch calls through a ``TorchFunctionMode`` pushed on
every thread that makes a fake stream current, and on the test's thread inside
``with memory:``. What it still cannot show: real timings, and kernels are
never themselves deferred (a kernel reads its inputs when it is issued).
"""

from __future__ import annotations

import contextlib
import math
import random
import threading
import time
import weakref

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from iostack.transfer import AcceleratedMemory


class FakeCudaError(RuntimeError):
    """What the fake raises where CUDA would (device mix-ups), and :meth:`FakeDeviceMemory.check`."""


def poison_(t: torch.Tensor) -> None:
    if t.dtype.is_floating_point:
        t.fill_(math.nan)
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(torch.iinfo(t.dtype).min)


class _Stream:
    def __init__(self, name: str, index: int) -> None:
        self.name, self.index = name, index
        self.seq = 0  # ops issued
        self.done = 0  # ops completed
        self.ops: list[tuple] = []  # (seq, kind, payload) not yet completed
        self.vc: dict[_Stream, int] = {}  # what this stream's next op is ordered after
        self.freed_busy = 0  # last op that used a block freed since

    def __repr__(self) -> str:
        return f"<stream {self.name} of fake cuda:{self.index}>"


class _Event:
    __slots__ = ("stream", "seq", "vc", "t")

    def __init__(self, stream: _Stream, seq: int, vc: dict) -> None:
        self.stream, self.seq, self.vc, self.t = stream, seq, vc, time.perf_counter()


class _Info:
    """What the fake knows of one storage."""

    __slots__ = ("kind", "index", "stream", "writes", "reads", "users", "recorded", "prev_busy", "sizes")

    def __init__(self, kind: str, index: int = -1, stream: _Stream | None = None) -> None:
        self.kind, self.index, self.stream = kind, index, stream
        self.writes: list[tuple[_Stream, int]] = []  # queued copies into it
        self.reads: list[tuple[_Stream, int]] = []  # queued work reading it
        self.users: dict[_Stream, int] = {}  # streams that used it, last op
        self.recorded: set[_Stream] = set()
        self.prev_busy: tuple[_Stream, int] | None = None


class _Driver:
    """The process's fake CUDA: storages, streams, the queued work."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.info: dict[int, _Info] = {}
        self.defaults: dict[int, _Stream] = {}
        self.local = threading.local()
        self.violations: list[str] = []
        self.rng = random.Random(0)
        self.flush_p = 0.0
        self.deferred = False
        self.host_reads = 0  # device->host reads (a host synchronisation each on a GPU)
        self.syncs: dict[str, int] = {}  # host waits by stream name

    def default(self, index: int) -> _Stream:
        with self.lock:
            return self.defaults.setdefault(index, _Stream(f"default{index}", index))

    def current(self, index: int) -> _Stream:
        cur = getattr(self.local, "streams", {}).get(index)
        return cur if cur is not None else self.default(index)

    def violation(self, what: str) -> None:
        with self.lock:
            self.violations.append(what)

    # -- storages ------------------------------------------------------------------------------
    def label(self, t: torch.Tensor, kind: str, index: int = -1, stream: _Stream | None = None) -> torch.Tensor:
        st = t.untyped_storage()
        ptr = st.data_ptr()
        info = _Info(kind, index, stream)
        if stream is not None and stream.freed_busy > stream.done:
            info.prev_busy = (stream, stream.freed_busy)  # the allocator may hand back a block still in use
        with self.lock:
            self.info[ptr] = info
        weakref.finalize(st, self.free, ptr)
        return t

    def free(self, ptr: int) -> None:
        with self.lock:
            info = self.info.pop(ptr, None)
            if info is None or info.kind != "device":
                return
            for s, last in info.users.items():
                if s.done < last:
                    if s is info.stream:
                        s.freed_busy = max(s.freed_busy, last)
                    elif s not in info.recorded:
                        self.violation(f"a device block allocated on {info.stream} was freed while {s} still "
                                       "used it, without record_stream: the allocator may hand it out again")

    def of(self, t: torch.Tensor) -> _Info | None:
        return self.info.get(t.untyped_storage().data_ptr())

    # -- queued work ---------------------------------------------------------------------------
    def issue(self, s: _Stream, kind: str, payload: object = None) -> int:
        s.seq += 1
        s.vc[s] = s.seq
        s.ops.append((s.seq, kind, payload))
        return s.seq

    def flush(self, s: _Stream, upto: int) -> None:
        with self.lock:
            while s.ops and s.ops[0][0] <= upto:
                seq, kind, payload = s.ops.pop(0)
                if kind == "wait":
                    for other, n in payload.items():
                        if other is not s:
                            self.flush(other, n)
                elif kind == "copy":
                    dst, src = payload
                    with _Bypass():
                        dst.copy_(src)
                s.done = seq

    def settle(self, s: _Stream | None, n: int) -> None:
        """Make ``s``'s work up to ``n`` complete (what a reader ordered after it may see)."""
        if s is not None and s.done < n:
            self.flush(s, n)

    def maybe_flush(self) -> None:
        if self.flush_p and self.rng.random() < self.flush_p:
            with self.lock:
                streams = [s for s in self._streams() if s.ops]
                if streams:
                    s = self.rng.choice(streams)
                    self.flush(s, self.rng.choice(s.ops)[0])

    def _streams(self) -> list[_Stream]:
        seen = list(self.defaults.values()) + list(getattr(self, "all_streams", []))
        return seen

    def ordered(self, reader: _Stream | None, s: _Stream, n: int) -> bool:
        """Whether work of ``reader`` issued now comes after op ``n`` of ``s`` (the host: it has completed)."""
        if reader is None:
            return s.done >= n
        return reader is s or reader.vc.get(s, 0) >= n

    def touch(self, tensors: list[torch.Tensor], written: set[int], stream: _Stream | None, what: str) -> None:
        """An op by ``stream`` (None: the host) on ``tensors``, writing those whose storage is in ``written``."""
        with self.lock:
            seq = None if stream is None else self.issue(stream, "kernel")
            for t in tensors:
                ptr = t.untyped_storage().data_ptr()
                info = self.info.get(ptr)
                if info is None:
                    continue
                for s, n in list(info.writes):
                    if s.done >= n:
                        info.writes.remove((s, n))
                    elif self.ordered(stream, s, n) or stream is None and ptr in written:
                        self.flush(s, n)
                        info.writes.remove((s, n))
                    else:
                        self.violation(f"{what}: {stream or 'the host'} read a copy's destination that {s} "
                                       "had not finished and it never waited for (it saw poison)")
                if ptr in written:
                    for s, n in list(info.reads):
                        if s.done >= n:
                            info.reads.remove((s, n))
                        elif not self.ordered(stream, s, n):
                            self.violation(f"{what}: {stream or 'the host'} overwrote memory that queued work "
                                           f"on {s} still reads")
                    if stream is None and info.prev_busy is not None:
                        s, n = info.prev_busy
                        if s.done < n:
                            self.violation(f"{what}: written outside any stream while {s}'s work on the block's "
                                           "previous life may still run")
                        info.prev_busy = None
                if stream is not None:
                    info.users[stream] = seq
                    info.reads.append((stream, seq))
        self.maybe_flush()


DRIVER = _Driver()


class _Bypass(TorchFunctionMode):
    """The fake's own tensor work, unobserved."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunction():
            return func(*args, **(kwargs or {}))


_VIEWS = {"__getitem__", "view", "reshape", "narrow", "view_as", "unsqueeze", "squeeze", "flatten", "detach",
          "as_strided", "t", "permute", "transpose", "expand", "select", "unflatten"}
_READS_TO_HOST = {"item", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__"}


class _Watch(TorchFunctionMode):
    """Every torch call on the thread: device mix-ups, reads of queued copies, overwrites, labels."""

    def __init__(self, memory: FakeDeviceMemory) -> None:
        super().__init__()
        self.memory = memory

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in ("untyped_storage", "data_ptr", "is_pinned", "dim", "size", "stride", "element_size",
                    "numel", "__get__", "is_contiguous", "storage_offset", "__len__", "__repr__"):
            with torch._C.DisableTorchFunction():
                return func(*args, **kwargs)
        d = DRIVER
        leaves = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        infos = [d.info.get(t.untyped_storage().data_ptr()) for t in leaves]
        devices = {i.index for i in infos if i is not None and i.kind == "device"}
        if len(devices) > 1:
            raise FakeCudaError(f"Expected all tensors to be on the same device, but found at least two devices, "
                                f"{', '.join(f'cuda:{i}' for i in sorted(devices))}! ({name})")
        stream = None
        if devices:
            stream = d.current(next(iter(devices)))
        written: set[int] = set()
        if leaves and ((name.endswith("_") and not name.endswith("__")) or name == "__setitem__"):
            written.add(leaves[0].untyped_storage().data_ptr())
        out = kwargs.get("out")
        if isinstance(out, torch.Tensor):
            written.add(out.untyped_storage().data_ptr())
        if name in _VIEWS and len(leaves) == 1:  # a view reads nothing: its later use does
            with torch._C.DisableTorchFunction():
                return func(*args, **kwargs)
        if any(i is not None for i in infos):
            d.touch(leaves, written, stream, name)
            if stream is not None and name in _READS_TO_HOST:
                with d.lock:
                    d.host_reads += 1
                    d.flush(stream, stream.seq)
        with torch._C.DisableTorchFunction():
            result = func(*args, **kwargs)
        if stream is not None and name not in _READS_TO_HOST and not written:
            for r in (result if isinstance(result, (tuple, list)) else (result,)):
                if isinstance(r, torch.Tensor) and r.untyped_storage().data_ptr() not in d.info:
                    d.label(r, "device", next(iter(devices)), stream)
        return result


class FakeDeviceMemory(AcceleratedMemory):
    """See the module docstring. ``free`` is the free "device" memory it reports, in bytes; ``index`` the
    device's ordinal; ``register_error``: the CUDA error ``cudaHostRegister`` returns (0: it succeeds)."""

    def __init__(self, free: int = 1 << 40, *, index: int = 0, deferred: bool = False, flush_p: float = 0.0,
                 seed: int = 0, register_error: int = 0) -> None:
        super().__init__()
        self.free = free
        self.index = int(index)
        self.fake_device = torch.device("cuda", self.index)
        self.deferred = deferred
        self.register_error = register_error
        if deferred:
            DRIVER.deferred = True
            DRIVER.flush_p = flush_p
            DRIVER.rng.seed(seed)
        self.pinned_in_place: list[int] = []  # bytes of each pin_in_place
        self.unpinned = 0
        self.streams = 0
        self.consumer_waits = 0
        self.host_waits = 0
        self.set_device_calls: list[str] = []
        self._modes = threading.local()

    # -- memory --------------------------------------------------------------------------------
    def kind_of(self, t: torch.Tensor) -> str:
        info = DRIVER.of(t)
        return "pageable" if info is None else info.kind

    def device_of(self, t: torch.Tensor) -> torch.device:
        info = DRIVER.of(t)
        return torch.device("cuda", info.index) if info is not None and info.kind == "device" else t.device

    def is_local(self, t: torch.Tensor) -> bool:
        info = DRIVER.of(t)
        return info is not None and info.kind == "device" and info.index == self.index

    def empty(self, shape, dtype):
        with _Bypass():
            t = torch.empty(shape, dtype=dtype)
        return DRIVER.label(t, "device", self.index, self._current())

    def empty_pinned(self, nbytes):
        with _Bypass():
            t = torch.empty(int(nbytes), dtype=torch.uint8)
        return DRIVER.label(t, "pinned")

    def adopt(self, t):
        return DRIVER.label(t, "device", self.index, self._current()) if self.kind_of(t) == "pageable" else t

    def host_register(self, t):
        if self.register_error:
            return self.register_error
        DRIVER.label(t, "pinned")
        self.pinned_in_place.append(t.numel() * t.element_size())
        return 0

    def unpin(self, t):
        if self.kind_of(t) == "pinned":
            with DRIVER.lock:
                DRIVER.info.pop(t.untyped_storage().data_ptr(), None)
            self.unpinned += 1

    def free_bytes(self):
        return self.free

    def to_host(self, t):
        with self._watching():
            return t.to("cpu").clone()

    # -- copies --------------------------------------------------------------------------------
    def copy(self, dst, src):
        d = DRIVER
        s = self._current()
        if not self.deferred:
            with _Bypass():
                return dst.copy_(src)
        with d.lock:
            # the reader waits for queued copies into src that its stream is ordered after
            d.touch([src, dst], {dst.untyped_storage().data_ptr()}, s, "copy")
            src_info = d.of(src)
            pageable = src_info is None or src_info.kind == "pageable"
            with _Bypass():
                taken = src.clone() if pageable else src
                poison_(dst)
            seq = d.issue(s, "copy", (dst, taken))
            dinfo = d.of(dst)
            if dinfo is not None:
                dinfo.writes.append((s, seq))
                dinfo.users[s] = seq
            if not pageable and src_info is not None:
                src_info.reads.append((s, seq))
                src_info.users[s] = seq
        d.maybe_flush()
        return dst

    # -- streams and events --------------------------------------------------------------------
    def _current(self) -> _Stream:
        return DRIVER.current(self.index)

    def new_stream(self):
        self.streams += 1
        s = _Stream(f"stream{self.streams}", self.index)
        with DRIVER.lock:
            DRIVER.__dict__.setdefault("all_streams", []).append(s)
        return s

    def current_stream(self):
        return self._current()

    @contextlib.contextmanager
    def stream_context(self, stream):
        streams = DRIVER.local.__dict__.setdefault("streams", {})
        before = streams.get(self.index)
        streams[self.index] = stream
        try:
            with self._watching():
                yield
        finally:
            streams[self.index] = before

    def mark(self, stream=None):
        s = stream if stream is not None else self._current()
        with DRIVER.lock:
            return _Event(s, s.seq, dict(s.vc))

    def seconds(self, start, end):
        self.synchronize(end)
        return end.t - start.t

    def synchronize(self, mark):
        self.host_waits += 1
        with DRIVER.lock:
            DRIVER.syncs[mark.stream.name] = DRIVER.syncs.get(mark.stream.name, 0) + 1
            DRIVER.flush(mark.stream, mark.seq)

    def wait_event(self, stream, mark):
        self.consumer_waits += 1
        self._order(stream, mark.vc)

    def wait_stream(self, stream, other):
        with DRIVER.lock:
            self._order(stream, {**other.vc, other: other.seq})

    def _order(self, stream: _Stream, vc: dict) -> None:
        with DRIVER.lock:
            for s, n in vc.items():
                if stream.vc.get(s, 0) < n:
                    stream.vc[s] = n
            DRIVER.issue(stream, "wait", dict(vc))

    def record_stream(self, t, stream):
        info = DRIVER.of(t)
        if info is not None:
            info.recorded.add(stream)

    def set_device(self):
        self.set_device_calls.append(threading.current_thread().name)

    # -- the watch -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _watching(self):
        if not self.deferred or getattr(self._modes, "on", False):
            yield
            return
        self._modes.on = True
        try:
            with _Watch(self):
                yield
        finally:
            self._modes.on = False

    def __enter__(self) -> FakeDeviceMemory:
        self._outer = self._watching()
        self._outer.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._outer.__exit__(*exc)

    @property
    def violations(self) -> list[str]:
        return DRIVER.violations

    def check(self) -> None:
        """Raise :class:`FakeCudaError` listing the violations seen so far (and forget them)."""
        with DRIVER.lock:
            found, DRIVER.violations[:] = list(DRIVER.violations), []
        if found:
            raise FakeCudaError(f"{len(found)} ordering violation(s), first: {found[0]}")


def reset_driver() -> None:
    """A fresh fake CUDA (tests start from one)."""
    global DRIVER
    new = _Driver()
    DRIVER.__dict__.clear()
    DRIVER.__dict__.update(new.__dict__)
