"""Batches/s and MB/s of trainers fed by ``moment serve`` vs trainers that sample locally (not a test).

    python tools/bench_serve.py [--nodes 200000 --edges 2000000] [--steps 300 --rounds 5] [--lanes 4] [--json PATH]

Generates (once, cached in ``--workdir``) a synthetic power-law graph, then for 1 and 2
trainer processes measures the same batches (same seed, epoch, ranks and steps) two
ways: each trainer samples itself (``LocalBatchSource``, one intra-op thread, as the
server's samplers use), or a ``moment serve`` process with ``--workers`` sampler
processes sends them (``RemoteBatchSource``, its default prefetch unless ``--prefetch``, through the trainers'
shared-memory
rings; ``--transport rpc`` for the copy through rpc instead), each worker sampling up to
``--lanes`` waiting requests in one pass (``--lanes 1``: one at a time). Both sides run one
torch thread per process (a trainer sets it, the sampler and the workers too): neither is
oversubscribed on a small machine, and neither has more threads than the other. Trainers only consume
batches (no model), so this is the sampling path's ceiling: batches/s and MB/s (the batch
tensors' bytes) summed over trainers, and served/local as the ratio. Every figure is the
median of ``--rounds`` rounds (with the range of the ratio over rounds), local and served
alternating so that load from others on a shared machine hits both alike; the load
averages are printed with them. The trainers' start-up (importing torch, joining the rpc
group) is outside the timed loop.

On a machine with few cores the server's workers compete with the trainers for the same
cores: with one trainer the workers sample on every core while local sampling has one;
with as many trainers as cores, local sampling already fills them, and a ratio below 1 is
the cost of the hand-over (requests, replies, wake-ups) less what a worker's pass over
several requests saves. So the CPU time per batch of
every process involved (trainers, server, workers) is printed too: unlike batches/s it
hardly depends on what else runs on the machine.

Three sides, interleaved in every round: ``local`` (the trainer's own sampler, the
compiled one), ``torch`` (a server started with ``--torch-sampler``: its workers' fused
torch passes, the path before) and ``compiled`` (the default server: the compiled
sampler, one request at a time). Per batch, the CPU is split into the trainers' (local:
the sampling; served: requests out, replies in, views of the ring slot), the server
process's and the workers'; the trainers' wall time in the batch source's ``next()``
(sampling, or waiting for a served batch) and after it (touching the batch) is given
too. Then the sampling alone is timed in this process on one thread (no sockets, laid
into a buffer as into a slot): a worker's CPU per batch less that is its hand-off
(receiving requests, slot bookkeeping, replies, wake-ups). A batch laid in a slot is
never serialised or copied: there is no serialisation stage to time. A fresh process's
first compiled batch loads numba's cached kernels (~0.5-1 s): the trainers pay it before
the timed loop, the workers at their start; its time is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _results import Figure, write  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_CPP_LOG_LEVEL": "ERROR"}


def _load() -> str:
    return "load " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def trainer(args: argparse.Namespace) -> int:
    """One trainer process: wait for 'go' on stdin, consume ``--steps`` batches, print JSON."""
    import torch

    from training.batches import LocalBatchSource
    from training.data import open_dataset
    from training.sampler import NeighborSampler
    from training.serve import RemoteBatchSource

    torch.set_num_threads(1)
    fanouts = tuple(int(f) for f in args.fanouts.split(","))
    if args.server:
        src = RemoteBatchSource(
            args.server,
            rank=args.rank,
            world_size=args.world_size,
            batch_size=args.batch_size,
            fanouts=fanouts,
            seed=args.seed,
            prefetch=args.prefetch or None,
            transport=args.transport,
        )
    else:
        ds = open_dataset(args.dataset, validate=False)
        sampler = NeighborSampler(ds.indptr, ds.indices, fanouts, seed=0, num_threads=1)
        src = LocalBatchSource(sampler, ds.train_idx, args.batch_size, rank=args.rank,
                               world_size=args.world_size, seed=args.seed)
    t = time.perf_counter()
    if not args.server:  # a fresh process's first batch loads numba's cached kernels: start-up, as the workers'
        sampler.sample(ds.train_idx[:1], check=False)  # (every batch reseeds the sampler: this draws nothing used)
    print(json.dumps({"ready": True, "first_ms": (time.perf_counter() - t) * 1e3}), flush=True)
    sys.stdin.readline()
    count = nbytes = 0
    wait_s = work_s = 0.0  # in the source's next() (sampling locally, or waiting for a served batch), and after
    t0, c0 = time.perf_counter(), time.process_time()
    epoch = 0
    while count < args.steps:
        it = iter(src.batches(epoch))
        while count < args.steps:
            t = time.perf_counter()
            batch = next(it, None)
            t1 = time.perf_counter()
            wait_s += t1 - t
            if batch is None:
                break
            count += 1
            nbytes += batch.nbytes
            int(batch.edge_index[0, -1:].sum())  # the trainer touches the batch (no model: the ceiling)
            work_s += time.perf_counter() - t1
        epoch += 1
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    src.close()
    print(json.dumps({"batches": count, "bytes": nbytes, "seconds": seconds, "cpu_s": cpu, "wait_s": wait_s,
                      "work_s": work_s}), flush=True)
    return 0


def _tree_cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) used so far by process ``pid`` (the server) and by its children (the
    sampler workers)."""
    tick = os.sysconf("SC_CLK_TCK")
    own = children = 0.0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / tick
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:
            continue
        own, children = (own + cpu, children) if p == pid else (own, children + cpu)
    return own, children


def run_trainers(args, n: int, server: str | None, server_pid: int | None = None) -> dict[str, float]:
    """Start ``n`` trainers, release them together; batches/s and MB/s over the slowest one's time, and per
    batch: the CPU milliseconds of the trainers, the server and its workers, the trainers' wall milliseconds
    in the batch source's ``next()`` and after it."""
    procs = []
    for rank in range(n):
        cmd = [
            sys.executable,
            __file__,
            "--as-trainer",
            "--dataset",
            str(args.dataset_dir),
            "--rank",
            str(rank),
            "--world-size",
            str(n),
            "--steps",
            str(args.steps),
            "--fanouts",
            args.fanouts,
            "--batch-size",
            str(args.batch_size),
            "--seed",
            "1",
            "--transport",
            args.transport,
            "--prefetch",
            str(args.prefetch),
        ] + (["--server", server] if server else [])
        procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV))
    first_ms = 0.0
    for p in procs:
        line = p.stdout.readline()
        if not line.startswith("{"):
            raise SystemExit(f"a trainer failed to start: {line}{p.communicate()[0]}")
        first_ms = max(first_ms, json.loads(line)["first_ms"])
    served0 = _tree_cpu_s(server_pid) if server_pid else (0.0, 0.0)
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    results = [json.loads(p.communicate(timeout=600)[0].strip().splitlines()[-1]) for p in procs]
    served1 = _tree_cpu_s(server_pid) if server_pid else (0.0, 0.0)
    seconds = max(r["seconds"] for r in results)
    batches = sum(r["batches"] for r in results)
    per = 1e3 / batches
    out = {"bps": batches / seconds, "mbps": sum(r["bytes"] for r in results) / seconds / 1e6,
           "trainer_cpu_ms": sum(r["cpu_s"] for r in results) * per, "server_cpu_ms": (served1[0] - served0[0]) * per,
           "worker_cpu_ms": (served1[1] - served0[1]) * per, "next_ms": sum(r["wait_s"] for r in results) * per,
           "touch_ms": sum(r["work_s"] for r in results) * per, "first_ms": first_ms}
    out["cpu_ms"] = out["trainer_cpu_ms"] + out["server_cpu_ms"] + out["worker_cpu_ms"]
    return out


def start_server(args, torch_sampler: bool) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "moment", "serve", "--dataset", str(args.dataset_dir), "--port", "0",
         "--fanouts", args.fanouts, "--batch-size", str(args.batch_size), "--seed", "1",
         "--no-validate", "--lanes", str(args.lanes)]
        + (["--workers", str(args.workers)] if args.workers is not None else [])
        + (["--torch-sampler"] if torch_sampler else []),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV, cwd=REPO)
    for line in proc.stdout:
        m = re.search(r"--server (\S+)", line)
        if m:
            return proc, m.group(1)
    raise SystemExit(f"the server did not start: {proc.communicate()[0]}")


def stage_split(args, world: int) -> dict[str, list[float]]:
    """The sampling stage alone, in this process on one thread, ``--rounds`` interleaved repeats: CPU ms per
    batch of the trainer's local sampler, of a worker's sampling with the compiled sampler (one request at a
    time) and with the torch path's fused passes of ``--lanes`` requests, each laid into a buffer as a worker
    lays it into a ring slot. The same requests: epoch 0, every rank of ``world`` trainers (a batch of
    ``batch_size / world`` seeds each), ``--steps`` of them."""
    import torch

    from training.batches import _mix
    from training.data import open_dataset
    from training.sampler import NeighborSampler
    from training.serve.protocol import SamplingParams
    from training.serve.workers import BatchMaker

    torch.set_num_threads(1)
    ds = open_dataset(args.dataset_dir, validate=False)
    params = SamplingParams(args.batch_size, tuple(int(f) for f in args.fanouts.split(",")), 1)
    makers = {name: BatchMaker(ds.indptr, ds.indices, ds.train_idx, params, lanes=args.lanes, check=False,
                               compiled=compiled) for name, compiled in (("compiled", True), ("torch", False))}
    reqs = [(0, r, world, s, True) for s in range(min(args.steps, makers["torch"].steps())) for r in range(world)]
    reqs = reqs[:args.steps]
    buf = torch.empty(1 << 22, dtype=torch.int64)
    local = NeighborSampler(ds.indptr, ds.indices, params.fanouts, seed=0, num_threads=1)
    seeds = [makers["torch"].seeds(*r[:4]) for r in reqs]

    def run_local() -> None:
        for (e, r, _, s, _), x in zip(reqs, seeds, strict=True):
            local.reseed(_mix(1, e, r, s, 1))
            local.sample(x, check=False)

    def run_maker(maker: BatchMaker) -> None:
        for i in range(0, len(reqs), args.lanes):
            maker.sample_many(reqs[i:i + args.lanes], out=lambda _, words: buf[:words] if words <= buf.numel()
                              else None)

    runs = {"local": run_local, "compiled": lambda: run_maker(makers["compiled"]),
            "torch": lambda: run_maker(makers["torch"])}
    for run in runs.values():  # warm: numba's kernels loaded, the vertex maps allocated
        run()
    out: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            c = time.process_time()
            run()
            out[name].append((time.process_time() - c) / len(reqs) * 1e3)
    return out


SIDES = ("local", "torch", "compiled")  # the trainer samples; served by the torch path's fused passes; compiled


def _med(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def _measure(args, servers: dict[str, tuple[subprocess.Popen, str]]) -> dict[int, dict[str, list[dict]]]:
    """Every side, every trainer count, ``--rounds`` rounds, the sides interleaved within each round."""
    runs: dict[int, dict[str, list[dict]]] = {}
    for n in (1, 2):
        runs[n] = {side: [] for side in SIDES}
        for _ in range(args.rounds):
            for side in SIDES:
                proc, address = servers.get(side, (None, None))
                runs[n][side].append(run_trainers(args, n, address, proc.pid if proc else None))
    return runs


def _report(args, runs, split, load0: str, load1: str) -> list[Figure]:
    print(f"\nfan-out {args.fanouts}, global batch {args.batch_size}, {args.steps} batches per trainer, "
          f"server workers {args.workers or os.cpu_count()}, lanes {args.lanes}, "
          f"prefetch {args.prefetch or 'default'}, transport {args.transport}, {os.cpu_count()} CPUs, "
          f"median of {args.rounds} interleaved rounds, warm (numba kernels cached, graph in page cache); "
          f"{load0} before, {load1} after")
    print(f"{'trainers':>8} {'side':>9} {'b/s':>8} {'MB/s':>8} {'vs local':>9} {'range':>11} | per batch, ms: "
          f"{'CPU all':>8} {'trainer':>8} {'server':>7} {'workers':>8} {'next() wall':>12} {'touch':>6} "
          f"{'CPU/wall':>9}")
    figures = []
    for n, sides in runs.items():
        for side in SIDES:
            rows = sides[side]
            ratios = sorted(r["bps"] / lo["bps"] for r, lo in zip(rows, sides["local"], strict=True))
            busy = statistics.median(r["cpu_ms"] * r["bps"] / 1e3 for r in rows)
            print(f"{n:>8} {side:>9} {_med(rows, 'bps'):>8.1f} {_med(rows, 'mbps'):>8.1f} "
                  f"{_med(rows, 'bps') / _med(sides['local'], 'bps'):>9.2f} {ratios[0]:>5.2f}..{ratios[-1]:<4.2f} | "
                  f"{' ' * 14}{_med(rows, 'cpu_ms'):>8.2f} {_med(rows, 'trainer_cpu_ms'):>8.2f} "
                  f"{_med(rows, 'server_cpu_ms'):>7.2f} {_med(rows, 'worker_cpu_ms'):>8.2f} "
                  f"{_med(rows, 'next_ms'):>12.2f} {_med(rows, 'touch_ms'):>6.3f} {busy:>9.2f}")
            if side == "local":
                continue
            how = "compiled sampler, one request at a time" if side == "compiled" else \
                f"torch path, fused passes of {args.lanes}"
            common = (f"paired ratios {ratios[0]:.2f}..{ratios[-1]:.2f} over {args.rounds} rounds; "
                      f"{load0} before, {load1} after; {os.cpu_count()} CPUs")
            figures.append(Figure("serve", f"{n} trainer(s), served ({how}) vs local, fan-out {args.fanouts}, "
                                  f"batch {args.batch_size}", "batches/s", _med(rows, "bps"),
                                  _med(sides["local"], "bps"), "local sampling in the trainer (compiled)",
                                  target="ratio >= 1.0", note=common))
            figures.append(Figure(
                "serve", f"{n} trainer(s), CPU per batch, all processes, served ({how}) vs local", "ms",
                _med(rows, "cpu_ms"), _med(sides["local"], "cpu_ms"), "local sampling in the trainer (compiled)",
                higher_is_better=False,
                note=f"served: trainer {_med(rows, 'trainer_cpu_ms'):.2f} + server {_med(rows, 'server_cpu_ms'):.2f} "
                     f"+ workers {_med(rows, 'worker_cpu_ms'):.2f} ms; {common}"))
    meds = {n: {k: statistics.median(v) for k, v in sp.items()} for n, sp in split.items()}
    for n, sp in split.items():
        print(f"\nsampling alone, one thread, {args.batch_size // n} seeds, CPU ms per batch (median, range of "
              f"{args.rounds}): " + ", ".join(f"{k} {meds[n][k]:.2f} ({min(v):.2f}..{max(v):.2f})"
                                              for k, v in sp.items()))
    first = statistics.median(r["first_ms"] for sides in runs.values() for r in sides["local"])
    print(f"a fresh trainer's first local batch: {first:.0f} ms (median; numba's cached kernels loading: start-up, "
          "outside the timed loop, as a worker's is at its own start)")
    for n, sides in runs.items():
        med = meds[n]
        for side in ("torch", "compiled"):
            rows = sides[side]
            hand = _med(rows, "worker_cpu_ms") - med[side]
            get = _med(rows, "trainer_cpu_ms")
            print(f"{n} trainer(s), served {side}: worker sampling {med[side]:.2f} + worker hand-off "
                  f"(requests in, slot bookkeeping, replies, wake-ups) {hand:.2f} + server "
                  f"{_med(rows, 'server_cpu_ms'):.2f}"
                  f" + trainer get (requests out, replies, slot views) {get:.2f} ms CPU; local sampling "
                  f"{med['local']:.2f} in the trainer's {_med(sides['local'], 'trainer_cpu_ms'):.2f} ms")
        figures.append(Figure("serve", f"a worker's sampling alone, {args.batch_size // n} seeds, CPU per batch: "
                              f"compiled one at a time vs torch fused passes of {args.lanes}", "ms", med["compiled"],
                              med["torch"], "torch path, fused passes (the workers' sampler before)",
                              higher_is_better=False, note=f"local sampler {med['local']:.2f} ms; median of "
                              f"{args.rounds}; {load0} before"))
    return figures


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=200_000)
    p.add_argument("--edges", type=int, default=2_000_000)
    p.add_argument("--fanouts", default="25,10")
    p.add_argument("--batch-size", type=int, default=1024, help="global seeds per step")
    p.add_argument("--steps", type=int, default=300, help="batches per trainer per round (default 300)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--workers", type=int, help="the server's sampler worker processes (default: one per CPU)")
    p.add_argument("--prefetch", type=int, default=0,
                   help="requests each served trainer keeps in flight (default 0: RemoteBatchSource's default)")
    p.add_argument("--lanes", type=int, default=4,
                   help="requests a server worker samples in one pass at most (default 4; 1: one at a time)")
    p.add_argument("--transport", choices=("auto", "shm", "rpc"), default="auto",
                   help="how served batches travel (default auto: shared memory on one host)")
    p.add_argument("--workdir", default="/tmp/moment-bench-serve")
    p.add_argument("--json", metavar="PATH", help="also write the figures here")
    # trainer role (internal)
    p.add_argument("--as-trainer", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dataset", help=argparse.SUPPRESS)
    p.add_argument("--server", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--world-size", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.as_trainer:
        return trainer(args)

    from training.synth import SynthSpec
    from training.synth_run import synthesize

    args.dataset_dir = Path(args.workdir) / f"g-{args.nodes}-{args.edges}"
    if not args.dataset_dir.exists():
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
        print(f"generating {args.nodes:,} nodes, {args.edges:,} edges in {args.dataset_dir} ...", flush=True)
        synthesize(args.dataset_dir, SynthSpec(num_nodes=args.nodes, num_edges=args.edges, feature_dim=0,
                                               train_share=0.5, seed=1))
    load0 = _load()
    servers = {"torch": start_server(args, True), "compiled": start_server(args, False)}
    try:
        runs = _measure(args, servers)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=30)
    split = {n: stage_split(args, n) for n in (1, 2)}
    load1 = _load()
    figures = _report(args, runs, split, load0, load1)
    write(args.json, "bench_serve", figures, shlex.join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
