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
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.readline()
    count = nbytes = 0
    t0, c0 = time.perf_counter(), os.times()
    epoch = 0
    while count < args.steps:
        for batch in src.batches(epoch):
            count += 1
            nbytes += batch.nbytes
            if count == args.steps:
                break
        epoch += 1
    seconds, c1 = time.perf_counter() - t0, os.times()
    src.close()
    cpu = c1.user - c0.user + c1.system - c0.system
    print(json.dumps({"batches": count, "bytes": nbytes, "seconds": seconds, "cpu_s": cpu}), flush=True)
    return 0


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by process ``pid`` and its children (the sampler workers)."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:
            continue
    return total


def run_trainers(args, n: int, server: str | None, server_pid: int | None = None) -> tuple[float, float, float]:
    """Start ``n`` trainers, release them together; (batches/s, MB/s) over the slowest one's time, and the
    CPU milliseconds per batch of the trainers plus (served) the server and its workers."""
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
    for p in procs:
        line = p.stdout.readline()
        if not line.startswith("{"):
            raise SystemExit(f"a trainer failed to start: {line}{p.communicate()[0]}")
    served0 = _tree_cpu_s(server_pid) if server_pid else 0.0
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    results = [json.loads(p.communicate(timeout=600)[0].strip().splitlines()[-1]) for p in procs]
    served_cpu = _tree_cpu_s(server_pid) - served0 if server_pid else 0.0
    seconds = max(r["seconds"] for r in results)
    batches = sum(r["batches"] for r in results)
    cpu_ms = (sum(r["cpu_s"] for r in results) + served_cpu) / batches * 1e3
    return batches / seconds, sum(r["bytes"] for r in results) / seconds / 1e6, cpu_ms


def start_server(args) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "moment", "serve", "--dataset", str(args.dataset_dir), "--port", "0",
         "--fanouts", args.fanouts, "--batch-size", str(args.batch_size), "--seed", "1",
         "--no-validate", "--lanes", str(args.lanes)]
        + (["--workers", str(args.workers)] if args.workers is not None else []),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV, cwd=REPO)
    for line in proc.stdout:
        m = re.search(r"--server (\S+)", line)
        if m:
            return proc, m.group(1)
    raise SystemExit(f"the server did not start: {proc.communicate()[0]}")


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
    server, address = start_server(args)
    rows = []
    load0 = _load()
    try:
        for n in (1, 2):
            local, served = [], []
            for _ in range(args.rounds):
                local.append(run_trainers(args, n, None))
                served.append(run_trainers(args, n, address, server.pid))
            lb, lm = (statistics.median(x[i] for x in local) for i in (0, 1))
            sb, sm = (statistics.median(x[i] for x in served) for i in (0, 1))
            ratios = sorted(s[0] / lo[0] for s, lo in zip(served, local, strict=True))
            cpu = (statistics.median(x[2] for x in local), statistics.median(x[2] for x in served))
            rows.append((n, lb, lm, sb, sm, ratios, cpu))
    finally:
        server.terminate()
        server.wait(timeout=30)
    load1 = _load()
    print(
        f"\nfan-out {args.fanouts}, global batch {args.batch_size}, {args.steps} batches per trainer, "
        f"server workers {args.workers or os.cpu_count()}, lanes {args.lanes}, "
        f"prefetch {args.prefetch or 'default'}, transport {args.transport}, {os.cpu_count()} CPUs, "
        f"median of {args.rounds} rounds; {load0} before, {load1} after"
    )
    print(f"{'trainers':>8} {'local b/s':>10} {'local MB/s':>11} {'served b/s':>11} {'served MB/s':>12} "
          f"{'served/local':>13} {'range':>12} {'CPU ms/batch local, served':>27}")
    figures = []
    for n, lb, lm, sb, sm, ratios, cpu in rows:
        print(f"{n:>8} {lb:>10.1f} {lm:>11.1f} {sb:>11.1f} {sm:>12.1f} {sb / lb:>13.2f} "
              f"{ratios[0]:>5.2f}..{ratios[-1]:.2f} {cpu[0]:>18.2f}, {cpu[1]:.2f}")
        figures.append(
            Figure(
                "serve",
                f"{n} trainer(s), fan-out {args.fanouts}, batch {args.batch_size}",
                "batches/s",
                sb,
                lb,
                "local sampling in the trainer",
                target="ratio >= 1.0",
                note=f"served {sm:.1f} MB/s vs local {lm:.1f} MB/s; CPU per batch (all processes) "
                f"served {cpu[1]:.2f} ms vs local {cpu[0]:.2f} ms; server workers "
                f"{args.workers or os.cpu_count()}, lanes {args.lanes}, "
                f"prefetch {args.prefetch or 'default'}; paired ratios "
                f"{ratios[0]:.2f}..{ratios[-1]:.2f} over {args.rounds} rounds; {load0} before, "
                f"{load1} after",
            )
        )
    write(args.json, "bench_serve", figures, shlex.join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
