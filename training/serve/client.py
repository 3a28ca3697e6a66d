"""The trainer's side: :class:`RemoteBatchSource`, a :class:`~training.batches.BatchSource` fed by ``moment serve``.

It joins the server's rpc group and registers (the parameter check). On the server's
host it then connects to every sampler worker (:class:`_Feed`): it lends them its ring
of batch slots (:mod:`training.serve.ring`), keeps ``prefetch`` requests in flight
spread over the workers, and yields each batch as tensors viewing its slot. Elsewhere
(another host, another network namespace) batches come through rpc, copied.

**Failures.** Every wait has a deadline of ``timeout_s``: a hung server raises
:class:`ServerError` within it, never hangs. A killed server is seen at once: its
workers die with it (they watch their parent), their sockets close, and the next batch
raises — also when that batch had already arrived (a trainer that prefetched still
reports the death). torch's own C++ warnings about the closed rpc connection are
silenced in a trainer (unless ``TORCH_CPP_LOG_LEVEL`` says otherwise), so the clear
error is the first thing printed.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import ctypes
import json
import os
import select
import selectors
import socket
import time
from collections.abc import Iterator, Sequence

from training.batches import BatchSource, SourceRequest, num_steps
from training.sampler import SampledBatch, SamplerError
from training.serve.protocol import (
    DEVICE,
    ERROR,
    INFO_KEY,
    MAX_MESSAGE,
    NEXT_ID_KEY,
    OVERSIZE,
    SERVER_NAME,
    Reply,
    Request,
    SamplingParams,
    ServerError,
    boot_id,
    first_line,
    local_ip_towards,
    parse_address,
    pin_tensorpipe_iface,
    rpc_options,
    store_client,
)
from training.serve.ring import BatchRing, batch_from_memfd
from training.serve.workers import HELLO, REQUEST, SEGMENT

#: requests a trainer keeps in flight over rpc, and at least as many through shared memory
DEFAULT_PREFETCH = 4

#: the one client of this process (torch allows one rpc agent per process)
_CLIENT: RemoteBatchSource | None = None
#: this process's worker id in the server's group, kept across clients
_WORKER_ID: int | None = None


def _quiet_cpp_warnings() -> None:
    """Raise torch's C++ log threshold to ERROR in this process, unless the user chose one.

    TensorPipe logs a warning (``[W ... tensorpipe_agent.cpp ...] ... eof``) the moment the
    server's connection drops, before the trainer asks for its next batch and prints the
    clear error. torch reads ``TORCH_CPP_LOG_LEVEL`` only when it loads and has no Python
    call for it, so set c10's flag (an exported variable of libc10) directly.
    """
    if "TORCH_CPP_LOG_LEVEL" in os.environ:
        return
    import torch

    with contextlib.suppress(OSError, ValueError, AttributeError):
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
        ctypes.c_int.in_dll(lib, "FLAGS_caffe2_log_level").value = 2  # 2 = ERROR


class _Feed:
    """The data plane to the server's sampler workers: one socket each, the ring, requests in flight."""

    def __init__(self, plan: dict, *, name: str, rank: int, world_size: int, shuffle: bool, layers: int,
                 prefetch: int, timeout_s: float, where: str) -> None:
        self.layers, self.timeout_s, self.where = layers, timeout_s, where
        # requests sent together, for a worker to sample in one pass: up to its lanes, but no more
        # than half of prefetch, so that every worker has work while the trainer consumes
        self.chunk = max(1, min(int(plan.get("lanes", 1)), prefetch // 2))
        self.ring = BatchRing(int(plan["slot_bytes"]), prefetch + 2)
        self.socks: list[socket.socket] = []
        self.sel = selectors.DefaultSelector()
        self.outstanding: list[int] = []
        self.replies: dict[int, tuple[Reply, list[int]]] = {}
        self.sent: dict[int, tuple[int, int]] = {}  # seq -> (worker, slot)
        self.abandoned: set[int] = set()
        self.seq = 0
        self.batches = self.bytes = 0
        seg, fd = self.ring.add_segment()
        hello = HELLO + json.dumps({"token": plan["token"], "name": name, "rank": rank, "world_size": world_size,
                                    "shuffle": shuffle, "slot_bytes": self.ring.slot_bytes,
                                    "slots": self.ring.slots}).encode()
        try:
            for i, path in enumerate(plan["sockets"]):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                self.socks.append(s)
                s.settimeout(timeout_s)
                s.connect(path)
                socket.send_fds(s, [hello], [fd])
                answer = json.loads(s.recv(MAX_MESSAGE) or b'{"error": "closed"}')
                if "error" in answer:
                    raise OSError(f"worker {i}: {answer['error']}")
                s.setblocking(False)  # from now on every wait goes through the selector, with a deadline
                self.sel.register(s, selectors.EVENT_READ, i)
                self.outstanding.append(0)
        except BaseException:
            self.close()
            raise

    def _grow(self) -> None:
        """One more segment of slots, lent to every worker (the trainer holds all the others)."""
        seg, fd = self.ring.add_segment()
        msg = SEGMENT + json.dumps({"seg": seg}).encode()
        for s in self.socks:
            self._send(s, msg, [fd])

    def _send(self, s: socket.socket, msg: bytes, fds: Sequence[int] = ()) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                if fds:
                    socket.send_fds(s, [msg], list(fds))
                else:
                    s.send(msg)
                return
            except BlockingIOError:  # the worker is behind: wait for room, not forever
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([], [s], [], left)[1]:
                    raise ServerError(f"sampling server {self.where}: no room to send a request within "
                                      f"{self.timeout_s:g} s; is `moment serve` still running?") from None
            except OSError as exc:
                raise self._lost(f"cannot send ({exc.strerror or exc})") from None

    def request(self, epoch: int, steps: Sequence[int], *, must: bool = False) -> list[int]:
        """Ask one worker for ``steps`` of ``epoch`` in one message (it samples them in one pass); their
        sequence numbers, fewer (none) when fewer (no) slots are free right now and requests of the
        caller are still to be consumed (``must``: there are none; grow instead)."""
        slots: list[int] = []
        for _ in steps:
            slot = self.ring.take()
            if slot is None and must and not slots:
                self._grow()
                slot = self.ring.take()
            if slot is None:
                break  # a slot frees when the trainer lets go of a batch
            slots.append(slot)
        if not slots:
            return []
        w = min(range(len(self.socks)), key=self.outstanding.__getitem__)
        seqs = list(range(self.seq + 1, self.seq + 1 + len(slots)))
        self.seq += len(slots)
        self._send(
            self.socks[w],
            REQUEST
            + b"".join(
                Request(q, slot, epoch, step).encode()
                for q, slot, step in zip(seqs, slots, steps[: len(slots)], strict=True)
            ),
        )
        self.outstanding[w] += len(seqs)
        self.sent.update((q, (w, slot)) for q, slot in zip(seqs, slots, strict=True))
        return seqs

    def _lost(self, why: str) -> ServerError:
        return ServerError(f"sampling server {self.where}: connection lost ({why}); "
                           "is `moment serve` still running?")

    def _pump(self, timeout: float | None) -> None:
        """Read every reply that has arrived (waiting up to ``timeout`` for the first); EOF raises."""
        for key, _ in self.sel.select(timeout):
            s, w = key.fileobj, key.data
            while True:
                try:
                    msg, fds, _, _ = socket.recv_fds(s, MAX_MESSAGE, 1, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    break
                except OSError as exc:
                    raise self._lost(f"sampler worker {w}: {exc.strerror or exc}") from None
                if not msg:
                    raise self._lost(f"sampler worker {w} closed its socket: the server stopped or was killed")
                for reply in Reply.decode_many(msg, self.layers):
                    self.outstanding[w] -= 1
                    if reply.seq in self.abandoned:  # an epoch left early: free its slot
                        self.abandoned.discard(reply.seq)
                        self.ring.give_back(self.sent.pop(reply.seq)[1])
                        for fd in fds:
                            os.close(fd)
                    else:
                        self.replies[reply.seq] = (reply, fds)

    def poll(self) -> None:
        """Take in what has arrived without waiting: raises if the server is gone."""
        self._pump(0)

    def result(self, seq: int) -> SampledBatch:
        """The batch of request ``seq``, waiting up to ``timeout_s`` for it."""
        deadline = time.monotonic() + self.timeout_s
        while seq not in self.replies:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ServerError(f"sampling server {self.where}: no answer within {self.timeout_s:g} s; "
                                  "is `moment serve` still running?")
            self._pump(left)
        reply, fds = self.replies.pop(seq)
        _, slot = self.sent.pop(seq)
        shape = dict(num_nodes=reply.num_nodes, num_edges=reply.num_edges, batch_size=reply.batch_size,
                     counts=reply.counts)
        if reply.kind == ERROR:
            self.ring.give_back(slot)
            raise ServerError(f"sampling server {self.where}: {reply.message}")
        if reply.kind == OVERSIZE:
            self.ring.give_back(slot)
            batch = batch_from_memfd(fds[0], **shape)
        elif reply.kind == DEVICE:
            from training.serve.device import unpack_device_batch

            self.ring.give_back(slot)
            batch = unpack_device_batch(reply.payload, batch_size=reply.batch_size, counts=reply.counts)
        else:
            batch = self.ring.batch(slot, **shape)
        self.batches += 1
        self.bytes += batch.nbytes
        return batch

    def abandon(self, seqs) -> None:
        """Requests whose batches will not be asked for (an epoch left early): free their slots."""
        for seq in seqs:
            if seq in self.replies:
                _, fds = self.replies.pop(seq)
                for fd in fds:
                    os.close(fd)
                self.ring.give_back(self.sent.pop(seq)[1])
            elif seq in self.sent:
                self.abandoned.add(seq)

    def close(self) -> None:
        for s in self.socks:
            with contextlib.suppress(Exception):
                self.sel.unregister(s)
            s.close()
        self.socks = []
        self.ring.close()


class RemoteBatchSource:
    """A :class:`training.batches.BatchSource` whose batches come from a ``moment serve`` server.

    Joins the server's rpc group, registers (the server checks ``batch_size``, ``fanouts``
    and ``seed`` against its own and refuses with a :class:`ServerError` naming the
    difference), and keeps at most ``prefetch`` requests outstanding while batches are
    consumed (default: twice the server's lanes through shared memory, so that each of a
    worker's passes can sample a whole chunk of them; 4 over rpc). Every wait has a deadline of ``timeout_s``. One
    per process (torch runs one
    rpc agent per process); :meth:`close` (also run at exit) unregisters.

    Attributes after construction: ``name`` (this trainer's rpc name), ``num_train``
    (training vertices on the server), ``dataset`` (its name), ``transport`` (``"shm"``:
    shared memory from the sampler workers, or ``"rpc"``: copied through rpc).
    """

    def __init__(self, address: str, *, rank: int, world_size: int, batch_size: int, fanouts: Sequence[int],
                 seed: int, shuffle: bool = True, prefetch: int | None = None, timeout_s: float = 30.0,
                 transport: str = "auto") -> None:
        global _CLIENT, _WORKER_ID
        from torch.distributed import rpc

        self.address, self.rank, self.world_size = address, int(rank), int(world_size)
        self.batch_size, self.fanouts, self.seed = int(batch_size), tuple(int(f) for f in fanouts), int(seed)
        self.shuffle, self.timeout_s = bool(shuffle), float(timeout_s)
        self.prefetch = DEFAULT_PREFETCH if prefetch is None else int(prefetch)
        self._prefetch_given = prefetch is not None
        if self.prefetch < 1:
            raise ServerError(f"prefetch: expected 1 or more, got {prefetch}")
        if transport not in ("auto", "shm", "rpc"):
            raise ServerError(f"transport: expected auto, shm or rpc, got {transport!r}")
        if not 0 <= self.rank < self.world_size:
            raise ServerError(f"rank {rank} is outside a world of {world_size} trainers")
        num_steps(1, self.batch_size)
        if _CLIENT is not None:
            raise ServerError("this process already has a RemoteBatchSource open; close it first "
                              "(torch runs one rpc agent per process)")
        host, port = parse_address(address)
        self._closed, self._server_failed, self._feed = True, False, None
        store = store_client(host, port, self.timeout_s)
        try:
            info = json.loads(store.get(INFO_KEY).decode()) if store.check([INFO_KEY]) else None
        except Exception:
            info = None
        if info is None:
            raise ServerError(f"{address}: a c10d store, but not a `moment serve` sampling server")
        mine = SamplingParams(self.batch_size, self.fanouts, self.seed)
        diff = SamplingParams(**{**info["params"], "fanouts": tuple(info["params"]["fanouts"])}).mismatches(mine)
        if diff:  # refuse before joining the group: nothing to clean up
            raise ServerError(f"sampling server {address}: sampling parameters differ: " + "; ".join(diff)
                              + "; start the trainer with the server's values or restart `moment serve` "
                              "with the trainer's")
        if _WORKER_ID is None:  # one id per process, for its lifetime (see membership.drop_worker_entry)
            _WORKER_ID = int(store.add(NEXT_ID_KEY, 1))
        worker_id = _WORKER_ID
        self.name = f"trainer{worker_id}"  # no '-': torch splits its worker list on it
        pin_tensorpipe_iface(local_ip_towards(host, port))
        _quiet_cpp_warnings()
        with rpc._init_counter_lock:
            # init_rpc prefixes the group's keys with a per-process counter; the server's is 0
            rpc._init_counter = 0
        try:
            rpc.init_rpc(self.name, rank=worker_id, world_size=None,
                         rpc_backend_options=rpc_options((host, port), self.timeout_s, 8))
        except Exception as exc:
            raise ServerError(f"sampling server {address}: could not join its rpc group ({first_line(exc)}); "
                              "retry, and check that the server runs") from None
        _CLIENT = self
        self._closed = False
        atexit.register(self.close)
        self._register(worker_id, transport)

    def _register(self, worker_id: int, transport: str) -> None:
        import socket as _socket

        from torch.distributed import rpc

        request = {"batch_size": self.batch_size, "fanouts": list(self.fanouts), "seed": self.seed,
                   "shuffle": self.shuffle, "rank": self.rank, "world_size": self.world_size,
                   "pid": os.getpid(), "host": _socket.gethostname()}
        try:
            reply = rpc.rpc_sync(SERVER_NAME, _server_fn("_rpc_register"), args=(self.name, worker_id, request),
                                 timeout=self.timeout_s)
        except Exception as exc:
            error = self._error(exc)
            self.close()
            raise error from None
        if "error" in reply:
            self.close()
            raise ServerError(f"sampling server {self.address} refused this trainer: {reply['error']}")
        self.num_train, self.dataset = int(reply["num_train"]), str(reply["dataset"])
        self.transport = "rpc"
        plan = reply.get("shm")
        why = ("the server runs no sampler workers" if plan is None
               else "the server runs on another host" if plan["boot_id"] != boot_id() else None)
        if transport != "rpc" and why is None:
            if not self._prefetch_given:
                # two whole passes in flight: a worker's pass then samples `lanes` of this
                # trainer's requests, and fuller passes cost less CPU a batch (design notes,
                # "Sampling server")
                self.prefetch = max(DEFAULT_PREFETCH, 2 * int(plan.get("lanes", 1)))
            try:
                self._feed = _Feed(plan, name=self.name, rank=self.rank, world_size=self.world_size,
                                   shuffle=self.shuffle, layers=len(self.fanouts), prefetch=self.prefetch,
                                   timeout_s=self.timeout_s, where=self.address)
                self.transport = "shm"
            except OSError as exc:  # e.g. another network namespace: its abstract sockets are not ours
                why = f"cannot reach its sampler workers ({exc.strerror or exc})"
        if transport == "shm" and self._feed is None:
            self.close()
            raise ServerError(f"sampling server {self.address}: no shared-memory transport: {why}")

    def steps(self, epoch: int) -> int:
        return num_steps(self.num_train, self.batch_size)

    def batches(self, epoch: int, start_step: int = 0) -> Iterator[SampledBatch]:
        if self._closed:
            raise ServerError(f"sampling server {self.address}: this source is closed")
        if self._feed is not None:
            return self._shm_batches(epoch, start_step)
        return self._rpc_batches(epoch, start_step)

    def _shm_batches(self, epoch: int, start_step: int) -> Iterator[SampledBatch]:
        feed, steps = self._feed, self.steps(epoch)
        assert feed is not None
        pending: collections.deque[int] = collections.deque()
        nxt = int(start_step)

        def fill() -> None:
            nonlocal nxt
            while nxt < steps and len(pending) < self.prefetch:
                k = min(feed.chunk, self.prefetch - len(pending), steps - nxt)
                if k < feed.chunk and k < steps - nxt and pending:
                    return  # ask for a whole chunk once there is room: the worker samples it in one pass
                # with nothing of ours in flight the ring must grow: the trainer holds every slot
                seqs = feed.request(epoch, range(nxt, nxt + k), must=not pending)
                if not seqs:
                    return
                pending.extend(seqs)
                nxt += len(seqs)

        try:
            fill()
            while pending:
                batch = feed.result(pending.popleft())
                fill()  # keep the workers busy while this batch trains
                feed.poll()  # a dead server is reported even when the next batches are in hand
                yield batch
        except ServerError:
            self._server_failed = True
            raise
        finally:
            feed.abandon(pending)

    def _rpc_batches(self, epoch: int, start_step: int) -> Iterator[SampledBatch]:
        from torch.distributed import rpc

        steps = self.steps(epoch)
        pending: collections.deque = collections.deque()
        nxt = int(start_step)
        sample = _server_fn("_rpc_sample")

        def issue() -> None:
            nonlocal nxt
            try:
                pending.append(rpc.rpc_async(SERVER_NAME, sample, timeout=self.timeout_s,
                                             args=(self.name, epoch, self.rank, self.world_size, nxt, self.shuffle)))
            except Exception as exc:
                raise self._error(exc) from None
            nxt += 1

        while nxt < steps and len(pending) < self.prefetch:
            issue()
        while pending:
            fut = pending.popleft()
            try:
                result = fut.wait()
            except Exception as exc:
                raise self._error(exc) from None
            if isinstance(result, str):
                raise ServerError(f"sampling server {self.address}: {result}")
            if nxt < steps:  # keep the server busy while this batch trains
                issue()
            yield result

    def close(self) -> None:
        """Unregister and leave the rpc group. Idempotent; quick even if the server is gone."""
        global _CLIENT
        from torch.distributed import rpc

        if self._closed:
            return
        self._closed = True
        counts = (self._feed.batches, self._feed.bytes) if self._feed is not None else (0, 0)
        if self._feed is not None:
            self._feed.close()
            self._feed = None
        if not self._server_failed:  # a dead or hung server: do not wait another timeout
            # wait for it: the server drops us from the group only between joins, and a
            # joiner must never find a member that has already gone
            with contextlib.suppress(Exception):
                rpc.rpc_sync(SERVER_NAME, _server_fn("_rpc_unregister"), args=(self.name, *counts),
                             timeout=self.timeout_s)
        with contextlib.suppress(Exception):
            rpc.shutdown(graceful=False)
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        if _CLIENT is self:
            _CLIENT = None

    def __enter__(self) -> RemoteBatchSource:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _error(self, exc: BaseException) -> ServerError:
        self._server_failed = True
        text = first_line(exc)
        if "timeout" in text.lower() or "timed out" in text.lower():
            why = f"no answer within {self.timeout_s:g} s"
        else:
            why = f"connection lost ({text})"
        return ServerError(f"sampling server {self.address}: {why}; is `moment serve` still running?")


def _server_fn(name: str):
    """An rpc entry point of the server module (imported here only by name: the client does not run it)."""
    from training.serve import server

    return getattr(server, name)


def server_source(req: SourceRequest) -> BatchSource:
    """The ``server`` source: batches sampled by the ``moment serve`` server at ``req.server``.

    Raises
    ------
    SamplerError
        ``req.server`` is not set.
    """
    if not req.server:
        raise SamplerError("the server batch source needs the sampling server's HOST:PORT")
    return RemoteBatchSource(req.server, rank=req.rank, world_size=req.world_size, batch_size=req.batch_size,
                             fanouts=req.fanouts, seed=req.seed, timeout_s=req.timeout_s)
