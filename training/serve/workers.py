"""The sampler worker processes of ``moment serve``: what they sample, and the process each one is.

Sampling is CPU-bound Python and torch: threads of one interpreter contend for the GIL
(measured before: 0.41x of local sampling with 2 trainers on 2 cores). So the server
runs ``workers`` processes (``python -m training.serve._worker_main``), each with one
intra-op thread, each listening on its own abstract Unix socket
(:func:`~training.serve.protocol.worker_socket_name`). A trainer on the same host
connects to every worker, lends each its ring (:mod:`training.serve.ring`) and sends
requests of a few dozen bytes, a chunk at a time; a worker queues every trainer's
requests and takes up to ``lanes`` of them a round (:class:`~training.fused.FusedSampler`),
each batch laid by the sampler straight into the slot its request names (no intermediate
tensors, no copy), and replies with their shapes, one message per trainer a round.
The server process itself stays out of the data path.

The sampler is the trainer's own: the compiled CPU sampler (:mod:`training.compiled_sampler`),
one request at a time; it loads its kernels when the worker starts. On the torch path
(``compiled=False``, or no numba) a batch is ~150 short tensor operations whose fixed cost
is about half its CPU time, and the ``lanes`` requests are sampled in one fused pass (2.2 ms
alone, ~1.5-1.8 ms in fours); the compiled sampler has no such overhead to share and costs
less alone (tools/bench_serve.py measures both, and the hand-off, per batch).

A worker's stdin is its control pipe from the server (JSON lines: ``{"op": "drop",
"name": ...}`` closes a trainer's connection); its end (the server exited, or was
killed) ends the worker, as does the server's death through ``PR_SET_PDEATHSIG``, so
no worker outlives its server.

>>> from training.serve.protocol import SamplingParams
>>> import numpy as np
>>> maker = BatchMaker(np.array([0, 1, 2, 2]), np.array([1, 2], dtype=np.int32), np.arange(3),
...                    SamplingParams(batch_size=2, fanouts=(1,), seed=0))
>>> maker.steps(), maker.sample(0, 0, 1, 1).batch_size  # 3 seeds in batches of 2
(2, 1)
"""

from __future__ import annotations

import array
import collections
import contextlib
import ctypes
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

from training.batches import _mix, epoch_permutation, num_steps
from training.fused import FusedSampler
from training.sampler import NeighborSampler, SampledBatch, SamplerError
from training.serve.protocol import (
    DEVICE,
    ERROR,
    MAX_MESSAGE,
    OK,
    OVERSIZE,
    Reply,
    Request,
    SamplingParams,
    ServerError,
)
from training.serve.ring import RingWriter, batch_to_memfd

#: a message's first byte: its kind (requests are binary, the rest JSON)
HELLO, SEGMENT, REQUEST = b"H", b"S", b"R"

#: requests a worker takes a round at most (on the torch path, sampled in one pass: measured on 2 cores,
#: 512-seed batches of fan-out 25,10: CPU per batch 2.2 ms alone, 1.8 ms in pairs, 1.5-1.8 ms in fours)
DEFAULT_LANES = 4


class BatchMaker:
    """``(epoch, rank, world_size, step) -> SampledBatch``, exactly as :class:`~training.batches.LocalBatchSource`.

    :meth:`sample_many` samples several requests in one pass (:class:`~training.fused.FusedSampler`,
    up to ``lanes`` at once, on CPU) and can lay each batch straight into the slot it goes to.
    One sampler per thread (one torch intra-op thread each); epoch orders are cached
    (trainers of one job are within an epoch of each other). ``check``: refuse training
    vertices out of range or repeated, once here (the server does; its workers need not).
    ``compiled``: CPU batches from the compiled sampler, one request at a time (the same
    batches; :mod:`training.compiled_sampler`), else the torch path's fused passes.
    """

    def __init__(self, indptr, indices, train_idx, params: SamplingParams, device: str = "cpu", *,
                 lanes: int = DEFAULT_LANES, check: bool = True, compiled: bool = True) -> None:
        import warnings

        with warnings.catch_warnings():  # read-only memory maps: the sampler never writes to the CSR
            warnings.simplefilter("ignore", UserWarning)
            self.indptr = torch.as_tensor(indptr).to(device)
            self.indices = torch.as_tensor(indices).to(device)
        self.train_idx = torch.as_tensor(np.asarray(train_idx, dtype=np.int64))
        self.params, self.device, self.compiled = params, device, bool(compiled)
        # fused passes on CPU only: on a GPU the single-batch sampler's fewer host synchronisations win
        self.lanes = max(1, int(lanes)) if device == "cpu" else 1
        # one throwaway sampler validates fan-outs and the CSR now, not in a worker
        probe = NeighborSampler(self.indptr, self.indices, params.fanouts, seed=0)
        if check:  # once here instead of for every batch
            try:
                probe.check_seeds(self.train_idx)
            except SamplerError as exc:
                raise ServerError(f"train_idx: {exc}") from None
            if torch.unique(self.train_idx).numel() != self.train_idx.numel():
                raise ServerError("train_idx: contains repeated vertex ids; list each training vertex once")
        self._local = threading.local()
        self._lock = threading.Lock()
        self._orders: collections.OrderedDict[tuple[int, bool], torch.Tensor] = collections.OrderedDict()

    def steps(self) -> int:
        return num_steps(int(self.train_idx.numel()), self.params.batch_size)

    def check(self, epoch: int, rank: int, world_size: int, step: int) -> None:
        """:class:`ServerError` unless the request's rank and step exist."""
        if not 0 <= rank < world_size:
            raise ServerError(f"rank {rank} is outside a world of {world_size} trainers")
        if not 0 <= step < (steps := self.steps()):
            raise ServerError(f"step {step} is outside epoch {epoch}'s {steps} steps")

    def seeds(self, epoch: int, rank: int, world_size: int, step: int, *, shuffle: bool = True) -> torch.Tensor:
        """The seeds of one request: int64 ``[<= batch_size / world_size]``; :class:`ServerError` if out of range."""
        self.check(epoch, rank, world_size, step)
        b = self.params.batch_size
        return torch.tensor_split(self._order(epoch, shuffle)[step * b:(step + 1) * b], world_size)[rank]

    def sample(self, epoch: int, rank: int, world_size: int, step: int, *, shuffle: bool = True) -> SampledBatch:
        """The batch :class:`~training.batches.LocalBatchSource` yields for these coordinates."""
        return self.sample_many([(epoch, rank, world_size, step, shuffle)])[0]

    def sample_many(self, requests, out=None) -> list[SampledBatch]:
        """The batches of ``requests`` (``(epoch, rank, world_size, step, shuffle)`` each), sampled together.

        ``out(i, words)`` may give an int64 tensor of ``words`` elements for batch ``i`` to be laid
        in (``n_id`` then ``edge_index``; see :class:`~training.fused.FusedSampler`). Raises
        :class:`ServerError` for a request out of range: check them with :meth:`seeds` first.
        """
        seeds = [self.seeds(e, r, w, s, shuffle=sh).to(self.device) for e, r, w, s, sh in requests]
        rng = [_mix(self.params.seed, e, r, s, 1) for e, r, _, s, _ in requests]
        fused = getattr(self._local, "fused", None)
        if fused is None:
            sampler = NeighborSampler(self.indptr, self.indices, self.params.fanouts, seed=0, num_threads=1,
                                      compiled=self.compiled)
            fused = self._local.fused = FusedSampler(sampler, self.lanes)
        if self.device == "cpu":
            return fused.sample(seeds, rng, out=out)
        batches = []  # on a GPU the single-batch sampler, as the trainer's own would run it (``out`` unused)
        for x, r in zip(seeds, rng, strict=True):
            fused.sampler.reseed(r)
            batches.append(fused.sampler.sample(x, check=False))
        return batches

    def _order(self, epoch: int, shuffle: bool) -> torch.Tensor:
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
            while len(self._orders) > 4:
                self._orders.popitem(last=False)
        return order

# ----------------------------------------------------------------------------------------------
# the worker process


class _Trainer:
    """One trainer's connection to this worker."""

    def __init__(self, hello: dict, fd: int) -> None:
        self.name = str(hello["name"])
        self.rank, self.world_size = int(hello["rank"]), int(hello["world_size"])
        self.shuffle = bool(hello["shuffle"])
        self.ring = RingWriter(int(hello["slot_bytes"]), int(hello["slots"]))
        self.ring.add_segment(0, fd)


def _set_parent_death_signal() -> None:
    with contextlib.suppress(Exception):  # Linux only; stdin's end covers the rest
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _send(conn: socket.socket, msg: bytes, lost: list[socket.socket], fds: tuple[int, ...] = ()) -> None:
    try:
        if fds:
            socket.send_fds(conn, [msg], list(fds))
        else:
            conn.send(msg)
    except OSError:  # the trainer went away while we sampled: its connection is dropped after
        if conn not in lost:
            lost.append(conn)


def _answer(maker: BatchMaker, group: list[tuple[socket.socket, _Trainer, Request]]) -> list[socket.socket]:
    """Sample the requests of ``group`` in one pass, each batch straight into the slot its request names,
    and reply to each; the connections that could not be answered (their trainer left)."""
    lost: list[socket.socket] = []
    ok = []
    for conn, trainer, req in group:
        try:
            maker.check(req.epoch, trainer.rank, trainer.world_size, req.step)
            if not trainer.ring.has(req.slot):
                raise ServerError(f"slot {req.slot} is in no segment of the ring this worker was sent")
            ok.append((conn, trainer, req))
        except ServerError as exc:
            _send(conn, Reply(ERROR, req.seq, message=str(exc)).encode(), lost)
    in_slot: set[int] = set()

    def out(i: int, words: int):
        if maker.device != "cpu":
            return None
        dest = ok[i][1].ring.dest(ok[i][2].slot, words)
        if dest is not None:
            in_slot.add(i)
        return dest

    try:
        batches = maker.sample_many([(r.epoch, t.rank, t.world_size, r.step, t.shuffle) for _, t, r in ok], out=out)
    except Exception as exc:  # a bug: send it back rather than leave the trainers waiting
        for conn, _, req in ok:
            _send(conn, Reply(ERROR, req.seq, message=f"internal error on the server: {type(exc).__name__}: "
                                                       f"{exc}").encode(), lost)
        return lost
    done: dict[socket.socket, list[bytes]] = {}  # batches in their slots: one message per trainer
    for i, ((conn, _, req), batch) in enumerate(zip(ok, batches, strict=True)):
        counts = (*batch.num_sampled_nodes, *batch.num_sampled_edges)
        shape = dict(num_nodes=batch.num_nodes, num_edges=batch.num_edges, batch_size=batch.batch_size,
                     counts=counts)
        if batch.n_id.device.type == "cuda":
            from training.serve.device import pack_device_batch

            _send(conn, Reply(DEVICE, req.seq, req.slot, payload=pack_device_batch(batch), **shape).encode(), lost)
        elif i in in_slot:
            done.setdefault(conn, []).append(Reply(OK, req.seq, req.slot, **shape).encode())
        else:  # too big for a slot: its own memfd, sent with the reply
            fd = batch_to_memfd(batch)
            try:
                _send(conn, Reply(OVERSIZE, req.seq, req.slot, **shape).encode(), lost, (fd,))
            finally:
                os.close(fd)
    for conn, replies in done.items():
        _send(conn, b"".join(replies), lost)
    return lost


def serve_worker(cfg: dict) -> int:
    """A worker: open the dataset, listen, answer trainers until stdin closes.

    Requests wait in one queue (every trainer's, in arrival order); each round takes in
    whatever has arrived without waiting, then samples up to ``lanes`` queued requests in
    one pass. The worker sleeps in ``select`` only while the queue is empty.
    """
    from training.data import open_dataset

    _set_parent_death_signal()
    if os.getppid() != cfg["parent"]:  # the server died before the signal was armed
        return 0
    torch.set_num_threads(1)
    device = cfg.get("device", "cpu")
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))  # its context, CSR and batches on its own GPU only
    ds = open_dataset(cfg["dataset"], validate=False)
    params = SamplingParams(int(cfg["batch_size"]), tuple(cfg["fanouts"]), int(cfg["seed"]))
    maker = BatchMaker(ds.indptr, ds.indices, ds.train_idx, params, device,
                       lanes=int(cfg.get("lanes", DEFAULT_LANES)), check=False,  # the server checked
                       compiled=bool(cfg.get("compiled", True)))
    if device == "cpu" and maker.compiled and maker.steps():  # numba's cached kernels load now (~0.5-1 s on a
        maker.sample_many([(0, 0, 1, 0, False)])              # loaded machine), not in a trainer's first request
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(cfg["socket"])
    listener.listen(64)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "listen")
    sel.register(sys.stdin, selectors.EVENT_READ, "control")
    print("ready", flush=True)
    conns: dict[socket.socket, _Trainer | None] = {}
    queue: collections.deque[tuple[socket.socket, _Trainer, Request]] = collections.deque()

    def drop(conn: socket.socket) -> None:
        trainer = conns.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):  # dropped twice: the second is a no-op
            sel.unregister(conn)
        conn.close()
        if trainer is not None:
            trainer.ring.close()

    while True:
        for key, _ in sel.select(0 if queue else None):
            if key.data == "listen":
                conn, _ = listener.accept()
                conns[conn] = None
                sel.register(conn, selectors.EVENT_READ, "trainer")
            elif key.data == "control":
                line = sys.stdin.readline()
                if not line:
                    return 0  # the server is gone
                msg = json.loads(line)
                if msg.get("op") == "drop":
                    for c in [c for c, t in conns.items() if t is not None and t.name == msg["name"]]:
                        drop(c)
            else:
                _take_in(key.fileobj, conns, cfg["token"], drop, queue)
        group = []
        while queue and len(group) < maker.lanes:
            item = queue.popleft()
            if item[0] in conns:  # not from a trainer dropped meanwhile
                group.append(item)
        if group:
            for conn in _answer(maker, group):
                if conn in conns:
                    drop(conn)


def _recv_now(conn: socket.socket, maxfds: int = 4) -> tuple[bytes, list[int]]:
    """One message and the descriptors sent with it, without waiting (BlockingIOError if none). Not
    ``socket.recv_fds``: before Python 3.12 it drops its ``flags``, and the socket stays blocking for
    the replies."""
    fds = array.array("i")
    msg, ancdata, _, _ = conn.recvmsg(MAX_MESSAGE, socket.CMSG_LEN(maxfds * fds.itemsize), socket.MSG_DONTWAIT)
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return msg, list(fds)


def _take_in(conn: socket.socket, conns: dict, token: str, drop, queue: collections.deque) -> None:
    """Read every message waiting on ``conn``: requests join ``queue``, the rest is handled here."""
    while conn in conns:
        try:
            msg, fds = _recv_now(conn)
        except BlockingIOError:
            return
        except OSError:
            msg, fds = b"", []
        trainer = conns.get(conn)
        kind, body = msg[:1], msg[1:]
        try:
            if not msg:  # the trainer left or died: its ring goes with its connection
                drop(conn)
            elif kind == REQUEST and trainer is not None:
                queue.extend((conn, trainer, req) for req in Request.decode_many(body))
            elif kind == SEGMENT and trainer is not None and fds:
                trainer.ring.add_segment(int(json.loads(body)["seg"]), fds.pop())
            elif kind == HELLO and trainer is None and fds:
                hello = json.loads(body)
                if hello.get("token") != token:
                    conn.send(b'{"error": "wrong token: this socket belongs to another server"}')
                    drop(conn)
                else:
                    conns[conn] = _Trainer(hello, fds.pop())
                    conn.send(b'{"ok": true}')
            else:
                drop(conn)  # a protocol error: nothing sensible to answer
        except OSError:  # the trainer went away while we answered
            if conn in conns:
                drop(conn)
        finally:
            for fd in fds:
                os.close(fd)


# ----------------------------------------------------------------------------------------------
# the server's side


class WorkerPool:
    """``count`` worker processes for one server; :meth:`start` returns once all listen."""

    def __init__(self, cfg: dict, sockets: list[str], devices: list[str] | None = None) -> None:
        self.cfg, self.sockets = cfg, sockets
        self.devices = devices if devices is not None else [cfg.get("device", "cpu")] * len(sockets)
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, timeout_s: float) -> None:
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # the workers import this very package
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        try:
            for name, device in zip(self.sockets, self.devices, strict=True):
                cfg = {**self.cfg, "socket": name, "parent": os.getpid(), "device": device}
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "training.serve._worker_main", json.dumps(cfg)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env))
            deadline = time.monotonic() + timeout_s
            for p in self.procs:
                assert p.stdout is not None
                sel = selectors.DefaultSelector()
                sel.register(p.stdout, selectors.EVENT_READ)
                if not sel.select(max(0.0, deadline - time.monotonic())) or p.stdout.readline().strip() != "ready":
                    raise ServerError(f"a sampler worker did not start within {timeout_s:g} s "
                                      f"(exit status {p.poll()}; its error is above)")
        except OSError as exc:
            self.close()
            raise ServerError(f"cannot start sampler workers: {exc.strerror or exc}") from None
        except ServerError:
            self.close()
            raise

    def dead(self) -> list[int]:
        """Indices of workers that exited."""
        return [i for i, p in enumerate(self.procs) if p.poll() is not None]

    def drop(self, name: str) -> None:
        """Close trainer ``name``'s connections (the server forgot it)."""
        for p in self.procs:
            with contextlib.suppress(OSError, ValueError):
                assert p.stdin is not None
                p.stdin.write(json.dumps({"op": "drop", "name": name}) + "\n")
                p.stdin.flush()

    def close(self) -> None:
        for p in self.procs:
            with contextlib.suppress(OSError):
                if p.stdin is not None:
                    p.stdin.close()  # the worker's cue to leave
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stdout is not None:
                with contextlib.suppress(OSError):
                    p.stdout.close()
        self.procs = []

