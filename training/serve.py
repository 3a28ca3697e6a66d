"""The sampling server: one process owns the graph and serves sampled mini-batches to trainers.

``moment serve --dataset DIR`` runs a :class:`SamplingServer`; ``moment train --server
HOST:PORT`` reads its batches through a :class:`RemoteBatchSource`, which implements
:class:`training.batches.BatchSource`. A batch is a pure function of ``(seed, epoch,
rank, world_size, step)`` (the server reseeds a sampler exactly as
:class:`~training.batches.LocalBatchSource` does), so a trainer fed by the server gets
bit-identical batches to one that samples locally, and a resumed trainer asking for
epoch ``e`` from step ``s`` gets what the uninterrupted run got.

**Who owns the parameters.** The server is started with the sampling parameters
(fan-outs, global batch size, shuffle seed); the client passes its own and the server
refuses a trainer whose parameters differ, naming each one and both values
(:class:`ServerError`). The trainer's ``shuffle``, ``rank`` and ``world_size`` are its
own; every trainer registered at one time must agree on ``world_size`` and hold a
distinct rank (one job per server).

**Transport.** ``torch.distributed.rpc`` with the TensorPipe agent. The address
``HOST:PORT`` is a c10d ``TCPStore``, bound to ``HOST`` only (127.0.0.1 by default: the
server binds the listening socket itself and hands it to the store; c10d alone would
listen on every interface). TensorPipe's own listener is pinned to the interface of
``HOST`` with ``TP_SOCKET_IFNAME`` (``lo`` for 127.0.0.1). What happens on one machine,
measured with ``TP_VERBOSE_LOGGING`` (torch 2.13): control messages go over TensorPipe's
``shm`` transport (shared-memory ring buffers, eventfd wake-ups) and each tensor of a
reply over its ``cma`` channel — the client copies it straight out of the server's memory
with ``process_vm_readv`` (one copy, no socket, no staging buffer). Not zero-copy
shared memory: a batch is copied once into the trainer's memory. ``tools/bench_serve.py``
measures what that costs against sampling in the trainer.

**Membership.** The rpc group is dynamic (``init_rpc(world_size=None)``, TensorPipe
only): trainers join and leave while the server runs. Measured on torch 2.13: a
trainer that leaves through ``rpc.shutdown()`` is handled, but a SIGKILLed one stays in
the group — in the server agent's worker list and in the store's worker list — and the
next trainer to join fails (``ECONNREFUSED`` from the dead peer during the join
handshake), then wedges the group's join/leave token in the store, so every later join
hangs. The server therefore owns membership: a monitor thread pings every member each
``ping_interval_s`` (the trainer's rpc threads answer even while it computes), and a
member that fails a ping — or a trainer that unregisters — is removed from the store's
list and from the server agent under the group token (torch's own leave protocol, run
by the server on the member's behalf); a token held by a join for longer than
``2 * trainer_timeout_s`` is released. Trainers never run torch's graceful leave
(it would contact every other trainer, dead ones included). A trainer that dies within
one ping interval before another joins can still fail that join after ``timeout_s``;
retrying then succeeds. The server edits membership through a store connection of its
own: a TCPStore client holds its lock through a blocking ``wait``, so waiting for the
token on the agent's store stalled a concurrent join until the timeout (seen: a trainer
leaving while another joined). A process keeps its first worker id for life (torch's
distributed-autograd container refuses another), so the server frees an id when it
drops the member and a process can open a :class:`RemoteBatchSource` again. All this
leans on torch internals (the dynamic group's store keys ``rpc_prefix_0/names/...`` and
``RpcGroupManagementToken``), pinned by ``tests/test_serve.py``.

**Failures.** A dead or hung server makes the trainer's next batch raise
:class:`ServerError` within ``timeout_s`` (every request carries an rpc timeout; a
killed server fails outstanding requests at once). A dead trainer costs the others
nothing: its requests are dropped and it is forgotten within a ping interval or two.
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import contextlib
import datetime
import fcntl
import json
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch.distributed.rpc.functions import async_execution

from planner.errors import PlannerError
from training.batches import _mix, epoch_permutation, num_steps
from training.sampler import NeighborSampler, SampledBatch

__all__ = [
    "DEFAULT_PORT",
    "RemoteBatchSource",
    "SamplingParams",
    "SamplingServer",
    "ServerError",
    "ServerEvent",
    "TrainerInfo",
    "parse_address",
]

DEFAULT_PORT = 29600

#: store keys of our own (the rpc group's keys live under ``rpc_prefix_<n>/``)
_INFO_KEY = "moment/serve"
_NEXT_ID_KEY = "moment/next_worker_id"
#: torch's dynamic rpc group, as laid out by tensorpipe_agent.cpp / rpc/_utils.py (torch 2.x)
_RPC_PREFIX = "rpc_prefix_0"
_TOKEN_KEY = "RpcGroupManagementToken"
_NAMES_PREFIX = "names"
_ALL_WORKERS_KEY = "_ALL_WORKER_INFOS"  # "name-id,name-id,"
_SERVER_NAME = "server"

#: the one server of this process (rpc handlers are module functions, looked up by name)
_SERVER: SamplingServer | None = None
#: the one client of this process (torch allows one rpc agent per process)
_CLIENT: RemoteBatchSource | None = None
#: this process's worker id in the server's group, kept across clients
_WORKER_ID: int | None = None


class ServerError(PlannerError):
    """The sampling server is unreachable, died, refused a trainer, or was misconfigured."""


def parse_address(address: str) -> tuple[str, int]:
    """``"HOST:PORT"`` (IPv6 as ``[::1]:PORT``) -> ``(host, port)``; :class:`ServerError` if malformed.

    >>> parse_address("127.0.0.1:29600"), parse_address("[::1]:80")
    (('127.0.0.1', 29600), ('::1', 80))
    """
    host, sep, port = str(address).rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ServerError(f"server address {address!r}: expected HOST:PORT, e.g. 127.0.0.1:{DEFAULT_PORT}")
    return host, int(port)


@dataclass(frozen=True)
class SamplingParams:
    """What the server samples: global ``batch_size`` (seeds per step over all ranks), hop fan-outs, shuffle seed."""

    batch_size: int
    fanouts: tuple[int, ...]
    seed: int = 0

    def mismatches(self, other: SamplingParams) -> list[str]:
        """``["fanouts 25,10 (server) vs 10,5 (trainer)", ...]`` for every field that differs."""
        out = []
        for name in ("batch_size", "fanouts", "seed"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if tuple(np.atleast_1d(mine)) != tuple(np.atleast_1d(theirs)):
                fmt = (lambda v: ",".join(map(str, v))) if name == "fanouts" else str
                out.append(f"{name} {fmt(mine)} (server) vs {fmt(theirs)} (trainer)")
        return out


@dataclass(frozen=True)
class TrainerInfo:
    """A registered trainer, as the server sees it (``connected_at_s``: Unix time)."""

    name: str
    worker_id: int
    rank: int
    world_size: int
    pid: int
    host: str
    shuffle: bool
    connected_at_s: float


@dataclass(frozen=True)
class ServerEvent:
    """Something the CLI reports: ``kind`` is ``"connect"``, ``"disconnect"`` (the trainer said
    goodbye), ``"lost"`` (it stopped answering pings) or ``"refused"``; ``trainer`` may be None
    for a refused or unregistered member."""

    kind: str
    trainer: TrainerInfo | None
    detail: str = ""


@dataclass
class _Served:
    """Mutable per-trainer counters (guarded by the server lock)."""

    info: TrainerInfo
    batches: int = 0
    bytes: int = 0
    last_epoch: int = -1
    last_step: int = -1


# ----------------------------------------------------------------------------------------------
# network helpers


def _iface_with_address(ip: str) -> str | None:
    """The name of the local interface that holds IPv4 address ``ip`` (Linux ioctl), or None."""
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                res = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
            if socket.inet_ntoa(res[20:24]) == ip:
                return name
    return None


def _pin_tensorpipe_iface(local_ip: str | None) -> None:
    """Make TensorPipe listen on the interface of ``local_ip`` (it reads the variable once per process)."""
    if "TP_SOCKET_IFNAME" in os.environ or not local_ip:
        return
    iface = "lo" if local_ip.startswith("127.") else _iface_with_address(local_ip)
    if iface:
        os.environ["TP_SOCKET_IFNAME"] = iface


def _local_ip_towards(host: str, port: int) -> str | None:
    """The local address the kernel would use to reach ``host`` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return s.getsockname()[0]
    except OSError:
        return None


def _rpc_options(address: tuple[str, int], timeout_s: float, threads: int):
    from torch.distributed import rpc

    # Transport "uv" (libuv TCP, epoll-driven) only: TensorPipe's "shm" transport runs a reactor
    # thread that busy-polls its ring buffers, one whole core per process even when idle
    # (measured: an idle server at 100% CPU), which on a 2-core trainer host halves the
    # compute. Tensors still travel by the "cma" channel (process_vm_readv, one copy) on one host.
    return rpc.TensorPipeRpcBackendOptions(
        init_method=f"tcp://{address[0]}:{address[1]}", rpc_timeout=float(timeout_s),
        num_worker_threads=int(threads), _transports=["uv"], _channels=["cma", "basic"])


def _store_client(host: str, port: int, timeout_s: float):
    """A TCPStore client of the server at ``host:port``, with a fast, clear failure."""
    import torch.distributed as dist

    where = f"{host}:{port}"
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ServerError(f"sampling server {where}: cannot resolve {host!r} ({exc.strerror}); "
                          "check --server") from None
    try:  # refuse in milliseconds rather than letting the store retry for its whole timeout
        socket.create_connection((host, port), timeout=min(timeout_s, 5.0)).close()
    except OSError as exc:
        raise ServerError(f"sampling server {where}: nothing listens there ({exc.strerror or exc}); "
                          "start it with `moment serve` or fix --server") from None
    try:
        return dist.TCPStore(host, port, None, False, datetime.timedelta(seconds=min(timeout_s, 10.0)))
    except Exception as exc:  # c10d raises DistNetworkError / RuntimeError subclasses
        raise ServerError(f"sampling server {where}: the store handshake failed ({_first_line(exc)}); "
                          "is that a `moment serve` address?") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# ----------------------------------------------------------------------------------------------
# the server


class SamplingServer:
    """Serves ``(epoch, rank, world_size, step) -> SampledBatch`` of one dataset over ``torch.distributed.rpc``.

    Args:
        dataset: a dataset directory (:mod:`training.data`; its CSR is memory-mapped and
            shared by every sampler) with a ``train_idx`` split.
        params: the sampling parameters every trainer must use.
        host, port: where to listen (``port=0`` picks a free port; see :attr:`address`).
        threads: sampling threads, each with its own :class:`NeighborSampler` (one torch
            intra-op thread each). rpc handlers never sample: they hand the request to this
            pool and return at once, so pings and registrations are never stuck behind batches.
        timeout_s: rpc timeout of the server's own calls (pings, membership).
        trainer_timeout_s: a member that does not answer a ping within this is forgotten.
        ping_interval_s: how often every member is pinged.
        on_event: called with a :class:`ServerEvent` on every connect / disconnect (from a
            server thread; keep it short).

    Use :meth:`start` / :meth:`close` or ``with``. One server per process.
    """

    def __init__(self, dataset: str | os.PathLike, params: SamplingParams, *, host: str = "127.0.0.1",
                 port: int = DEFAULT_PORT, threads: int = 2, timeout_s: float = 30.0,
                 trainer_timeout_s: float = 10.0, ping_interval_s: float = 1.0,
                 on_event: Callable[[ServerEvent], None] | None = None, validate: bool = True) -> None:
        from training.data import open_dataset

        if threads < 1:
            raise ServerError(f"threads: expected 1 or more, got {threads}")
        self.dataset = open_dataset(dataset, validate=validate)
        if self.dataset.train_idx is None or self.dataset.train_idx.shape[0] == 0:
            raise ServerError(f"{self.dataset.path}: the dataset has no train_idx split to sample from; "
                              "import it with a split")
        self.params = SamplingParams(int(params.batch_size), tuple(int(f) for f in params.fanouts),
                                     int(params.seed))
        num_steps(1, self.params.batch_size)  # validates batch_size
        with _quiet_readonly():  # tensors over the read-only memory maps, shared by every sampler
            self._indptr = torch.from_numpy(self.dataset.indptr)
            self._indices = torch.from_numpy(self.dataset.indices)
        # one throwaway sampler validates fan-outs and the CSR now, not in a worker thread
        NeighborSampler(self._indptr, self._indices, self.params.fanouts, seed=0)
        self.train_idx = torch.from_numpy(np.asarray(self.dataset.train_idx, dtype=np.int64))
        self.host, self.port = host, int(port)
        self.threads, self.timeout_s = int(threads), float(timeout_s)
        self.trainer_timeout_s, self.ping_interval_s = float(trainer_timeout_s), float(ping_interval_s)
        self.on_event = on_event
        self._lock = threading.Lock()
        self._trainers: dict[str, _Served] = {}
        self._local = threading.local()
        self._orders: collections.OrderedDict[tuple[int, bool], torch.Tensor] = collections.OrderedDict()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._sock: socket.socket | None = None
        self._store = self._member_store = None
        self._member_lock = threading.Lock()
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None
        self._token_seen: tuple[str, float] = ("", 0.0)
        self.connects = 0
        self.last_activity_s = time.monotonic()

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def address(self) -> str:
        """``HOST:PORT`` to give trainers (the real port once started)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def start(self) -> SamplingServer:
        """Bind, start the store and the rpc agent, start the monitor. Raises ServerError if the port is taken."""
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
                              "pick another --port (or --port 0 for any free one)") from None
        self._sock, self.port = sock, sock.getsockname()[1]
        # multi_tenant: init_rpc's own rank-0 store finds this server by port and reuses it
        self._store = dist.TCPStore(self.host, self.port, None, True, datetime.timedelta(seconds=self.timeout_s),
                                    wait_for_workers=False, multi_tenant=True, master_listen_fd=sock.fileno())
        self._store.set(_INFO_KEY, json.dumps({"params": asdict(self.params), "dataset": self.dataset.name,
                                               "num_train": int(self.train_idx.numel()),
                                               "pid": os.getpid()}))
        self._store.add(_NEXT_ID_KEY, 0)  # trainers take ids 1, 2, ...; the server is 0
        # Membership edits need a connection of their own: a TCPStore client holds its lock
        # through a blocking wait(), so waiting for the group token on the agent's store
        # would stall the agent's own store calls (a joiner's handshake) until the timeout.
        self._member_store = dist.PrefixStore(_RPC_PREFIX, dist.TCPStore(
            self.host, self.port, None, False, datetime.timedelta(seconds=self.timeout_s)))
        _pin_tensorpipe_iface(None if self.host in ("0.0.0.0", "::", "") else self.host)
        self._pool = concurrent.futures.ThreadPoolExecutor(self.threads, thread_name_prefix="moment-sample")
        _SERVER = self
        try:
            rpc.init_rpc(_SERVER_NAME, rank=0, world_size=None,
                         rpc_backend_options=_rpc_options((self.host, self.port), self.timeout_s,
                                                          self.threads + 8))
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
        with contextlib.suppress(Exception):
            rpc.shutdown(graceful=False)
        _SERVER = None
        self._release()

    def _release(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._store = self._member_store = None
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
        """Block until ``stop`` is set, ``max_trainers`` trainers have come and gone, or no trainer
        was connected for ``idle_exit_s`` seconds. Returns which (``"stopped"``, ``"max-trainers"``,
        ``"idle"``)."""
        while True:
            if stop is not None and stop.wait(poll_s):
                return "stopped"
            if stop is None:
                time.sleep(poll_s)
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
        problem = None
        diff = self.params.mismatches(theirs)
        if diff:
            problem = ("sampling parameters differ: " + "; ".join(diff)
                       + "; start the trainer with the server's values or restart `moment serve` with the trainer's")
        elif not 0 <= rank < world:
            problem = f"rank {rank} is outside a world of {world} trainers"
        else:
            with self._lock:
                others = [s.info for s in self._trainers.values()]
            for o in others:
                if o.world_size != world:
                    problem = (f"this server feeds a world of {o.world_size} trainers ({o.name} registered so), "
                               f"this trainer says {world}; one job per server")
                elif o.rank == rank and self._alive(o.name):
                    problem = (f"rank {rank} is already fed to {o.name} (pid {o.pid}); "
                               "give every trainer its own rank")
                elif o.rank == rank:
                    self._forget(o.name, "lost", "a new trainer took its rank")
                if problem:
                    break
        if problem:
            self._emit(ServerEvent("refused", info, problem))
            return {"error": problem}
        with self._lock:
            self._trainers[name] = _Served(info)
            self.connects += 1
            self.last_activity_s = time.monotonic()
        self._emit(ServerEvent("connect", info))
        return {"num_train": int(self.train_idx.numel()), "dataset": self.dataset.name,
                "params": asdict(self.params)}

    def _unregister(self, name: str) -> None:
        self._forget(name, "disconnect", "")

    def _submit(self, name: str, epoch: int, rank: int, world_size: int, step: int, shuffle: bool):
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
            except PlannerError as exc:
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
            self._pool.submit(work)
        except RuntimeError:  # pool shut down: the server is closing
            fut.set_result("the sampling server is shutting down")
        return fut

    # -- sampling (pure given the parameters) ----------------------------------------------------
    def sample(self, epoch: int, rank: int, world_size: int, step: int, *, shuffle: bool = True) -> SampledBatch:
        """The batch :class:`~training.batches.LocalBatchSource` yields for these coordinates."""
        if not 0 <= rank < world_size:
            raise ServerError(f"rank {rank} is outside a world of {world_size} trainers")
        b = self.params.batch_size
        steps = num_steps(int(self.train_idx.numel()), b)
        if not 0 <= step < steps:
            raise ServerError(f"step {step} is outside epoch {epoch}'s {steps} steps")
        order = self._order(epoch, shuffle)
        seeds = torch.tensor_split(order[step * b:(step + 1) * b], world_size)[rank]
        sampler = getattr(self._local, "sampler", None)
        if sampler is None:
            sampler = self._local.sampler = NeighborSampler(self._indptr, self._indices, self.params.fanouts,
                                                            seed=0, num_threads=1)
        sampler.reseed(_mix(self.params.seed, epoch, rank, step, 1))
        return sampler.sample(seeds)

    def _order(self, epoch: int, shuffle: bool) -> torch.Tensor:
        """The epoch's seed order (what :func:`training.batches.epoch_seeds` slices), cached per epoch."""
        key = (int(epoch), bool(shuffle))
        with self._lock:
            hit = self._orders.get(key)
            if hit is not None:
                self._orders.move_to_end(key)
                return hit
        idx = self.train_idx
        order = idx[epoch_permutation(idx.numel(), epoch, self.params.seed)] if shuffle else idx
        with self._lock:
            self._orders[key] = order
            while len(self._orders) > 4:  # trainers of one job are within an epoch of each other
                self._orders.popitem(last=False)
        return order

    # -- membership ------------------------------------------------------------------------------
    def _emit(self, event: ServerEvent) -> None:
        if self.on_event is not None:
            with contextlib.suppress(Exception):
                self.on_event(event)

    def _alive(self, name: str) -> bool:
        from torch.distributed import rpc

        try:
            rpc.rpc_sync(name, _ping, timeout=self.trainer_timeout_s)
            return True
        except Exception:
            return False

    def _forget(self, name: str, kind: str, detail: str) -> None:
        """Drop ``name`` from the group (store list, server agent) and from the trainers."""
        from torch.distributed import rpc
        from torch.distributed.rpc._utils import _group_membership_management

        with self._lock:
            served = self._trainers.pop(name, None)
            if served is not None:
                self.last_activity_s = time.monotonic()
        agent = rpc.api._get_current_rpc_agent()
        try:
            worker = agent.get_worker_info(name)
        except Exception:
            worker = None
        if worker is not None:
            try:
                # one membership change at a time: a second one would block the shared store
                # connection waiting for the token the first must release through it
                with self._member_lock, _group_membership_management(self._member_store, f"{name}@server", False):
                    _drop_worker_entry(self._member_store, name, worker.id)
                    agent._update_group_membership(worker, [], {}, False)
            except Exception as exc:  # the token timed out: leave it for the next round
                detail = (detail + "; " if detail else "") + f"membership cleanup deferred ({_first_line(exc)})"
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
                members = [w.name for w in agent.get_worker_infos() if w.name != _SERVER_NAME]
                pings = {n: rpc.rpc_async(n, _ping, timeout=self.trainer_timeout_s) for n in members}
                for n, fut in pings.items():
                    try:
                        fut.wait()
                    except Exception as exc:
                        if not self._stop.is_set():
                            self._forget(n, "lost", f"stopped answering ({_first_line(exc)})")
                with self._member_lock:
                    self._release_wedged_token(self._member_store)
            except Exception:  # never let the monitor die; the next round retries
                if self._stop.is_set():
                    return

    def _release_wedged_token(self, store) -> None:
        """A join that failed half-way keeps the group token forever (torch 2.13); release it."""
        held = store.compare_set(_TOKEN_KEY, "\0never", "\0never").decode()  # read without blocking
        now = time.monotonic()
        if not held or not held.endswith("_join"):
            self._token_seen = ("", now)
            return
        if held != self._token_seen[0]:
            self._token_seen = (held, now)
            return
        if now - self._token_seen[1] < 2 * self.trainer_timeout_s:
            return
        name = held[len("Token_for_"):-len("_join")]
        names = _names_store(store)
        listed = names.get(_ALL_WORKERS_KEY).decode() if names.check([_ALL_WORKERS_KEY]) else ""
        for entry in filter(None, listed.split(",")):
            if entry.rpartition("-")[0] == name:
                _drop_worker_entry(store, name, int(entry.rpartition("-")[2]))
        store.set(_TOKEN_KEY, "")
        store.set(held, "Done")
        self._token_seen = ("", now)
        self._emit(ServerEvent("lost", None, f"released the group token a failed join of {name} held"))


def _names_store(store):
    import torch.distributed as dist

    return dist.PrefixStore(_NAMES_PREFIX, store)


def _drop_worker_entry(store, name: str, worker_id: int) -> None:
    """Remove ``name-id,`` from the dynamic group's worker list (what a graceful leave does)."""
    names = _names_store(store)
    if not names.check([_ALL_WORKERS_KEY]):
        return
    listed = names.get(_ALL_WORKERS_KEY).decode()
    entry = f"{name}-{worker_id},"
    if entry in listed:
        names.set(_ALL_WORKERS_KEY, listed.replace(entry, "", 1))
    # free the id too (a graceful leave does not): a process can join only ever with one id,
    # because torch's distributed-autograd container keeps the first one for its lifetime
    names.delete_key(str(worker_id))


@contextlib.contextmanager
def _quiet_readonly():
    import warnings

    with warnings.catch_warnings():
        # read-only memory maps are fine: the sampler never writes to the CSR
        warnings.simplefilter("ignore", UserWarning)
        yield


# rpc entry points: module functions, pickled by name, run on the callee ------------------------


def _ping() -> int:
    return os.getpid()


def _srv() -> SamplingServer:
    if _SERVER is None:
        raise RuntimeError("no sampling server runs in this process")
    return _SERVER


def _rpc_register(name: str, worker_id: int, request: dict) -> dict:
    return _srv()._register(name, worker_id, request)


def _rpc_unregister(name: str) -> None:
    _srv()._unregister(name)


@async_execution  # returns a Future at once: the rpc thread is free while a sampler works
def _rpc_sample(name: str, epoch: int, rank: int, world_size: int, step: int, shuffle: bool):
    return _srv()._submit(name, epoch, rank, world_size, step, shuffle)


# ----------------------------------------------------------------------------------------------
# the client


class RemoteBatchSource:
    """A :class:`training.batches.BatchSource` whose batches come from a :class:`SamplingServer`.

    Joins the server's rpc group, registers (the server checks ``batch_size``, ``fanouts``
    and ``seed`` against its own and refuses with a :class:`ServerError` naming the
    difference), and keeps at most ``prefetch`` requests outstanding while batches are
    consumed. Every request times out after ``timeout_s``: a dead or hung server raises
    :class:`ServerError` from :meth:`batches` within that, never hangs. One per process
    (torch runs one rpc agent per process); :meth:`close` (also run at exit) unregisters.

    Attributes after construction: ``name`` (this trainer's rpc name), ``num_train``
    (training vertices on the server), ``dataset`` (its name).
    """

    def __init__(self, address: str, *, rank: int, world_size: int, batch_size: int, fanouts: Sequence[int],
                 seed: int, shuffle: bool = True, prefetch: int = 4, timeout_s: float = 30.0) -> None:
        global _CLIENT, _WORKER_ID
        from torch.distributed import rpc

        self.address, self.rank, self.world_size = address, int(rank), int(world_size)
        self.batch_size, self.fanouts, self.seed = int(batch_size), tuple(int(f) for f in fanouts), int(seed)
        self.shuffle, self.prefetch, self.timeout_s = bool(shuffle), int(prefetch), float(timeout_s)
        if self.prefetch < 1:
            raise ServerError(f"prefetch: expected 1 or more, got {prefetch}")
        if not 0 <= self.rank < self.world_size:
            raise ServerError(f"rank {rank} is outside a world of {world_size} trainers")
        num_steps(1, self.batch_size)
        if _CLIENT is not None:
            raise ServerError("this process already has a RemoteBatchSource open; close it first "
                              "(torch runs one rpc agent per process)")
        host, port = parse_address(address)
        self._closed, self._server_failed = True, False
        store = _store_client(host, port, self.timeout_s)
        try:
            info = json.loads(store.get(_INFO_KEY).decode()) if store.check([_INFO_KEY]) else None
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
        if _WORKER_ID is None:  # one id per process, for its lifetime (see _drop_worker_entry)
            _WORKER_ID = int(store.add(_NEXT_ID_KEY, 1))
        worker_id = _WORKER_ID
        self.name = f"trainer{worker_id}"  # no '-': torch splits its worker list on it
        _pin_tensorpipe_iface(_local_ip_towards(host, port))
        with rpc._init_counter_lock:
            # init_rpc prefixes the group's keys with a per-process counter; the server's is 0
            rpc._init_counter = 0
        try:
            rpc.init_rpc(self.name, rank=worker_id, world_size=None,
                         rpc_backend_options=_rpc_options((host, port), self.timeout_s, 8))
        except Exception as exc:
            raise ServerError(f"sampling server {address}: could not join its rpc group ({_first_line(exc)}); "
                              "retry, and check that the server runs") from None
        _CLIENT = self
        self._closed = False
        atexit.register(self.close)
        request = {"batch_size": self.batch_size, "fanouts": list(self.fanouts), "seed": self.seed,
                   "shuffle": self.shuffle, "rank": self.rank, "world_size": self.world_size,
                   "pid": os.getpid(), "host": socket.gethostname()}
        try:
            reply = rpc.rpc_sync(_SERVER_NAME, _rpc_register, args=(self.name, worker_id, request),
                                 timeout=self.timeout_s)
        except Exception as exc:
            error = self._error(exc)
            self.close()
            raise error from None
        if "error" in reply:
            self.close()
            raise ServerError(f"sampling server {address} refused this trainer: {reply['error']}")
        self.num_train, self.dataset = int(reply["num_train"]), str(reply["dataset"])

    def steps(self, epoch: int) -> int:
        return num_steps(self.num_train, self.batch_size)

    def batches(self, epoch: int, start_step: int = 0) -> Iterator[SampledBatch]:
        from torch.distributed import rpc

        if self._closed:
            raise ServerError(f"sampling server {self.address}: this source is closed")
        steps = self.steps(epoch)
        pending: collections.deque = collections.deque()
        nxt = int(start_step)

        def issue() -> None:
            nonlocal nxt
            try:
                pending.append(rpc.rpc_async(_SERVER_NAME, _rpc_sample, timeout=self.timeout_s,
                                             args=(self.name, epoch, self.rank, self.world_size, nxt,
                                                   self.shuffle)))
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
        with contextlib.suppress(Exception):
            if self._server_failed:  # a dead or hung server: do not wait another timeout
                raise ServerError("skip")
            # wait for it: the server drops us from the group only between joins, and a
            # joiner must never find a member that has already gone
            rpc.rpc_sync(_SERVER_NAME, _rpc_unregister, args=(self.name,), timeout=self.timeout_s)
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
        text = _first_line(exc)
        if "timeout" in text.lower() or "timed out" in text.lower():
            why = f"no answer within {self.timeout_s:g} s"
        else:
            why = f"connection lost ({text})"
        return ServerError(f"sampling server {self.address}: {why}; is `moment serve` still running?")

