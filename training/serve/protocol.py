"""What the sampling server and its trainers agree on: parameters, records, errors, addresses, wire formats.

Two channels join a trainer to a server (see :mod:`training.serve`): torch.distributed.rpc
for control (registration, pings, membership), and, on one host, a Unix socket to each
sampler worker process for the data plane: requests and replies of a few dozen bytes,
the batches themselves in the trainer's shared-memory ring (:mod:`training.serve.ring`).
This module holds the formats of both and the helpers that open them.

>>> parse_address("127.0.0.1:29600"), parse_address("[::1]:80")
(('127.0.0.1', 29600), ('::1', 80))
>>> Reply.decode(Reply(OK, seq=7, slot=2, num_nodes=5, num_edges=4, batch_size=2,
...                    counts=(2, 3, 4)).encode(), layers=1).counts
(2, 3, 4)
>>> [r.seq for r in Reply.decode_many(Reply(OK, 1, counts=(1, 1, 1)).encode()
...                                   + Reply(OK, 2, counts=(1, 2, 2)).encode(), layers=1)]
[1, 2]
"""

from __future__ import annotations

import datetime
import fcntl
import math
import os
import socket
import struct
from dataclasses import dataclass

import numpy as np

from training.errors import TrainingError

DEFAULT_PORT = 29600

#: store keys of our own (the rpc group's keys live under ``rpc_prefix_<n>/``)
INFO_KEY = "moment/serve"
NEXT_ID_KEY = "moment/next_worker_id"
SERVER_NAME = "server"


class ServerError(TrainingError):
    """The sampling server is unreachable, died, refused a trainer, or was misconfigured."""


def parse_address(address: str) -> tuple[str, int]:
    """``"HOST:PORT"`` (IPv6 as ``[::1]:PORT``) -> ``(host, port)``; :class:`ServerError` if malformed."""
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


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# ----------------------------------------------------------------------------------------------
# the data plane: one Unix socket per (trainer, worker), SOCK_SEQPACKET (message boundaries kept)

#: reply kinds: a batch in the ring slot asked for; a batch too big for a slot, in a memfd sent
#: with the reply; a batch of CUDA tensors, as torch.multiprocessing CUDA IPC handles; an error
OK, OVERSIZE, DEVICE, ERROR = 1, 2, 3, 4
_REQUEST = struct.Struct("<qqqq")  # seq, slot, epoch, step
_REPLY = struct.Struct("<Bqqqqq")  # kind, seq, slot, num_nodes, num_edges, batch_size
#: largest message on a data socket (a hello, an error text, CUDA IPC handles)
MAX_MESSAGE = 1 << 16


def worker_socket_name(server_pid: int, port: int, index: int) -> str:
    """The abstract-namespace name (no file: nothing to clean up) of sampler worker ``index``'s socket."""
    return f"\0moment-serve-{server_pid}-{port}-w{index}"


@dataclass(frozen=True)
class Request:
    """Sample ``step`` of ``epoch`` for the trainer that sent it, into ring slot ``slot``."""

    seq: int
    slot: int
    epoch: int
    step: int

    def encode(self) -> bytes:
        return _REQUEST.pack(self.seq, self.slot, self.epoch, self.step)

    @classmethod
    def decode(cls, data: bytes) -> Request:
        return cls(*_REQUEST.unpack(data))

    @classmethod
    def decode_many(cls, data: bytes) -> list[Request]:
        """The requests of one message (a trainer sends those a worker is to sample in one pass together)."""
        return [cls(*fields) for fields in _REQUEST.iter_unpack(data)]


@dataclass(frozen=True)
class Reply:
    """A worker's answer: ``kind`` (:data:`OK`, :data:`OVERSIZE`, :data:`DEVICE`, :data:`ERROR`) and
    the batch's shape (``counts``: nodes per hop, hop 0 first, then edges per hop), or ``message``."""

    kind: int
    seq: int
    slot: int = -1
    num_nodes: int = 0
    num_edges: int = 0
    batch_size: int = 0
    counts: tuple[int, ...] = ()
    message: str = ""
    payload: bytes = b""

    def encode(self) -> bytes:
        head = _REPLY.pack(self.kind, self.seq, self.slot, self.num_nodes, self.num_edges, self.batch_size)
        if self.kind == ERROR:
            return head + self.message.encode()[:MAX_MESSAGE - _REPLY.size]
        return head + np.asarray(self.counts, np.int64).tobytes() + self.payload

    @classmethod
    def decode(cls, data: bytes, layers: int) -> Reply:
        kind, seq, slot, nodes, edges, bsz = _REPLY.unpack_from(data)
        if kind == ERROR:
            return cls(kind, seq, message=data[_REPLY.size:].decode(errors="replace"))
        n = 2 * layers + 1
        counts = tuple(np.frombuffer(data, np.int64, n, _REPLY.size).tolist())
        return cls(kind, seq, slot, nodes, edges, bsz, counts, payload=data[_REPLY.size + 8 * n:])

    @classmethod
    def decode_many(cls, data: bytes, layers: int) -> list[Reply]:
        """The replies of one message: :data:`OK` replies (no payload: all of one size) travel together,
        one message for the batches of one pass (one wake-up of the trainer, not one per batch); any
        other kind alone."""
        size = _REPLY.size + 8 * (2 * layers + 1)
        if data[:1] == bytes([OK]) and len(data) > size:
            return [cls.decode(data[at:at + size], layers) for at in range(0, len(data), size)]
        return [cls.decode(data, layers)]


def slot_bytes_bound(params: SamplingParams, world_size: int, num_nodes: int, num_edges: int,
                     max_degree: int) -> int:
    """Bytes of the largest batch a rank can get: ``8 * (nodes + 2 * edges)`` at most.

    Hop ``i`` adds at most ``frontier * fanout_i`` edges and as many new vertices (``-1``:
    the largest degree), and never more than the graph holds.

    >>> slot_bytes_bound(SamplingParams(1024, (25, 10)), 1, 10**6, 10**7, 500)
    6766592
    """
    seeds = math.ceil(params.batch_size / max(1, world_size))
    nodes = frontier = min(seeds, num_nodes)
    edges = 0
    for f in params.fanouts:
        grow = frontier * (max_degree if f < 0 else min(f, max_degree))
        edges += min(grow, num_edges)
        frontier = min(grow, num_nodes)
        nodes = min(nodes + frontier, num_nodes)
    return 8 * (nodes + 2 * edges)


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


def pin_tensorpipe_iface(local_ip: str | None) -> None:
    """Make TensorPipe listen on the interface of ``local_ip`` (it reads the variable once per process)."""
    if "TP_SOCKET_IFNAME" in os.environ or not local_ip:
        return
    iface = "lo" if local_ip.startswith("127.") else _iface_with_address(local_ip)
    if iface:
        os.environ["TP_SOCKET_IFNAME"] = iface


def local_ip_towards(host: str, port: int) -> str | None:
    """The local address the kernel would use to reach ``host`` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return s.getsockname()[0]
    except OSError:
        return None


def rpc_options(address: tuple[str, int], timeout_s: float, threads: int):
    from torch.distributed import rpc

    # Transport "uv" (libuv TCP, epoll-driven) only: TensorPipe's "shm" transport runs a reactor
    # thread that busy-polls its ring buffers, one whole core per process even when idle
    # (measured: an idle server at 100% CPU), which on a 2-core trainer host halves the
    # compute. Tensors still travel by the "cma" channel (process_vm_readv, one copy) on one host.
    return rpc.TensorPipeRpcBackendOptions(
        init_method=f"tcp://{address[0]}:{address[1]}", rpc_timeout=float(timeout_s),
        num_worker_threads=int(threads), _transports=["uv"], _channels=["cma", "basic"])


def store_client(host: str, port: int, timeout_s: float):
    """A TCPStore client of the server at ``host:port``, with a fast, clear failure."""
    import torch.distributed as dist

    where = f"{host}:{port}"
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ServerError(f"sampling server {where}: cannot resolve {host!r} ({exc.strerror}); "
                          "check `server`") from None
    try:  # refuse in milliseconds rather than letting the store retry for its whole timeout
        socket.create_connection((host, port), timeout=min(timeout_s, 5.0)).close()
    except OSError as exc:
        raise ServerError(f"sampling server {where}: nothing listens there ({exc.strerror or exc}); "
                          "start it with `moment serve` or fix `server`") from None
    try:
        return dist.TCPStore(host, port, None, False, datetime.timedelta(seconds=min(timeout_s, 10.0)))
    except Exception as exc:  # c10d raises DistNetworkError / RuntimeError subclasses
        raise ServerError(f"sampling server {where}: the store handshake failed ({first_line(exc)}); "
                          "is that a `moment serve` address?") from None


def boot_id() -> str:
    """This kernel's boot id: two processes with the same one run on the same host."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""
