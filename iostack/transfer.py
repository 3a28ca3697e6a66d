"""Host↔device movement in one place: pinned staging, a copy stream with events, casts on the device.

Every byte that the feature store and the trainer move between host memory and
a GPU goes through a :class:`Transfer`. It owns

* **pinned staging buffers**, reused from batch to batch (a small ring per name
  and thread; a buffer is handed out again only once the copy that last read
  it has finished, which an event recorded after that copy tells);
* **a copy stream** per thread: the gathers and uploads of the next batch run
  there while the default stream computes on the current one;
* **the hand-over**: a :class:`Landing` (the tensors and the event after their
  last copy) that the consumer waits on when it starts to use them, on the GPU
  (``wait_event``, no host synchronisation), and whose tensors it marks as used
  by its stream (``record_stream``: the caching allocator must not give their
  memory to the copy stream again while the consumer still reads it);
* **casts after the copy**: an fp16 row crosses PCIe as fp16 and is widened on
  the device;
* **a count of copies** by source and destination memory (``pinned``,
  ``pageable``, ``device``), with bytes, which tests assert on.

Where tensors live and how they are copied is a :class:`DeviceMemory`:
:class:`HostMemory` when there is no accelerator (the "device" is the host,
nothing is copied, tensors stay plain host tensors) and :class:`CudaMemory`
for a CUDA device. Tests run the accelerated bookkeeping on a CPU with a fake
policy (``tests/fake_cuda.py``) that labels host tensors as device or pinned
memory; :class:`CudaMemory` itself has not run on a GPU in this project (no
GPU here).

PyTorch semantics this module is built on: ``copy_(src, non_blocking=True)``
is asynchronous only from pinned (page-locked) host memory, from pageable
memory it is staged and synchronous; ``index_select`` on a pinned tensor
returns *pageable* memory unless given a pinned ``out=``; a tensor allocated
while a side stream is current belongs to that stream's pool.

>>> t = Transfer(HostMemory())
>>> with t.batch() as b:
...     x = b.to_device(torch.ones(2, 3, dtype=torch.float16), dtype=torch.float32)
>>> b.landing.wait() is None, x.dtype, t.counts().copies
(True, torch.float32, 0)
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from iostack.errors import StoreError

#: a copy stream: ``torch.cuda.Stream`` on a CUDA device, None on the host
Stream = Any  # Any: torch.cuda.Stream and None share no type that has the calls each side makes
#: a point in a stream's work: ``torch.cuda.Event`` on a CUDA device, ``time.perf_counter()`` on the host
Mark = Any  # Any: an Event and a float share no type with elapsed_time/synchronize and subtraction

#: memory kinds a copy is counted by
KINDS = ("pinned", "pageable", "device")

#: staging buffers kept per name and thread (a batch being filled, one in flight, one spare)
STAGING_SLOTS = 3


# ----------------------------------------------------------------------------------------------
# where memory lives


class DeviceMemory:
    """No accelerator: the device is the host and nothing is ever copied.

    The interface the rest of :mod:`iostack` and :mod:`training` uses for
    device memory, streams and events; :class:`CudaMemory` is the real
    accelerator. ``accelerated`` says whether ``device`` is memory apart
    from the host (then results are assembled there and copies counted).
    """

    accelerated = False

    def __init__(self) -> None:
        self.device = torch.device("cpu")

    # -- memory --------------------------------------------------------------------------------
    def kind_of(self, t: Tensor) -> str:
        """``"device"``, ``"pinned"`` or ``"pageable"``: the memory ``t`` lives in."""
        return "pageable"

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        """An uninitialised tensor on the device."""
        return torch.empty(shape, dtype=dtype, device=self.device)

    def empty_pinned(self, nbytes: int) -> Tensor:
        """``nbytes`` of host memory (uint8), page-locked where the device allows it."""
        return torch.empty(nbytes, dtype=torch.uint8)

    def pin_in_place(self, t: Tensor) -> bool:
        """Page-lock ``t``'s memory where it is (no copy); False when nothing was registered."""
        return False

    def adopt(self, t: Tensor) -> Tensor:
        """``t``, computed on the device from device tensors (a fake device labels it; CUDA knows)."""
        return t

    def unpin(self, t: Tensor) -> None:
        """Undo :meth:`pin_in_place` (before the memory is freed or unmapped)."""

    def copy(self, dst: Tensor, src: Tensor) -> Tensor:
        """``dst.copy_(src)`` issued on the current stream without blocking the host (from pinned memory)."""
        return dst.copy_(src, non_blocking=True)

    def device_of(self, t: Tensor) -> torch.device:
        """The device ``t`` lives on."""
        return t.device

    def to_host(self, t: Tensor) -> Tensor:
        """A device tensor's values in pageable host memory (the host waits for them)."""
        return t.to("cpu")

    def is_local(self, t: Tensor) -> bool:
        """Whether ``t`` is in this device's memory (not the host's, nor another GPU's: those are copied)."""
        return self.kind_of(t) == "device" and self.device_of(t) == self.device

    def free_bytes(self) -> int | None:
        """Free device memory in bytes, None when the device is the host."""
        return None

    # -- streams and events --------------------------------------------------------------------
    def new_stream(self) -> Stream:
        """A stream for copies (None: everything runs in order on the host)."""
        return None

    def on_stream(self, stream: Stream) -> contextlib.AbstractContextManager:
        """Make ``stream`` current (and the device current) inside the block."""
        return contextlib.nullcontext()

    def mark(self, stream: Stream = None) -> Mark:
        """An event recorded now on ``stream`` (the current stream if None); on the host, the time."""
        return time.perf_counter()

    def seconds(self, start: Mark, end: Mark) -> float:
        """Seconds between two marks (waits for ``end`` to complete on a device)."""
        return float(end - start)

    def host_wait(self, mark: Mark) -> None:
        """Block this thread until the work before ``mark`` has completed."""

    def consumer_wait(self, mark: Mark, tensors: tuple[Tensor, ...]) -> None:
        """Make the calling thread's current stream wait for ``mark`` and own ``tensors`` from now on."""

    def set_device(self) -> None:
        """Make this memory's device current in the calling thread (prefetch threads need it)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.device})"


class HostMemory(DeviceMemory):
    """No accelerator (this machine): results are host tensors, nothing is copied."""


class AcceleratedMemory(DeviceMemory):
    """A device apart from the host, described by a few primitives; the ordering rules built on them live here.

    :class:`CudaMemory` implements the primitives with ``torch.cuda``; the
    tests' fake accelerator (``tests/fake_cuda.py``) with a model of streams,
    events and deferred copies. Each synchronisation of the GPU path is one
    line marked ``# sync-point: NAME`` (``tools/check_syncs.py`` deletes each
    in turn and checks that a test fails).
    """

    accelerated = True

    def __init__(self) -> None:
        super().__init__()
        self._registered: set[int] = set()

    # -- primitives ----------------------------------------------------------------------------
    def current_stream(self) -> Stream:
        """The calling thread's current stream on this device."""
        raise NotImplementedError

    def stream_context(self, stream: Stream) -> contextlib.AbstractContextManager:
        """Make ``stream`` (and its device) current inside the block, nothing more."""
        raise NotImplementedError

    def wait_event(self, stream: Stream, mark: Mark) -> None:
        """Order ``stream``'s later work after ``mark`` (on the device: the host does not block)."""
        raise NotImplementedError

    def wait_stream(self, stream: Stream, other: Stream) -> None:
        """Order ``stream``'s later work after everything issued to ``other`` so far."""
        raise NotImplementedError

    def record_stream(self, t: Tensor, stream: Stream) -> None:
        """Tell the allocator that ``stream`` uses ``t`` (its memory is not reused before that use ends)."""
        raise NotImplementedError

    def synchronize(self, mark: Mark) -> None:
        """Block the host until ``mark`` has completed."""
        raise NotImplementedError

    def host_register(self, t: Tensor) -> int:
        """``cudaHostRegister`` of ``t``'s pages: 0, or the CUDA error code."""
        raise NotImplementedError

    # -- the ordering rules --------------------------------------------------------------------
    @contextlib.contextmanager
    def on_stream(self, stream: Stream) -> Iterator[None]:
        current = self.current_stream()
        if current != stream:
            # inputs made before the block (on the caller's stream) must be ready for it
            self.wait_stream(stream, current)  # sync-point: side-stream-after-caller
        with self.stream_context(stream):
            yield

    def host_wait(self, mark: Mark) -> None:
        self.synchronize(mark)

    def consumer_wait(self, mark: Mark, tensors: tuple[Tensor, ...]) -> None:
        stream = self.current_stream()
        self.wait_event(stream, mark)  # sync-point: landing-wait-event
        for t in tensors:
            if self.kind_of(t) == "device":
                self.record_stream(t, stream)  # sync-point: landing-record-stream

    def pin_in_place(self, t: Tensor) -> bool:
        """Page-lock ``t``'s memory where it is; False when nothing was registered (already page-locked too).

        Raises
        ------
        StoreError
            ``cudaHostRegister`` refused (the locked-memory limit, usually).
        """
        # cudaHostRegister on the tensor's own pages (torch's pin_memory() would copy them into
        # a private, power-of-two-rounded block per process)
        if self.kind_of(t) != "pageable" or not t.is_contiguous() or t.numel() == 0:
            return False
        rc = self.host_register(t)
        if rc == HOST_MEMORY_ALREADY_REGISTERED:
            return False  # someone else in this process registered these pages: already page-locked, not ours
        if rc != 0:
            nbytes = t.numel() * t.element_size()
            raise StoreError(f"cudaHostRegister of {nbytes} bytes failed (cudaError {rc}); is the locked-memory "
                             "limit (ulimit -l) too low for the CPU cache?")
        self._registered.add(t.data_ptr())
        return True


#: ``cudaErrorHostMemoryAlreadyRegistered``: the range (or part of it) is page-locked already
HOST_MEMORY_ALREADY_REGISTERED = 712


class CudaMemory(AcceleratedMemory):
    """A CUDA device through PyTorch: caching allocator, ``cudaHostRegister``, streams and events.

    ``device`` must name one device (``cuda`` alone becomes the current one).
    Not run in this project (no GPU); built on the documented PyTorch calls.
    """

    def __init__(self, device: str | torch.device = "cuda") -> None:
        super().__init__()
        if not torch.cuda.is_available():
            raise StoreError(f"device {device}: CUDA is not available here (torch.cuda.is_available() is False)")
        dev = torch.device(device)
        if dev.type != "cuda":
            raise StoreError(f"CudaMemory needs a cuda device, got {dev}")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        if dev.index >= torch.cuda.device_count():
            raise StoreError(f"device {dev}: only {torch.cuda.device_count()} CUDA device(s) are visible")
        self.device = dev

    def kind_of(self, t: Tensor) -> str:
        if t.device.type == "cuda":
            return "device"
        return "pinned" if t.is_pinned() else "pageable"

    def empty_pinned(self, nbytes: int) -> Tensor:
        return torch.empty(int(nbytes), dtype=torch.uint8, pin_memory=True)

    def host_register(self, t: Tensor) -> int:
        # flag 1 = cudaHostRegisterPortable, as torch.cuda._pin_memory_utils passes
        return int(torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), 1))

    def unpin(self, t: Tensor) -> None:
        ptr = t.data_ptr()
        if ptr in self._registered:
            self._registered.discard(ptr)
            torch.cuda.cudart().cudaHostUnregister(ptr)

    def free_bytes(self) -> int:
        return int(torch.cuda.mem_get_info(self.device)[0])

    def new_stream(self) -> Stream:
        return torch.cuda.Stream(device=self.device)

    def current_stream(self) -> Stream:
        return torch.cuda.current_stream(self.device)

    @contextlib.contextmanager
    def stream_context(self, stream: Stream) -> Iterator[None]:
        with torch.cuda.device(self.device), torch.cuda.stream(stream):
            yield

    def wait_event(self, stream: Stream, mark: Mark) -> None:
        stream.wait_event(mark)

    def wait_stream(self, stream: Stream, other: Stream) -> None:
        stream.wait_stream(other)

    def record_stream(self, t: Tensor, stream: Stream) -> None:
        t.record_stream(stream)

    def synchronize(self, mark: Mark) -> None:
        mark.synchronize()

    def mark(self, stream: Stream = None) -> Mark:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(stream if stream is not None else torch.cuda.current_stream(self.device))
        return ev

    def seconds(self, start: Mark, end: Mark) -> float:
        end.synchronize()
        return start.elapsed_time(end) / 1000.0

    def set_device(self) -> None:
        torch.cuda.set_device(self.device)


def memory_for(device: str | torch.device) -> DeviceMemory:
    """The memory policy of ``device``: :class:`CudaMemory` for ``cuda[:N]``, else :class:`HostMemory`.

    >>> memory_for("cpu")
    HostMemory(cpu)
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        return CudaMemory(dev)
    if dev.type != "cpu":
        raise StoreError(f"device {dev}: only cpu and cuda devices are supported")
    return HostMemory()


# ----------------------------------------------------------------------------------------------
# counts


@dataclass(frozen=True)
class TransferCounts:
    """Copies made through a :class:`Transfer`: ``by_route[(src, dst)] = (copies, bytes)``."""

    by_route: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)

    @property
    def copies(self) -> int:
        return sum(n for n, _ in self.by_route.values())

    def to_device(self, source: str | None = None) -> int:
        """Host→device copies (from ``source`` memory only, if given)."""
        return sum(n for (s, d), (n, _) in self.by_route.items()
                   if d == "device" and s != "device" and source in (None, s))

    def bytes_to_device(self) -> int:
        return sum(b for (s, d), (_, b) in self.by_route.items() if d == "device" and s != "device")


# ----------------------------------------------------------------------------------------------
# the hand-over


class Landing:
    """Tensors whose copies were issued on a copy stream, and the event after the last of them.

    :meth:`wait` (call it on the thread and stream that will use them) makes
    that stream wait for the copies on the device, without blocking the host.
    """

    __slots__ = ("_memory", "_mark", "_tensors", "_waited")

    def __init__(self, memory: DeviceMemory, mark: Mark, tensors: tuple[Tensor, ...]) -> None:
        self._memory, self._mark, self._tensors, self._waited = memory, mark, tensors, False

    def wait(self) -> None:
        if not self._waited and self._mark is not None:
            self._memory.consumer_wait(self._mark, self._tensors)
        self._waited = True


class Gathered:
    """Rows gathered for a consumer, and the landing to wait on before using them."""

    __slots__ = ("rows", "landing")

    def __init__(self, rows: torch.Tensor, landing: Landing | None) -> None:
        self.rows, self.landing = rows, landing

    def wait(self) -> torch.Tensor:
        """The rows, once the calling thread's current stream may use them."""
        if self.landing is not None:
            self.landing.wait()
        return self.rows


class _Slot:
    __slots__ = ("buf", "mark")

    def __init__(self) -> None:
        self.buf: Tensor | None = None
        self.mark: Mark = None


class _Ring:
    __slots__ = ("slots", "next")

    def __init__(self, n: int) -> None:
        self.slots = [_Slot() for _ in range(n)]
        self.next = 0


class Transfer:
    """Host↔device movement for one device (see the module docstring). Thread-safe.

    Each thread gets its own copy stream and staging rings, so a prefetch
    thread and a background gather never share a buffer.
    """

    def __init__(self, memory: DeviceMemory | None = None, *, staging_slots: int = STAGING_SLOTS) -> None:
        self.memory = memory if memory is not None else HostMemory()
        self.device = self.memory.device
        self.staging_slots = max(2, int(staging_slots))
        self._local = threading.local()
        self._lock = threading.Lock()
        self._routes: dict[tuple[str, str], list[int]] = {}

    @property
    def accelerated(self) -> bool:
        return self.memory.accelerated

    def counts(self) -> TransferCounts:
        with self._lock:
            return TransferCounts({k: (v[0], v[1]) for k, v in self._routes.items()})

    def reset_counts(self) -> None:
        with self._lock:
            self._routes.clear()

    def count(self, src: Tensor, dst_kind: str) -> None:
        """Count one copy out of ``src`` into ``dst_kind`` memory."""
        key = (self.memory.kind_of(src), dst_kind)
        with self._lock:
            c = self._routes.setdefault(key, [0, 0])
            c[0] += 1
            c[1] += src.numel() * src.element_size()

    def _thread(self) -> threading.local:
        loc = self._local
        if not hasattr(loc, "rings"):
            loc.rings = {}
            loc.stream = self.memory.new_stream()
        return loc

    def _slot(self, name: str, nbytes: int, taken: list[_Slot]) -> _Slot:
        """This thread's next slot of ring ``name``, holding at least ``nbytes`` of pinned memory.

        Blocks until the copy that last read the slot's buffer has finished
        (:meth:`Batch.staging` ties the slot to its batch's last event). ``taken``:
        the slots the open batch holds already; a batch that stages under one name
        more often than the ring has slots comes back to one of its own, whose copy
        was issued but has no event yet: it waits for the copies issued so far.
        """
        loc = self._thread()
        ring = loc.rings.get(name)
        if ring is None:
            ring = loc.rings[name] = _Ring(self.staging_slots)
        slot = ring.slots[ring.next]
        ring.next = (ring.next + 1) % len(ring.slots)
        if slot.mark is not None:
            self.memory.host_wait(slot.mark)  # sync-point: staging-reuse
            slot.mark = None
        elif any(s is slot for s in taken) and self.memory.accelerated:
            self.memory.host_wait(self.memory.mark(loc.stream))  # sync-point: staging-wrap
        if slot.buf is None or slot.buf.numel() < nbytes:
            # grow geometrically: batches vary in size, and each new pinned block costs a page-locking call
            grown = max(int(nbytes), 2 * slot.buf.numel() if slot.buf is not None else 0, 1 << 16)
            slot.buf = None  # the old block goes back to the allocator before the new one is taken
            slot.buf = self.memory.empty_pinned(grown)
        return slot

    def batch(self) -> Batch:
        """A :class:`Batch`: copies issued on this thread's copy stream, handed over as one landing."""
        return Batch(self)

    def on_thread_stream(self) -> contextlib.AbstractContextManager:
        """Make this thread's copy stream current for a whole producer thread (sampling included).

        A prefetch thread runs all its device work (sampling, gathers, uploads)
        there, in program order, apart from the default stream the trainer
        computes on; its batches reach the trainer through their landings.
        """
        return self.memory.on_stream(self._thread().stream)

    def finish_thread(self) -> None:
        """Wait for everything this thread issued (a producer thread calls it before it ends)."""
        loc = self._thread()
        if self.memory.accelerated:
            self.memory.host_wait(self.memory.mark(loc.stream))  # sync-point: thread-end


class Batch:
    """One batch's copies, on the calling thread's copy stream (a context manager).

    Inside the block, tensors made by :meth:`empty`, :meth:`to_device` and
    :meth:`cast` are the batch's; at its end :attr:`landing` holds them and
    the event after the last copy, and every staging buffer used is released
    to be reused once that event has completed.
    """

    def __init__(self, transfer: Transfer) -> None:
        self.transfer = transfer
        self.memory = transfer.memory
        self._slots: list[_Slot] = []
        self._tensors: list[Tensor] = []
        self._ctx: contextlib.AbstractContextManager | None = None
        self._stream: Stream = None
        self.landing: Landing | None = None

    def __enter__(self) -> Batch:
        self._stream = self.transfer._thread().stream
        self._ctx = self.memory.on_stream(self._stream)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        mark = self.memory.mark(self._stream) if self.memory.accelerated else None
        assert self._ctx is not None
        self._ctx.__exit__(*exc)
        for s in self._slots:
            s.mark = mark
        self.landing = Landing(self.memory, mark, tuple(self._tensors))

    def keep(self, t: Tensor) -> Tensor:
        """Hand ``t`` (made on the copy stream) over with the batch."""
        self._tensors.append(t)
        return t

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        """An uninitialised device tensor, allocated on the copy stream."""
        return self.keep(self.memory.empty(shape, dtype))

    def staging(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        """A pinned host tensor of ``shape``, reused across batches once its last copy has finished."""
        nbytes = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
        slot = self.transfer._slot(name, nbytes, self._slots)
        self._slots.append(slot)
        assert slot.buf is not None
        return slot.buf[:nbytes].view(dtype).view(shape)

    def to_device(self, src: Tensor, dtype: torch.dtype | None = None, out: Tensor | None = None) -> Tensor:
        """``src`` on the device (into ``out`` if given), then cast to ``dtype`` there.

        A host ``src`` is copied once, asynchronously when it is pinned; a
        ``src`` on this device is not copied, one on another GPU is (a batch
        served from a sampling worker's GPU to a trainer on another one).
        Without an accelerator ``src`` itself comes back (cast on the host).
        """
        mem = self.memory
        if not mem.accelerated:
            return src if dtype is None or src.dtype == dtype else src.to(dtype)
        if mem.is_local(src) and out is None:
            dev = src
        else:
            dev = out if out is not None else mem.empty(tuple(src.shape), src.dtype)
            mem.copy(dev, src)
            self.transfer.count(src, "device")
        return self.cast(dev, dtype)

    def cast(self, t: Tensor, dtype: torch.dtype | None) -> Tensor:
        """``t`` as ``dtype``, converted where it is (on the device, after its copy)."""
        if dtype is not None and t.dtype != dtype:
            t = self.memory.adopt(t.to(dtype))
        return self.keep(t) if self.memory.accelerated else t

    def to_host(self, src: Tensor) -> Tensor:
        """A device tensor's values in host memory (a synchronous copy: the caller needs them now)."""
        if self.memory.kind_of(src) != "device" or not self.memory.accelerated:
            return src
        self.transfer.count(src, "pageable")
        return self.memory.to_host(src)
