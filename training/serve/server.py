"""The sampling server: owns a dataset, runs the sampler workers, registers and watches trainers.

Control runs over ``torch.distributed.rpc`` (TensorPipe): registration (the parameter
check), pings, membership (:mod:`training.serve.membership`), and the batches of a
trainer on another host, sampled here and copied through rpc. Trainers on this host get
their batches from the worker processes (:mod:`training.serve.workers`) through
shared memory (:mod:`training.serve.ring`); the server process stays out of that path.

The address ``HOST:PORT`` is a c10d ``TCPStore``, bound to ``HOST`` only (127.0.0.1 by
default: the server binds the listening socket itself and hands it to the store; c10d
alone would listen on every interface). TensorPipe's own listener is pinned to the
interface of ``HOST`` with ``TP_SOCKET_IFNAME`` (``lo`` for 127.0.0.1); the workers'
sockets are abstract Unix sockets, reachable from this host's network namespace only.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch.distributed.rpc.functions import async_execution

from momentbase.errors import MomentError
from training.batches import num_steps
from training.sampler import SampledBatch
from training.serve.membership import RPC_PREFIX, GroupMembership
from training.serve.protocol import (
    DEFAULT_PORT,
    INFO_KEY,
    NEXT_ID_KEY,
    SERVER_NAME,
    SamplingParams,
    ServerError,
    ServerEvent,
    TrainerInfo,
    boot_id,
    first_line,
    pin_tensorpipe_iface,
    rpc_options,
    slot_bytes_bound,
    worker_socket_name,
)
from training.serve.workers import DEFAULT_LANES, BatchMaker, WorkerPool

#: the one server of this process (rpc handlers are module functions, looked up by name)
_SERVER: SamplingServer | None = None
#: a slot never needs more than this; a bigger batch goes in a memfd of its own
MAX_SLOT_BYTES = 256 << 20


@dataclass
class _Served:
    """Mutable per-trainer counters (guarded by the server lock)."""

    info: TrainerInfo
    batches: int = 0
    bytes: int = 0
    last_epoch: int = -1
    last_step: int = -1


class SamplingServer:
    """Serves ``(epoch, rank, world_size, step) -> SampledBatch`` of one dataset.

    Args:
        dataset: a dataset directory (:mod:`training.data`; its CSR is memory-mapped and
            shared by every sampler) with a ``train_idx`` split.
        params: the sampling parameters every trainer must use.
        host, port: where to listen (``port=0`` picks a free port; see :attr:`address`).
        workers: sampler worker processes for trainers on this host (default: one per
            CPU this process may use; with ``device="cuda"`` one per GPU, at most that);
            each samples with one torch thread, a CUDA worker on its own GPU.
        threads: sampling threads in the server process, for trainers on other hosts
            (their batches travel through rpc).
        device: where the workers sample: ``"cpu"``, or ``"cuda"`` (batches handed over
            by CUDA IPC, :mod:`training.serve.device`; refused without CUDA).
        timeout_s: rpc timeout of the server's own calls (pings, membership).
        trainer_timeout_s: a member that does not answer a ping within this is forgotten.
        ping_interval_s: how often every member is pinged.
        on_event: called with a :class:`ServerEvent` on every connect / disconnect (from a
            server thread; keep it short).
        validate: check the dataset's files when opening it (:func:`training.data.open_dataset`).
        lanes: requests a worker samples in one pass at most (:class:`training.fused.FusedSampler`;
            a trainer sends up to this many together, at most half its prefetch).
        compiled: the workers sample with the compiled CPU sampler, one request at a time
            (default); False: the torch path's fused passes (the same batches; for comparison).

    Use :meth:`start` / :meth:`close` or ``with``. One server per process.
    """

    def __init__(self, dataset, params: SamplingParams, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 workers: int | None = None, threads: int = 1, device: str = "cpu", timeout_s: float = 30.0,
                 trainer_timeout_s: float = 10.0, ping_interval_s: float = 1.0,
                 on_event: Callable[[ServerEvent], None] | None = None, validate: bool = True,
                 lanes: int = DEFAULT_LANES, compiled: bool = True) -> None:
        from training.data import open_dataset
        from training.serve.device import device_handover_available, worker_devices

        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        if (workers is not None and workers < 0) or threads < 1 or lanes < 1:
            raise ServerError(f"workers: expected 0 or more, got {workers}; threads: expected 1 or more, "
                              f"got {threads}; lanes: expected 1 or more, got {lanes}")
        self.lanes, self.compiled = int(lanes), bool(compiled)
        if device != "cpu" and (why := device_handover_available(device)):
            raise ServerError(f"device {device}: {why}")
        try:  # on CUDA: one worker per GPU, each bound to its own (not one per CPU, all on GPU 0)
            self.worker_devices = worker_devices(device, workers, torch.cuda.device_count() if device != "cpu"
                                                 else 0, cpus)
        except ValueError as exc:
            raise ServerError(f"`workers`: {exc}") from None
        self.workers = len(self.worker_devices)
        self.dataset = open_dataset(dataset, validate=validate)
        if self.dataset.train_idx is None or self.dataset.train_idx.shape[0] == 0:
            raise ServerError(f"{self.dataset.path}: the dataset has no train_idx split to sample from; "
                              "import it with a split")
        self.params = SamplingParams(int(params.batch_size), tuple(int(f) for f in params.fanouts),
                                     int(params.seed))
        num_steps(1, self.params.batch_size)  # validates batch_size
        self.maker = BatchMaker(self.dataset.indptr, self.dataset.indices, self.dataset.train_idx, self.params)
        self.train_idx = self.maker.train_idx
        self.host, self.port, self.device = host, int(port), device
        self.threads, self.timeout_s = int(threads), float(timeout_s)
        self.trainer_timeout_s, self.ping_interval_s = float(trainer_timeout_s), float(ping_interval_s)
        self.on_event = on_event
        self._lock = threading.Lock()
        self._trainers: dict[str, _Served] = {}
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._workers: WorkerPool | None = None
        self._token = secrets.token_hex(16)
        self._max_degree: int | None = None
        self._sock: socket.socket | None = None
        self._store = None
        self._membership: GroupMembership | None = None
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None
        self.connects = 0
        self.last_activity_s = time.monotonic()

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def address(self) -> str:
        """``HOST:PORT`` to give trainers (the real port once started)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def start(self) -> SamplingServer:
        """Bind, start the workers, the store and the rpc agent, and the monitor. Raises ServerError if the port is
        taken."""
        global _SERVER
        import torch.distributed as dist
        from torch.distributed import rpc

        if _SERVER is not None:
            raise ServerError("a sampling server already runs in this process")
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
            sock.listen(128)
        except OSError as exc:
            sock.close()
            raise ServerError(f"cannot listen on {self.address}: {exc.strerror or exc}; "
                              "pick another `port` (or `port=0` for any free one)") from None
        self._sock, self.port = sock, sock.getsockname()[1]
        if self.workers:
            self._workers = WorkerPool(
                {"dataset": str(self.dataset.path), "batch_size": self.params.batch_size,
                 "fanouts": list(self.params.fanouts), "seed": self.params.seed, "token": self._token,
                 "device": self.device, "lanes": self.lanes, "compiled": self.compiled},
                [worker_socket_name(os.getpid(), self.port, i) for i in range(self.workers)], self.worker_devices)
            try:
                self._workers.start(timeout_s=max(60.0, self.timeout_s))
            except ServerError:
                self._release()
                raise
        # multi_tenant: init_rpc's own rank-0 store finds this server by port and reuses it
        self._store = dist.TCPStore(self.host, self.port, None, True, datetime.timedelta(seconds=self.timeout_s),
                                    wait_for_workers=False, multi_tenant=True, master_listen_fd=sock.fileno())
        self._store.set(INFO_KEY, json.dumps({"params": asdict(self.params), "dataset": self.dataset.name,
                                              "num_train": int(self.train_idx.numel()), "pid": os.getpid()}))
        self._store.add(NEXT_ID_KEY, 0)  # trainers take ids 1, 2, ...; the server is 0
        self._membership = GroupMembership(dist.PrefixStore(RPC_PREFIX, dist.TCPStore(
            self.host, self.port, None, False, datetime.timedelta(seconds=self.timeout_s))), self.trainer_timeout_s)
        pin_tensorpipe_iface(None if self.host in ("0.0.0.0", "::", "") else self.host)
        self._pool = concurrent.futures.ThreadPoolExecutor(self.threads, thread_name_prefix="moment-sample")
        _SERVER = self
        try:
            rpc.init_rpc(SERVER_NAME, rank=0, world_size=None,
                         rpc_backend_options=rpc_options((self.host, self.port), self.timeout_s, self.threads + 8))
        except Exception:
            _SERVER = None
            self._release()
            raise
        self._monitor = threading.Thread(target=self._watch, name="moment-serve-monitor", daemon=True)
        self._monitor.start()
        return self

    def close(self) -> None:
        """Stop serving: trainers' next requests fail with ServerError. Idempotent."""
        global _SERVER
        from torch.distributed import rpc

        if _SERVER is not self:
            return
        self._stop.set()
        if self._monitor is not None:
            self._monitor.join(timeout=self.trainer_timeout_s + 5)
        with contextlib.suppress(Exception):  # already down
            rpc.shutdown(graceful=False)
        _SERVER = None
        self._release()

    def _release(self) -> None:
        if self._workers is not None:
            self._workers.close()
            self._workers = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._store = self._membership = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> SamplingServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- reporting -------------------------------------------------------------------------------
    def trainers(self) -> list[TrainerInfo]:
        """The trainers registered now, by rank."""
        with self._lock:
            return sorted((s.info for s in self._trainers.values()), key=lambda i: (i.rank, i.worker_id))

    def stats(self) -> dict[str, dict[str, int]]:
        """Per registered trainer name: batches and bytes served, last epoch and step served."""
        with self._lock:
            return {n: {"batches": s.batches, "bytes": s.bytes, "epoch": s.last_epoch, "step": s.last_step}
                    for n, s in self._trainers.items()}

    def wait(self, stop: threading.Event | None = None, *, max_trainers: int | None = None,
             idle_exit_s: float | None = None, poll_s: float = 0.2) -> str:
        """Block until ``stop`` is set, ``max_trainers`` trainers have come and gone, no trainer was
        connected for ``idle_exit_s`` seconds, or a sampler worker died. Returns which (``"stopped"``,
        ``"max-trainers"``, ``"idle"``, ``"worker-died"``)."""
        while True:
            if stop is not None and stop.wait(poll_s):
                return "stopped"
            if stop is None:
                time.sleep(poll_s)
            if self._workers is not None and self._workers.dead():
                return "worker-died"
            with self._lock:
                busy = bool(self._trainers)
            if max_trainers is not None and self.connects >= max_trainers and not busy:
                return "max-trainers"
            if idle_exit_s is not None and not busy and time.monotonic() - self.last_activity_s >= idle_exit_s:
                return "idle"

    # -- requests (run on rpc threads) -----------------------------------------------------------
    def _register(self, name: str, worker_id: int, request: dict) -> dict:
        theirs = SamplingParams(int(request["batch_size"]), tuple(request["fanouts"]), int(request["seed"]))
        rank, world = int(request["rank"]), int(request["world_size"])
        info = TrainerInfo(name=name, worker_id=worker_id, rank=rank, world_size=world,
                           pid=int(request.get("pid", 0)), host=str(request.get("host", "")),
                           shuffle=bool(request.get("shuffle", True)), connected_at_s=time.time())
        problem = self._refusal(theirs, rank, world)
        if problem:
            self._emit(ServerEvent("refused", info, problem))
            return {"error": problem}
        with self._lock:
            self._trainers[name] = _Served(info)
            self.connects += 1
            self.last_activity_s = time.monotonic()
        self._emit(ServerEvent("connect", info))
        reply = {"num_train": int(self.train_idx.numel()), "dataset": self.dataset.name,
                 "params": asdict(self.params)}
        if self._workers is not None:
            reply["shm"] = {"sockets": self._workers.sockets, "token": self._token, "boot_id": boot_id(),
                            "slot_bytes": self._slot_bytes(world), "device": self.device, "lanes": self.lanes}
        return reply

    def _refusal(self, theirs: SamplingParams, rank: int, world: int) -> str | None:
        diff = self.params.mismatches(theirs)
        if diff:
            return ("sampling parameters differ: " + "; ".join(diff)
                    + "; start the trainer with the server's values or restart `moment serve` with the trainer's")
        if not 0 <= rank < world:
            return f"rank {rank} is outside a world of {world} trainers"
        with self._lock:
            others = [s.info for s in self._trainers.values()]
        for o in others:
            if o.world_size != world:
                return (f"this server feeds a world of {o.world_size} trainers ({o.name} registered so), "
                        f"this trainer says {world}; one job per server")
            if o.rank == rank and self._alive(o.name):
                return f"rank {rank} is already fed to {o.name} (pid {o.pid}); give every trainer its own rank"
            if o.rank == rank:
                self._forget(o.name, "lost", "a new trainer took its rank")
        return None

    def _slot_bytes(self, world: int) -> int:
        indptr = self.dataset.indptr
        if self._max_degree is None:  # in chunks: the CSR may be a memory map far larger than RAM
            step = 1 << 24
            self._max_degree = max(
                (int(np.diff(indptr[a : a + step + 1]).max()) for a in range(0, len(indptr) - 1, step)), default=0
            )
        bound = slot_bytes_bound(self.params, world, len(indptr) - 1, int(indptr[-1]), self._max_degree)
        return max(4096, min(bound, MAX_SLOT_BYTES))

    def _unregister(self, name: str, batches: int = 0, nbytes: int = 0) -> None:
        with self._lock:  # a trainer fed through shared memory reports what it got
            served = self._trainers.get(name)
            if served is not None:
                served.batches += int(batches)
                served.bytes += int(nbytes)
        self._forget(name, "disconnect", "")

    def _submit(self, name: str, epoch: int, rank: int, world_size: int, step: int, shuffle: bool):
        """A batch for a trainer on another host, sampled here and sent through rpc (a Future)."""
        fut: torch.futures.Future = torch.futures.Future()
        with self._lock:
            served = self._trainers.get(name)
        if served is None:
            fut.set_result(f"trainer {name} is not registered (the server forgot it after it missed pings "
                           f"for {self.trainer_timeout_s:g} s, or the server restarted); restart the trainer")
            return fut

        def work() -> None:
            try:
                batch = self.sample(epoch, rank, world_size, step, shuffle=shuffle)
            except MomentError as exc:
                fut.set_result(str(exc))
                return
            except Exception as exc:  # a bug: send it back rather than leave the trainer waiting
                fut.set_result(f"internal error on the server: {type(exc).__name__}: {exc}")
                return
            with self._lock:
                served.batches += 1
                served.bytes += batch.nbytes
                served.last_epoch, served.last_step = epoch, step
            fut.set_result(batch)

        try:
            assert self._pool is not None
            self._pool.submit(work)
        except (RuntimeError, AssertionError):  # pool shut down: the server is closing
            fut.set_result("the sampling server is shutting down")
        return fut

    def sample(self, epoch: int, rank: int, world_size: int, step: int, *, shuffle: bool = True) -> SampledBatch:
        """The batch :class:`~training.batches.LocalBatchSource` yields for these coordinates."""
        return self.maker.sample(epoch, rank, world_size, step, shuffle=shuffle)

    # -- membership ------------------------------------------------------------------------------
    def _emit(self, event: ServerEvent) -> None:
        if self.on_event is not None:
            with contextlib.suppress(Exception):  # a reporting callback must not break the server
                self.on_event(event)

    def _alive(self, name: str) -> bool:
        from torch.distributed import rpc

        try:
            rpc.rpc_sync(name, _ping, timeout=self.trainer_timeout_s)
            return True
        except Exception:
            return False

    def _forget(self, name: str, kind: str, detail: str) -> None:
        """Drop ``name`` from the group (store list, server agent), the workers and the trainers."""
        with self._lock:
            served = self._trainers.pop(name, None)
            if served is not None:
                self.last_activity_s = time.monotonic()
        if self._workers is not None:
            self._workers.drop(name)
        deferred = self._membership.remove(name) if self._membership is not None else None
        if deferred:
            detail = (detail + "; " if detail else "") + deferred
        if served is not None:
            work = f"{served.batches} batches, {served.bytes / 1e6:.1f} MB served"
            self._emit(ServerEvent(kind, served.info, f"{work}; {detail}" if detail else work))
        elif kind == "lost":
            self._emit(ServerEvent(kind, None, f"unregistered member {name}: {detail}"))

    def _watch(self) -> None:
        """Monitor thread: ping every member, forget the silent ones, release a wedged join token."""
        from torch.distributed import rpc

        agent = rpc.api._get_current_rpc_agent()
        while not self._stop.wait(self.ping_interval_s):
            try:
                members = [w.name for w in agent.get_worker_infos() if w.name != SERVER_NAME]
                pings = {n: rpc.rpc_async(n, _ping, timeout=self.trainer_timeout_s) for n in members}
                for n, fut in pings.items():
                    try:
                        fut.wait()
                    except Exception as exc:
                        if not self._stop.is_set():
                            self._forget(n, "lost", f"stopped answering ({first_line(exc)})")
                if self._membership is not None and (joiner := self._membership.release_wedged_token()):
                    self._emit(ServerEvent("lost", None, f"released the group token a failed join of {joiner} held"))
            except Exception:  # never let the monitor die; the next round retries
                if self._stop.is_set():
                    return


# rpc entry points: module functions, pickled by name, run on the callee ------------------------


def _ping() -> int:
    return os.getpid()


def _srv() -> SamplingServer:
    if _SERVER is None:
        raise RuntimeError("no sampling server runs in this process")
    return _SERVER


def _rpc_register(name: str, worker_id: int, request: dict) -> dict:
    return _srv()._register(name, worker_id, request)


def _rpc_unregister(name: str, batches: int = 0, nbytes: int = 0) -> None:
    _srv()._unregister(name, batches, nbytes)


@async_execution  # returns a Future at once: the rpc thread is free while a sampler works
def _rpc_sample(name: str, epoch: int, rank: int, world_size: int, step: int, shuffle: bool):
    return _srv()._submit(name, epoch, rank, world_size, step, shuffle)
