"""The shared-memory ring of batch slots a trainer lends the sampler workers, and how a batch is laid in a slot.

A trainer allocates its ring: segments of ``slots`` slots of ``slot_bytes`` each, every
segment one ``memfd`` (anonymous shared memory: no name in ``/dev/shm``, so nothing can
leak when a process is killed; the kernel frees the pages once the last process holding
the descriptor or a mapping is gone). It sends each segment's descriptor to every worker
over their Unix socket (``SCM_RIGHTS``). A worker writes a batch into the slot a request
names: ``n_id`` (int64 ``[N]``) then ``edge_index`` (int64 ``[2, E]``, row-major), and
replies with ``N``, ``E`` and the per-hop counts. The trainer's batch tensors are views of
the slot, no copy: the slot returns to the free list when the last view of it is freed
(a lease carried by the buffer object numpy and torch keep alive). A trainer that keeps
many batches makes the ring grow by a segment instead of waiting.

>>> import torch
>>> from training.sampler import SampledBatch
>>> ring = BatchRing(slot_bytes=4096, slots=2)
>>> seg, fd = ring.add_segment()
>>> writer = RingWriter(slot_bytes=4096, slots=2)
>>> writer.add_segment(seg, os.dup(fd))
>>> b = SampledBatch(torch.tensor([7, 8, 9]), 1, torch.tensor([[1, 2], [0, 0]]), (1, 2), (2,))
>>> slot = ring.take()
>>> writer.write(slot, b)
True
>>> got = ring.batch(slot, num_nodes=3, num_edges=2, batch_size=1, counts=(1, 2, 2))
>>> got.n_id.tolist(), got.edge_index.tolist(), ring.free_slots()
([7, 8, 9], [[1, 2], [0, 0]], 1)
>>> del got; ring.free_slots()
2
>>> writer.close(); ring.close()
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import mmap
import os

import numpy as np
import torch

from training.sampler import SampledBatch


class _Lease:
    """Returns ``slot`` to ``free`` when the last tensor viewing it is freed."""

    __slots__ = ("free", "slot")

    def __init__(self, free: collections.deque, slot: int) -> None:
        self.free, self.slot = free, slot

    def __del__(self) -> None:
        self.free.append(self.slot)  # deque.append is atomic: finalizers may run on any thread


def _views(buf, num_nodes: int, num_edges: int, batch_size: int, counts: tuple[int, ...]) -> SampledBatch:
    """The batch laid out in ``buf`` (a ctypes array over shared memory): tensors viewing it, no copy."""
    arr = np.frombuffer(buf, np.int64, num_nodes + 2 * num_edges)
    layers = (len(counts) - 1) // 2
    return SampledBatch(torch.from_numpy(arr[:num_nodes]), int(batch_size),
                        torch.from_numpy(arr[num_nodes:]).view(2, num_edges),
                        tuple(int(c) for c in counts[:layers + 1]), tuple(int(c) for c in counts[layers + 1:]))


def batch_nbytes(batch: SampledBatch) -> int:
    """Bytes ``batch`` takes in a slot."""
    return 8 * (batch.num_nodes + 2 * batch.num_edges)


def write_batch(dest: np.ndarray, batch: SampledBatch) -> None:
    """Lay ``batch`` into ``dest`` (int64, at least ``batch_nbytes / 8`` long): ``n_id`` then ``edge_index``."""
    n, e = batch.num_nodes, batch.num_edges
    out = torch.from_numpy(dest[:n + 2 * e])
    out[:n].copy_(batch.n_id)
    out[n:].view(2, e).copy_(batch.edge_index)


class BatchRing:
    """A trainer's slots (``slots`` per segment, ``slot_bytes`` each) and which of them are free."""

    def __init__(self, slot_bytes: int, slots: int) -> None:
        self.slot_bytes = -(-int(slot_bytes) // mmap.PAGESIZE) * mmap.PAGESIZE
        self.slots = int(slots)
        self._segments: list[tuple[int, mmap.mmap]] = []  # (memfd, mapping)
        self._free: collections.deque[int] = collections.deque()

    def add_segment(self) -> tuple[int, int]:
        """A new segment: its id and its memfd (the ring keeps it; dup it to send it)."""
        seg = len(self._segments)
        fd = os.memfd_create(f"moment-ring-{seg}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, self.slots * self.slot_bytes)
            mm = mmap.mmap(fd, self.slots * self.slot_bytes)
        except OSError:
            os.close(fd)
            raise
        self._segments.append((fd, mm))
        self._free.extend(range(seg * self.slots, (seg + 1) * self.slots))
        return seg, fd

    @property
    def num_segments(self) -> int:
        return len(self._segments)

    def take(self) -> int | None:
        """A free slot, or None when every slot is in use."""
        try:
            return self._free.popleft()
        except IndexError:
            return None

    def give_back(self, slot: int) -> None:
        """Return a slot that was taken but never filled (its request failed)."""
        self._free.append(slot)

    def free_slots(self) -> int:
        return len(self._free)

    def batch(self, slot: int, *, num_nodes: int, num_edges: int, batch_size: int,
              counts: tuple[int, ...]) -> SampledBatch:
        """The batch a worker wrote into ``slot``, as views leasing the slot."""
        nbytes = 8 * (num_nodes + 2 * num_edges)
        if nbytes > self.slot_bytes:
            raise ValueError(f"a batch of {nbytes} bytes cannot be in a slot of {self.slot_bytes}")
        seg, i = divmod(slot, self.slots)
        buf = (ctypes.c_char * max(nbytes, 1)).from_buffer(self._segments[seg][1], i * self.slot_bytes)
        buf._lease = _Lease(self._free, slot)  # ctypes arrays take attributes; numpy keeps buf alive
        return _views(buf, num_nodes, num_edges, batch_size, counts)

    def close(self) -> None:
        """Drop the ring's descriptors and mappings (a mapping still viewed by a batch stays until that goes)."""
        for fd, mm in self._segments:
            with contextlib.suppress(BufferError):
                mm.close()
            with contextlib.suppress(OSError):
                os.close(fd)
        self._segments = []


def batch_from_memfd(fd: int, *, num_nodes: int, num_edges: int, batch_size: int,
                     counts: tuple[int, ...]) -> SampledBatch:
    """A batch a worker sent whole in its own memfd (too big for a slot); takes ``fd`` (closed here)."""
    nbytes = 8 * (num_nodes + 2 * num_edges)
    try:
        mm = mmap.mmap(fd, max(nbytes, 1), prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    # the views keep the mapping alive; it is unmapped when the batch is freed
    return _views((ctypes.c_char * max(nbytes, 1)).from_buffer(mm), num_nodes, num_edges, batch_size, counts)


def batch_to_memfd(batch: SampledBatch) -> int:
    """A new memfd holding ``batch`` in the slot layout (for a batch too big for any slot)."""
    nbytes = batch_nbytes(batch)
    fd = os.memfd_create("moment-batch", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, max(nbytes, 1))
        with mmap.mmap(fd, max(nbytes, 1)) as mm:
            dest = np.frombuffer(mm, np.int64)
            write_batch(dest, batch)
            del dest
    except BaseException:
        os.close(fd)
        raise
    return fd


class RingWriter:
    """A worker's side of one trainer's ring (``slots`` per segment, ``slot_bytes`` each): the segments it
    was sent, and writes into slots."""

    def __init__(self, slot_bytes: int, slots: int) -> None:
        self.slot_bytes = -(-int(slot_bytes) // mmap.PAGESIZE) * mmap.PAGESIZE
        self.slots = int(slots)
        self._segments: dict[int, tuple[mmap.mmap, np.ndarray]] = {}

    def add_segment(self, seg: int, fd: int) -> None:
        """Map segment ``seg`` from ``fd``; takes ``fd`` (closed here: the mapping stays)."""
        try:
            mm = mmap.mmap(fd, self.slots * self.slot_bytes)
        finally:
            os.close(fd)
        self._segments[seg] = (mm, np.frombuffer(mm, np.int64))

    def has(self, slot: int) -> bool:
        """Whether ``slot`` lies in a segment this worker was sent."""
        return slot >= 0 and int(slot) // self.slots in self._segments

    def dest(self, slot: int, words: int) -> torch.Tensor | None:
        """int64 ``[words]`` viewing the start of ``slot``, for a batch to be laid in (the
        sampler writes there directly); None if ``words`` do not fit in a slot."""
        if 8 * words > self.slot_bytes:
            return None
        if not self.has(slot):
            raise ValueError(f"slot {slot} is in no segment this worker was sent")
        seg, i = divmod(int(slot), self.slots)
        per = self.slot_bytes // 8
        return torch.from_numpy(self._segments[seg][1][i * per:i * per + words])

    def write(self, slot: int, batch: SampledBatch) -> bool:
        """Lay ``batch`` into ``slot`` (a copy); False if it does not fit (send it another way)."""
        dest = self.dest(slot, batch_nbytes(batch) // 8)
        if dest is None:
            return False
        write_batch(dest.numpy(), batch)
        return True

    def close(self) -> None:
        for mm, _ in self._segments.values():
            with contextlib.suppress(BufferError):
                mm.close()
        self._segments = {}
