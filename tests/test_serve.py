"""The sampling server (training.serve, `moment serve`): same batches as local sampling, failures.

Server and trainers run in subprocesses (torch allows one rpc agent per process); the
trainer stand-in is tests/serve_client.py. Ports are picked by the server (``--port 0``)
and read from its first lines.
"""

from __future__ import annotations

import contextlib
import doctest
import importlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from training import serve
from training.batches import LocalBatchSource
from training.sampler import NeighborSampler, SamplerError
from training.serve import (
    RemoteBatchSource,
    SamplingParams,
    SamplingServer,
    ServerError,
    parse_address,
)
from training.synth import SynthSpec
from training.synth_run import synthesize

REPO = Path(__file__).resolve().parents[1]
CLIENT = REPO / "tests" / "serve_client.py"
PARAMS = ["--fanouts", "10,5", "--batch-size", "256", "--seed", "3"]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_CPP_LOG_LEVEL": "ERROR"}


@pytest.fixture(scope="module")
def graph(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("serve") / "g"
    synthesize(path, SynthSpec(num_nodes=4000, num_edges=40000, feature_dim=4, train_share=0.5, seed=5))
    return path


class Server:
    """`moment serve` in a subprocess; ``address`` read from its output."""

    def __init__(self, dataset: Path, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moment", "serve", "--dataset", str(dataset), "--port", "0",
             "--trainer-timeout", "5", *PARAMS, *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV, cwd=REPO)
        self.lines: list[str] = []
        self.address = None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            m = re.search(r"--server (\S+)", line)
            if m:
                self.address = m.group(1)
                break
        assert self.address, "server did not start:\n" + "\n".join(self.lines)

    def finish(self, timeout: float = 60) -> str:
        out, _ = self.proc.communicate(timeout=timeout)
        self.lines += out.splitlines()
        return "\n".join(self.lines)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def client(address: str, dataset: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    """A trainer stand-in; ``env`` given: its stderr is kept (``proc.stderr``)."""
    return subprocess.Popen([sys.executable, str(CLIENT), address, str(dataset), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL if env is None else subprocess.PIPE,
                            text=True, env=env or ENV)


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (the server's sampler workers)."""
    with contextlib.suppress(OSError):
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return []


def ring_maps(pid: int) -> int:
    """How many mappings of a trainer's ring (``memfd:moment-ring``) process ``pid`` holds; -1 if it is gone."""
    try:
        return Path(f"/proc/{pid}/maps").read_text().count("memfd:moment-ring")
    except OSError:
        return -1


def wait_for(check, what: str, timeout: float = 30.0) -> None:
    """Poll ``check()`` until true; a hang guard, not a timing assert."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"still waiting for {what} after {timeout:g} s"
        time.sleep(0.1)


def records(proc: subprocess.Popen, timeout: float = 90) -> list[dict]:
    out, err = proc.communicate(timeout=timeout)  # a hang guard, not a timing assert
    proc.stderr_text = err or ""
    return [json.loads(x) for x in out.splitlines() if x.startswith("{")]


def read_until(proc: subprocess.Popen, event: str, count: int = 1) -> list[dict]:
    seen = []
    for line in proc.stdout:
        if line.startswith("{"):
            seen.append(json.loads(line))
            if sum(r["event"] == event for r in seen) >= count or seen[-1]["event"] in ("error", "done"):
                break
    return seen


def listening_addresses(pid: int) -> list[str]:
    """Local addresses of the TCP sockets process ``pid`` listens on (from /proc; IPv6 as hex)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            link = os.readlink(fd)
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    out = []
    for table in ("tcp", "tcp6"):
        for row in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            f = row.split()
            if f[3] == "0A" and f[9] in inodes:  # 0A: LISTEN
                ip = f[1].split(":")[0]
                out.append(socket.inet_ntoa(bytes.fromhex(ip)[::-1]) if table == "tcp" else ip)
    return out


# -- in process: no rpc -----------------------------------------------------------------------------


@pytest.mark.parametrize("module", ["__init__", "protocol", "ring", "workers", "device"])
def test_docstring_examples(module):
    mod = serve if module == "__init__" else importlib.import_module(f"training.serve.{module}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


def test_server_samples_exactly_what_local_sampling_does(graph):
    server = SamplingServer(graph, SamplingParams(batch_size=300, fanouts=(10, 5), seed=11), threads=1)
    ds = server.dataset
    for world in (1, 3):
        for rank in range(world):
            local = LocalBatchSource(NeighborSampler(ds.indptr, ds.indices, (10, 5)), ds.train_idx, 300,
                                     rank=rank, world_size=world, seed=11)
            for epoch in (0, 4):
                start = 2
                ours = [server.sample(epoch, rank, world, s) for s in range(start, local.steps(epoch))]
                theirs = list(local.batches(epoch, start))
                assert len(ours) == len(theirs) > 0
                for a, b in zip(ours, theirs, strict=True):
                    assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
                    assert a.num_sampled_edges == b.num_sampled_edges


def test_server_refuses_bad_inputs(graph, tmp_path):
    from training.writer import DatasetWriter

    with DatasetWriter(tmp_path / "nosplit", num_nodes=3) as w:
        w.write_csr(np.array([0, 1, 2, 2]), np.array([1, 0], dtype=np.int32))
    with pytest.raises(ServerError, match="no train_idx"):
        SamplingServer(tmp_path / "nosplit", SamplingParams(16, (2,)))
    with pytest.raises(SamplerError, match="fanouts"):
        SamplingServer(graph, SamplingParams(16, (0,)))
    server = SamplingServer(graph, SamplingParams(batch_size=300, fanouts=(10, 5)), threads=1)
    with pytest.raises(ServerError, match="step 99"):
        server.sample(0, 0, 1, 99)
    with pytest.raises(ServerError, match="rank 2"):
        server.sample(0, 2, 2, 0)


def test_addresses_and_parameter_messages():
    assert parse_address("localhost:1234") == ("localhost", 1234)
    for bad in ("localhost", "host:port", ":80", "h:70000", ""):
        with pytest.raises(ServerError, match="HOST:PORT"):
            parse_address(bad)
    diff = SamplingParams(1024, (25, 10), 0).mismatches(SamplingParams(512, (25, 10), 1))
    assert diff == ["batch_size 1024 (server) vs 512 (trainer)", "seed 0 (server) vs 1 (trainer)"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_nothing_listening_and_bad_address_fail_fast_and_clearly():
    kw = dict(rank=0, world_size=1, batch_size=8, fanouts=(2,), seed=0, timeout_s=5)
    with pytest.raises(ServerError, match="nothing listens there.*moment serve"):
        RemoteBatchSource(f"127.0.0.1:{_free_port()}", **kw)
    with pytest.raises(ServerError, match="cannot resolve"):
        RemoteBatchSource("no-such-host.invalid:29600", **kw)
    with pytest.raises(ServerError, match="HOST:PORT"):
        RemoteBatchSource("127.0.0.1", **kw)
    with pytest.raises(ServerError, match="rank 3 is outside"):
        RemoteBatchSource("127.0.0.1:1", **{**kw, "rank": 3})


def test_cli_refuses_a_missing_dataset(tmp_path, capsys):
    from moment.cli import main

    assert main(["serve", "--dataset", str(tmp_path / "none"), "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("moment serve: error:") and "no such dataset directory" in err and "\n" not in err


# -- subprocesses ---------------------------------------------------------------------------------


def test_a_trainer_gets_its_local_batches_from_the_server_and_mismatches_are_refused(graph):
    """The trainer is this process (one torch start-up less than a client subprocess)."""
    from training.data import open_dataset

    server = Server(graph, "--max-trainers", "2")
    try:
        listening = listening_addresses(server.proc.pid)
        assert listening and set(listening) == {"127.0.0.1"}, listening  # the store and TensorPipe
        with pytest.raises(ServerError, match=r"parameters differ: seed 3 \(server\) vs 4 \(trainer\)"):
            RemoteBatchSource(server.address, rank=0, world_size=2, batch_size=256, fanouts=(10, 5), seed=4)
        ds = open_dataset(graph)
        local = LocalBatchSource(NeighborSampler(ds.indptr, ds.indices, (10, 5)), ds.train_idx, 256,
                                 rank=1, world_size=2, seed=3)
        with RemoteBatchSource(server.address, rank=1, world_size=2, batch_size=256, fanouts=(10, 5), seed=3,
                               prefetch=2) as remote:
            assert remote.transport == "shm"  # same host: the workers' shared-memory path
            assert remote.steps(0) == local.steps(0) > 2
            for epoch, start in ((0, 2), (1, 0)):
                # holding every batch of the epoch: the ring grows instead of waiting for a slot
                pairs = list(zip(remote.batches(epoch, start), local.batches(epoch, start), strict=True))
                assert len(pairs) == local.steps(epoch) - start
                for a, b in pairs:
                    assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
                    assert (a.batch_size, a.num_sampled_nodes) == (b.batch_size, b.num_sampled_nodes)
                    assert a.num_sampled_edges == b.num_sampled_edges
            ring = remote._feed.ring
            assert ring.num_segments > 1
            # an epoch left early abandons its prefetched requests; with every slot held or
            # abandoned, the next epoch is still served whole
            it = remote.batches(2)
            first = next(it)
            it.close()
            got = list(remote.batches(3))
            want = list(local.batches(3))
            assert len(got) == len(want) and all(torch.equal(x.n_id, y.n_id) for x, y in zip(got, want, strict=True))
            # every slot comes back once its batch's tensors are gone
            remote._feed.poll()
            del pairs, a, b, first, got, want
            assert ring.free_slots() == ring.num_segments * ring.slots
        with pytest.raises(ServerError, match="closed"):
            next(remote.batches(0))
        # a process can open a source again (rejoining under its first id), here with the batches
        # copied through rpc, the path of a trainer on another host
        with RemoteBatchSource(server.address, rank=1, world_size=2, batch_size=256, fanouts=(10, 5),
                               seed=3, transport="rpc") as again:
            assert again.name == remote.name and again.transport == "rpc"
            for a, b in zip(again.batches(3), local.batches(3), strict=True):
                assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
        log = server.finish()
    finally:
        server.kill()
    assert server.proc.returncode == 0, log
    assert re.search(r"trainer\d+ \(rank 1/2, pid \d+ on .*\) connected", log), log
    assert re.search(r" disconnected: \d+ batches, [\d.]+ MB served", log), log
    assert "stopping: 2 trainer(s) served" in log


@pytest.mark.heavy  # a server and two trainer processes (~15 s)
@pytest.mark.parametrize("lanes", ["4", "1"])  # requests sampled together in one pass, or one at a time
def test_two_trainers_at_once_get_their_local_batches(graph, lanes):
    server = Server(graph, "--max-trainers", "2", "--lanes", lanes)
    try:
        # the parameter check runs before joining: this one never counts as a trainer (first:
        # once the two real trainers have come and gone the server exits, by --max-trainers)
        odd = records(client(server.address, graph, "--fanouts", "25,10"))
        assert odd[-1]["type"] == "ServerError", odd
        assert "fanouts 10,5 (server) vs 25,10 (trainer)" in odd[-1]["message"]
        a = client(server.address, graph, "--rank", "0", "--world-size", "2", "--start-step", "1")
        b = client(server.address, graph, "--rank", "1", "--world-size", "2")
        for proc, skipped in ((a, 1), (b, 0)):
            got = records(proc)
            assert len(got) >= 2, (got, server.finish())
            joined, *_, last = got
            assert last["event"] == "done", last
            assert last["batches"] == 2 * (joined["steps"] - skipped) and last["equal"] == last["batches"]
        log = server.finish()
    finally:
        server.kill()
    assert server.proc.returncode == 0, log
    assert log.count(" connected") == 2 and log.count(" disconnected") == 2
    assert "rank 0/2" in log and "rank 1/2" in log and "stopping: 2 trainer(s) served" in log


@pytest.mark.heavy  # waits out ping timeouts of killed processes: timing-sensitive under load (~20 s)
def test_killed_trainer_spares_the_others_and_killed_server_gives_a_clear_error(graph):
    server = Server(graph)
    try:
        victim = client(server.address, graph, "--rank", "0", "--world-size", "2", "--mode", "slow",
                        "--epochs", "100", "--delay", "0.2")
        survivor = client(server.address, graph, "--rank", "1", "--world-size", "2", "--mode", "slow",
                          "--epochs", "3", "--delay", "0.2")
        assert read_until(victim, "step", 2)[-1]["event"] == "step"
        first = read_until(survivor, "step", 1)
        assert first[-1]["event"] == "step"
        assert first[0]["transport"] == "shm"
        workers = children(server.proc.pid)
        assert len(workers) >= 1 and all(ring_maps(w) == 2 for w in workers), [ring_maps(w) for w in workers]
        # one job per server: a second rank 1, or another world size, is refused by the server
        for args, why in ((("--rank", "1", "--world-size", "2"), "rank 1 is already fed to trainer"),
                          (("--rank", "0", "--world-size", "3"), "feeds a world of 2 trainers")):
            refused = records(client(server.address, graph, *args))[-1]
            assert refused["type"] == "ServerError" and "refused this trainer" in refused["message"], refused
            assert why in refused["message"], refused
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        done = records(survivor)
        assert done[-1] == {"event": "done", "batches": 3 * first[0]["steps"]}, done[-1]
        # the killed trainer's ring went with its sockets, the one that left with its goodbye
        wait_for(lambda: all(ring_maps(w) == 0 for w in workers), "the workers to drop the trainers' rings")
        # the dead trainer was dropped from the group: a newcomer can still join, even
        # for the dead one's rank
        # without TORCH_CPP_LOG_LEVEL, as a user runs it: torch's C++ warnings must stay quiet
        quiet = {k: v for k, v in ENV.items() if k != "TORCH_CPP_LOG_LEVEL"}
        late = client(server.address, graph, "--rank", "0", "--world-size", "2", "--mode", "slow",
                      "--epochs", "100", "--delay", "0.1", "--prefetch", "8", env=quiet)
        assert read_until(late, "step", 3)[-1]["event"] == "step"
        workers = children(server.proc.pid)
        assert workers and all(ring_maps(w) > 0 for w in workers)  # the late trainer's ring, lent to each
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait()
        killed_at = time.monotonic()
        end = records(late, timeout=60)
        waited = time.monotonic() - killed_at
        assert end[-1]["event"] == "error" and end[-1]["type"] == "ServerError", end[-1]
        assert server.address in end[-1]["message"] and "moment serve" in end[-1]["message"]
        assert late.returncode == 3
        # it had up to 8 batches prefetched; still it reports the death at once, not after them
        assert sum(r["event"] == "step" for r in end) <= 1, end
        stderr = late.stderr_text
        assert "tensorpipe" not in stderr.lower() and "[W" not in stderr, stderr
        # the workers die with their server: no process keeps shared memory
        wait_for(lambda: all(ring_maps(w) == -1 for w in workers), "the sampler workers to exit")
        print(f"trainer stopped {waited:.1f} s after the server was killed "
              f"({end[-1]['seconds_since_last_batch']} s after its last batch)")
    finally:
        server.kill()
    log = "\n".join(server.lines + server.proc.stdout.read().splitlines())
    assert " lost" in log, log


@pytest.mark.heavy  # torchrun with a server and two trainer processes (~18 s)
def test_torchrun_two_trainers_train_from_the_server(graph, tmp_path):
    """The real commands: `moment serve`, then a 2-rank `torchrun ... moment train --server`."""
    server = Server(graph)
    metrics = tmp_path / "m.jsonl"
    try:
        run = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
             "-m", "moment", "train", "--dataset", str(graph), "--server", server.address, *PARAMS,
             "--epochs", "2", "--hidden", "16", "--metrics", str(metrics)],
            capture_output=True, text=True, env=ENV, cwd=REPO, timeout=240)
        assert run.returncode == 0, run.stderr[-3000:]
        server.proc.send_signal(signal.SIGTERM)
        log = server.finish()
    finally:
        server.kill()
    assert "rank 0/2" in log and "rank 1/2" in log and "stopping (signal)" in log
    assert "deferred" not in log  # both trainers left without a membership stall
    epochs = [r for r in map(json.loads, metrics.read_text().splitlines()) if r["kind"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [0, 1]
    assert all(r["param_spread"] == 0 for r in epochs)  # the ranks stayed identical
    assert epochs[1]["loss"] < epochs[0]["loss"]


# -- the shared-memory pieces, in process -------------------------------------------------------


def test_worker_answers_into_the_ring_or_a_memfd_when_a_batch_is_too_big(graph):
    """A worker's reply over a real socket pair: in the slot, or (too big) in a memfd sent with the reply."""
    from training.data import open_dataset
    from training.serve.protocol import OK, OVERSIZE, Reply, Request
    from training.serve.ring import BatchRing, batch_from_memfd
    from training.serve.workers import BatchMaker, _answer, _Trainer

    ds = open_dataset(graph)
    params = SamplingParams(256, (10, 5), 3)
    maker = BatchMaker(ds.indptr, ds.indices, ds.train_idx, params)
    local = list(LocalBatchSource(NeighborSampler(ds.indptr, ds.indices, (10, 5)), ds.train_idx, 256, seed=3)
                 .batches(0))
    worker_end, trainer_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for slot_bytes, kind in ((64 << 20, OK), (4096, OVERSIZE)):
        ring = BatchRing(slot_bytes, 2)
        _, fd = ring.add_segment()
        trainer = _Trainer({"name": "t", "rank": 0, "world_size": 1, "shuffle": True, "slot_bytes": slot_bytes,
                            "slots": 2}, os.dup(fd))
        slot = ring.take()
        assert _answer(maker, [(worker_end, trainer, Request(seq=1, slot=slot, epoch=0, step=1))]) == []
        msg, fds, _, _ = socket.recv_fds(trainer_end, 1 << 16, 1)
        reply = Reply.decode(msg, layers=2)
        assert reply.kind == kind and reply.seq == 1
        shape = dict(num_nodes=reply.num_nodes, num_edges=reply.num_edges, batch_size=reply.batch_size,
                     counts=reply.counts)
        got = ring.batch(slot, **shape) if kind == OK else batch_from_memfd(fds[0], **shape)
        want = local[1]
        assert torch.equal(got.n_id, want.n_id) and torch.equal(got.edge_index, want.edge_index)
        assert (got.num_sampled_nodes, got.num_sampled_edges) == (want.num_sampled_nodes, want.num_sampled_edges)
        del got
        trainer.ring.close()
        ring.close()
    # a step outside the epoch comes back as an error reply, not a dead worker
    _answer(maker, [(worker_end, trainer, Request(seq=2, slot=0, epoch=0, step=999))])
    reply = Reply.decode(trainer_end.recv(1 << 16), layers=2)
    assert reply.message.startswith("step 999 is outside")
    worker_end.close()
    trainer_end.close()


@pytest.mark.parametrize("lanes,compiled", [(3, False), (1, False), (3, True)])
def test_worker_samples_two_trainers_requests_in_one_pass_into_their_rings(graph, lanes, compiled):
    """One pass over requests of two trainers (one message each, as a trainer sends a chunk): every
    batch lands in the slot asked for and equals the trainer's local batch; a bad request in the pass
    gets its own error reply and spares the others. The torch path fuses the pass; the compiled sampler
    (the default) samples its requests one at a time, the same batches."""
    from training.data import open_dataset
    from training.serve.protocol import ERROR, OK, Reply, Request
    from training.serve.ring import BatchRing
    from training.serve.workers import BatchMaker, _answer, _Trainer

    ds = open_dataset(graph)
    maker = BatchMaker(ds.indptr, ds.indices, ds.train_idx, SamplingParams(256, (10, 5), 3), lanes=lanes,
                       compiled=compiled)
    assert maker.lanes == lanes
    chunk = Request.decode_many(Request(1, 0, 0, 2).encode() + Request(2, 1, 0, 3).encode())
    assert chunk == [Request(1, 0, 0, 2), Request(2, 1, 0, 3)]
    group, ends, rings = [], [], []
    for rank in range(2):
        worker_end, trainer_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ring = BatchRing(64 << 20, 3)
        _, fd = ring.add_segment()
        trainer = _Trainer({"name": f"t{rank}", "rank": rank, "world_size": 2, "shuffle": True,
                            "slot_bytes": 64 << 20, "slots": 3}, os.dup(fd))
        group += [(worker_end, trainer, Request(10 * rank + i, slot=ring.take(), epoch=1, step=i)) for i in range(2)]
        ends.append((worker_end, trainer_end, trainer))
        rings.append(ring)
    group.append((ends[0][0], ends[0][2], Request(99, slot=ring.take(), epoch=1, step=10**6)))  # out of range
    assert _answer(maker, group) == []
    for rank, (worker_end, trainer_end, trainer) in enumerate(ends):
        local = list(LocalBatchSource(NeighborSampler(ds.indptr, ds.indices, (10, 5)), ds.train_idx, 256,
                                      rank=rank, world_size=2, seed=3).batches(1))
        if rank == 0:  # the bad request is answered first, before the pass samples
            error = Reply.decode(trainer_end.recv(1 << 16), layers=2)
            assert error.kind == ERROR and error.seq == 99 and "step 1000000 is outside" in error.message
        replies = Reply.decode_many(trainer_end.recv(1 << 16), layers=2)  # the pass's batches: one message
        for i, reply in enumerate(replies):
            assert reply.kind == OK and reply.seq == 10 * rank + i
            got = rings[rank].batch(reply.slot, num_nodes=reply.num_nodes, num_edges=reply.num_edges,
                                    batch_size=reply.batch_size, counts=reply.counts)
            assert torch.equal(got.n_id, local[i].n_id) and torch.equal(got.edge_index, local[i].edge_index)
            del got
        trainer.ring.close()
        worker_end.close()
        trainer_end.close()
    for ring in rings:
        ring.close()


def test_slot_bound_holds_every_batch(graph):
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from training.data import open_dataset
    from training.serve.protocol import slot_bytes_bound
    from training.serve.ring import batch_nbytes

    ds = open_dataset(graph)
    indptr, indices = torch.from_numpy(np.asarray(ds.indptr)), torch.from_numpy(np.asarray(ds.indices))
    max_degree = int((indptr[1:] - indptr[:-1]).max())

    @settings(max_examples=25, deadline=None)
    @given(fanouts=st.lists(st.sampled_from([-1, 1, 3, 10]), min_size=1, max_size=3),
           batch=st.integers(1, 300), world=st.integers(1, 3), seed=st.integers(0, 9))
    def check(fanouts, batch, world, seed):
        params = SamplingParams(batch, tuple(fanouts), seed)
        bound = slot_bytes_bound(params, world, ds.num_nodes, int(indptr[-1]), max_degree)
        sampler = NeighborSampler(indptr, indices, tuple(fanouts), seed=seed)
        seeds = torch.from_numpy(np.asarray(ds.train_idx[:-(-batch // world)], dtype=np.int64))
        assert batch_nbytes(sampler.sample(seeds)) <= bound

    check()


def test_cuda_handover_is_refused_without_cuda(graph):
    from training.serve.device import device_handover_available, pack_device_batch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the refusal does not apply")
    assert device_handover_available("cuda") == "CUDA is not available on this machine"
    with pytest.raises(ServerError, match="device cuda: CUDA is not available"):
        SamplingServer(graph, SamplingParams(16, (2,)), device="cuda")
    b = NeighborSampler(torch.tensor([0, 1, 1]), torch.tensor([1]), (1,)).sample(torch.tensor([0]))
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        pack_device_batch(b)
