"""The per-step exchange of feature rows between nodes: every rank asks its peers for rows, once per batch.

Two transports over ``torch.distributed``, one interface (:class:`RowExchange`):
``fetch(requests)`` takes, for every rank ``p``, the global ids wanted from
``p`` (empty for most) and returns the rows in that order; ``serve(ids)`` (given
at construction) answers the peers' requests from this rank's store.

:class:`AllToAllExchange` (the default)
    Three ``all_to_all_single`` collectives on a process group of its own: the
    counts, the ids, the rows back. Every rank takes part in every step's
    exchange, in step order (the batch source guarantees the same number of
    steps on every rank), and answers its peers in between, on the prefetch
    thread. Its own group, created with its own timeout, keeps its collectives
    apart from the trainer's gradient all-reduce on the main thread: two
    threads never interleave calls on one group. Gloo, with host rows, even
    when the ranks train on CUDA devices: a second NCCL communicator driven
    from the prefetch thread while DDP's runs on the trainer's is NCCL's known
    hang pattern (operations on several communicators must be issued in one
    order on every rank; two threads cannot promise it). The class still takes
    a ``device`` for a caller that orders its collectives itself.

:class:`RpcExchange`
    One-sided (DDStore's MPI_Get, DYAD's RPC): ``torch.distributed.rpc`` with
    the TensorPipe agent, one ``rpc_async`` per peer that has rows for us, all
    in flight together; the peer's RPC threads answer without its trainer
    taking part. Nobody waits for a rank that asks for nothing, but every
    request and reply is pickled and crosses TensorPipe's own transport.

Which is faster is measured by ``tools/bench_multinode.py`` (the exchange's
seconds per step at the same batches); docs/design-notes.md has the figures
and the choice.

>>> import torch
>>> x = LoopbackExchange(lambda ids: ids.float().reshape(-1, 1) * 10, dim=1, dtype=torch.float32)
>>> [r.flatten().tolist() for r in x.fetch([torch.tensor([1, 2])])]
[[10.0, 20.0]]
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Protocol

import torch
from torch import Tensor

from training.errors import TrainingError

Serve = Callable[[Tensor], Tensor]


#: what names the ranks that died after a failed collective: set while the job keeps heartbeats
#: (:meth:`training.heartbeats.Heartbeats.for_job`); gloo's error names a socket, not a rank
_LOST_PEERS: list[Callable[[], list[int]]] = []


def name_lost_peers_with(namer: Callable[[], list[int]] | None) -> None:
    """Have every :meth:`PeerLostError.of` ask ``namer()`` which ranks died (``None``: stop asking)."""
    _LOST_PEERS[:] = [namer] if namer is not None else []


class PeerLostError(TrainingError):
    """Another rank died or stopped answering within the timeout: this rank cannot go on."""

    @classmethod
    def of(cls, exc: BaseException, during: str, dead: Sequence[int] | None = None) -> PeerLostError:
        """The error for ``exc`` (a gloo/NCCL/RPC failure) raised during ``during`` (``"epoch 2, step 14"``).

        ``dead``: the ranks known to have died; ``None`` asks the job's heartbeats where it keeps them.
        """
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        first = re.sub(r"^\[[^\]]*\]\s*", "", first)  # gloo's "[.../pair.cc:553] " source prefix
        first = first.split(". ")[0][:200]  # gloo's "This is typically caused by..." advice: ours follows
        if dead is None:
            dead = next((namer() for namer in _LOST_PEERS), [])
        who = f"rank {', '.join(map(str, dead))}" if dead else "another rank"
        return cls(f"{during}: {who} died or stopped answering ({first}); this job cannot go on: restart "
                   "every node, with `resume` to continue from the last checkpoint")


class RowExchange(Protocol):
    """Rows of other ranks' stores, one batched exchange per call (see the module docstring)."""

    name: str

    def fetch(self, requests: Sequence[Tensor]) -> list[Tensor]:
        """``[rows of requests[p] from rank p for every p]``; ``requests[p]``: int64 global ids (host)."""
        ...

    def stats(self) -> dict[str, float]:
        """Calls, seconds spent in :meth:`fetch`, rows and bytes received and served so far."""
        ...

    def close(self) -> None: ...


class _Counts:
    """What an exchange did (updated by the fetching thread and, for RPC, the serving threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.v = {"calls": 0, "seconds": 0.0, "rows_in": 0, "bytes_in": 0, "rows_served": 0, "bytes_served": 0}

    def add(self, **kw: float) -> None:
        with self.lock:
            for k, x in kw.items():
                self.v[k] += x

    def snapshot(self) -> dict[str, float]:
        with self.lock:
            return dict(self.v)


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


class LoopbackExchange:
    """One rank: its own requests served by its own ``serve`` (tests, and a job of one node)."""

    name = "loopback"

    def __init__(self, serve: Serve, *, dim: int, dtype: torch.dtype) -> None:
        self._serve, self.dim, self.dtype = serve, dim, dtype
        self._counts = _Counts()

    def fetch(self, requests: Sequence[Tensor]) -> list[Tensor]:
        t0 = time.perf_counter()
        out = [self._serve(r) if r.numel() else torch.empty((0, self.dim), dtype=self.dtype) for r in requests]
        self._counts.add(calls=1, seconds=time.perf_counter() - t0, rows_in=sum(r.shape[0] for r in out),
                         bytes_in=sum(_nbytes(r) for r in out))
        return out

    def stats(self) -> dict[str, float]:
        return self._counts.snapshot()

    def close(self) -> None:
        pass


class AllToAllExchange:
    """Counts, ids and rows through three ``all_to_all_single`` calls on ``group`` (see the module docstring).

    ``device``: where the exchanged tensors live (the host for gloo, the
    rank's GPU for NCCL); ``serve`` must return its rows there.
    """

    name = "alltoall"

    def __init__(self, group, serve: Serve, *, dim: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu") -> None:
        import torch.distributed as dist

        self._dist = dist
        self.group = group
        self.size = dist.get_world_size(group)
        self._serve, self.dim, self.dtype = serve, dim, dtype
        self.device = torch.device(device)
        self._counts = _Counts()

    @classmethod
    def new_group(cls, timeout_s: float, backend: str = "gloo"):
        """A process group for the exchange alone (every rank calls this, in the same order)."""
        import torch.distributed as dist

        return dist.new_group(backend=backend, timeout=timedelta(seconds=float(timeout_s)))

    @classmethod
    def new_subgroup(cls, timeout_s: float, ranks_per_group: Sequence[Sequence[int]], backend: str = "gloo"):
        """This rank's group of ``ranks_per_group`` (disjoint, every rank in one): replica groups exchange apart.

        Every rank calls it with the same list (torch creates every group on every rank, in that order).
        """
        import torch.distributed as dist

        mine, _ = dist.new_subgroups_by_enumeration([list(r) for r in ranks_per_group],
                                                    timeout=timedelta(seconds=float(timeout_s)), backend=backend)
        return mine

    def fetch(self, requests: Sequence[Tensor]) -> list[Tensor]:
        a2a = self._dist.all_to_all_single
        t0 = time.perf_counter()
        if len(requests) != self.size:
            raise ValueError(f"one request per rank: {self.size} expected, got {len(requests)}")
        dev = self.device
        send = torch.tensor([int(r.numel()) for r in requests], dtype=torch.int64)
        recv = torch.empty_like(send)
        if dev.type == "cpu":
            a2a(recv, send, group=self.group)
        else:  # NCCL moves device tensors only
            r_dev = recv.to(dev)
            a2a(r_dev, send.to(dev), group=self.group)
            recv = r_dev.cpu()
        sc, rc = send.tolist(), recv.tolist()
        ids_out = torch.cat([r.reshape(-1).to(torch.int64) for r in requests]).to(dev)
        ids_in = torch.empty(sum(rc), dtype=torch.int64, device=dev)
        a2a(ids_in, ids_out, output_split_sizes=rc, input_split_sizes=sc, group=self.group)
        served = self._serve(ids_in) if ids_in.numel() else torch.empty((0, self.dim), dtype=self.dtype, device=dev)
        served = served.to(dev).contiguous()
        rows_in = torch.empty((sum(sc), self.dim), dtype=self.dtype, device=dev)
        a2a(rows_in, served, output_split_sizes=sc, input_split_sizes=rc, group=self.group)
        self._counts.add(calls=1, seconds=time.perf_counter() - t0, rows_in=rows_in.shape[0],
                         bytes_in=_nbytes(rows_in), rows_served=served.shape[0], bytes_served=_nbytes(served))
        return list(torch.split(rows_in, sc))

    def stats(self) -> dict[str, float]:
        return self._counts.snapshot()

    def close(self) -> None:
        group, self.group = self.group, None
        if group is not None:
            with contextlib.suppress(RuntimeError, ValueError):  # a broken group (a dead peer) goes anyway
                self._dist.destroy_process_group(group)


# --- RPC ------------------------------------------------------------------------------------

#: this process's serving callback, for the RPC threads (one exchange per process at a time)
_SERVING: dict[str, object] = {}


def _rpc_serve(ids: Tensor) -> Tensor:
    entry = _SERVING.get("serve")
    if entry is None:
        raise RuntimeError("this rank's feature exchange is closed")
    serve, counts = entry
    rows = serve(ids)
    counts.add(rows_served=rows.shape[0], bytes_served=_nbytes(rows))
    return rows


def _rpc_name(rank: int) -> str:
    return f"moment-rows-{rank}"


class RpcExchange:
    """One-sided fetches over ``torch.distributed.rpc`` (TensorPipe); see the module docstring.

    ``address``: ``host:port`` of a rendezvous store rank 0 starts; None
    (the default) takes the job's own (``env://``: ``MASTER_ADDR`` and
    ``MASTER_PORT``: the torchrun agent's store, or rank 0's, shared). Every
    rank of the job constructs one. ``threads``: RPC threads serving
    the peers' requests. ``transports``/``channels``: TensorPipe's; the
    default (TCP through libuv, no shared-memory shortcut) is what crosses
    nodes.
    """

    name = "rpc"

    def __init__(self, serve: Serve, *, rank: int, size: int, dim: int, dtype: torch.dtype, address: str | None = None,
                 timeout_s: float = 30.0, threads: int = 4, transports: Sequence[str] = ("uv",),
                 channels: Sequence[str] = ("basic",)) -> None:
        from torch.distributed import rpc

        self._rpc = rpc
        self.rank, self.size, self.dim, self.dtype = rank, size, dim, dtype
        self._counts = _Counts()
        _SERVING["serve"] = (serve, self._counts)
        opts = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://{address}" if address else "env://",
                                               rpc_timeout=float(timeout_s),
                                               num_worker_threads=int(threads), _transports=list(transports),
                                               _channels=list(channels))
        rpc.init_rpc(_rpc_name(rank), rank=rank, world_size=size, rpc_backend_options=opts)
        self._open = True

    def fetch(self, requests: Sequence[Tensor]) -> list[Tensor]:
        t0 = time.perf_counter()
        futs = {p: self._rpc.rpc_async(_rpc_name(p), _rpc_serve, args=(r.reshape(-1).to(torch.int64),))
                for p, r in enumerate(requests) if r.numel()}
        out = [futs[p].wait() if p in futs else torch.empty((0, self.dim), dtype=self.dtype)
               for p in range(len(requests))]
        self._counts.add(calls=1, seconds=time.perf_counter() - t0, rows_in=sum(r.shape[0] for r in out),
                         bytes_in=sum(_nbytes(r) for r in out))
        return out

    def stats(self) -> dict[str, float]:
        return self._counts.snapshot()

    def close(self, graceful: bool = True) -> None:
        if not self._open:
            return
        self._open = False
        try:
            self._rpc.shutdown(graceful=graceful)  # graceful: waits until every rank stops asking
        finally:
            _SERVING.pop("serve", None)
