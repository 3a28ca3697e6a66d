"""GPU figures and checks (not a test), one isolated step at a time: a first GPU run that cannot be wasted.

    python tools/bench_gpu.py --dir /mnt/nvme0/moment-gpu --out OUT [--json F]   # every step
    python tools/bench_gpu.py --quick --dir D --out OUT      # about 5 minutes on one H200 (docs/benchmarks.md)
    python tools/bench_gpu.py --dry-run-cpu --out OUT        # every step on the CPU: checks the script itself

Every step runs in a process of its own (``--step NAME``) under its own time
limit, so a CUDA fault, a hang or a crash in one loses that step alone; the
steps' records are written to ``OUT/steps.json`` after each step (and the
figures to ``--json`` after each, for ``tools/bench_all.py``), so a run cut
short keeps what it did. A step whose input failed (``data``) is skipped,
said. The steps (``tools/_gpu_steps.py``):

``env``
    versions (Python, torch, CUDA, cuDNN, cupy, nvidia-ml-py, PyG, KvikIO),
    the driver, the GPU and its ``pci_bus_id`` (torch's and NVML's), NVML's raw
    NVLink answers per link, KvikIO's settings and compatibility state, cuFile's
    library and config, the file system of ``--dir`` and whether O_DIRECT opens
    there, the load.
``data``
    a Chung-Lu graph and its placement (GPU, CPU and SSD bins under ``--dir``),
    made once and reused.
``sampling``, ``sampling_valid``
    the sampler on the GPU vs on the CPU (M edges/s); every GPU batch checked by
    :func:`training.samplecheck.sample_problems` (every sampled edge exists,
    counts = min(degree, fan-out), no vertex twice).
``tiers``
    rows of the GPU and CPU tiers into GPU memory: the store vs ``index_select``
    + ``.to(device)``.
``ssd``
    SSD rows into GPU memory, posix vs KvikIO, the bins dropped from the page
    cache before every batch (residency reported), only the gathers timed.
``pipelined``
    back-to-back gathers without waiting, the default stream busy with matrix
    products, every row of every batch compared with the features (posix and KvikIO).
``overlap``
    gathers per second with the default stream busy vs the serialised sum
    (gathers alone + products alone): above 1, the reads overlap compute.
``epoch``
    30 training steps with sampling on the GPU and on the CPU; the loss must fall.
``nodeshare``
    one node-shared host segment, mapped and page-locked by two processes,
    its rows copied up and compared in each.
``ipc``
    ``moment serve --device cuda`` (one worker per GPU) and one trainer taking
    batches by CUDA IPC, every batch checked by the sampling rules.

Without a GPU (and without ``--dry-run-cpu``) it says so, writes the reason
to ``--json`` and exits 0. ``--dry-run-cpu`` runs every step on the CPU with
tiny inputs: its numbers are no GPU figures, and it refuses ``--json``.
Exit status: 0, or 1 when a step failed or rows differed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

#: the steps in order, each with the steps it needs and its time limit in seconds (x ``--time-scale``)
STEPS: dict[str, tuple[tuple[str, ...], float]] = {
    "env": ((), 60), "data": ((), 240), "sampling": (("data",), 90), "sampling_valid": (("data",), 90),
    "tiers": (("data",), 90), "ssd": (("data",), 120), "pipelined": (("data",), 90), "overlap": (("data",), 90),
    "epoch": (("data",), 180), "nodeshare": ((), 60), "ipc": (("data",), 120),
}


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", type=Path, help="work directory, on the SSD to test (default: one under /var/tmp)")
    ap.add_argument("--out", type=Path, help="where steps.json (every step's record) goes (default: --dir)")
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--edges", type=int, default=12_000_000)
    ap.add_argument("--feature-dim", type=int, default=256)
    ap.add_argument("--gpu-share", type=float, default=0.1, help="share of rows in the GPU cache (default 0.1)")
    ap.add_argument("--cpu-share", type=float, default=0.2, help="share of rows in the CPU cache (default 0.2)")
    ap.add_argument("--train-share", type=float, default=0.05)
    ap.add_argument("--gather-batch", type=int, default=100_000, help="rows per gather call")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cpu-threads", type=int, default=8, help="threads of the CPU sampling reference")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--only", default="", help="comma-separated steps to run (their inputs too)")
    ap.add_argument("--skip", default="", help="comma-separated steps to skip")
    ap.add_argument("--time-scale", type=float, default=1.0, help="multiplies every step's time limit")
    ap.add_argument("--quick", action="store_true", help="400k vertices, 4M edges, 3 rounds of 1 s (~5 min)")
    ap.add_argument("--dry-run-cpu", action="store_true",
                    help="check this script without a GPU: tiny inputs on the CPU, no figures written")
    ap.add_argument("--json", type=Path, help="also write the figures here (for tools/bench_all.py)")
    ap.add_argument("--step", help=argparse.SUPPRESS)  # internal: run this one step here
    ap.add_argument("--record", type=Path, help=argparse.SUPPRESS)  # internal: where the step writes its record
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes, args.edges, args.feature_dim, args.rounds, args.seconds = 400_000, 4_000_000, 128, 3, 1.0
        args.gather_batch = min(args.gather_batch, 20_000)
    if args.dry_run_cpu:
        args.nodes, args.edges, args.feature_dim, args.rounds, args.seconds = 5000, 40000, 16, 1, 0.05
        args.gather_batch, args.hidden, args.cpu_threads, args.train_share = 500, 16, 1, 0.3
        args.device = "cpu"
        args.time_scale = max(args.time_scale, 4.0)  # shared CPUs: a slow step is not a hung one
    return args


def _selected(args: argparse.Namespace) -> list[str]:
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    unknown = (only | skip) - set(STEPS)
    if unknown:
        raise SystemExit(f"unknown step(s) {', '.join(sorted(unknown))}: the steps are {', '.join(STEPS)}")
    if only:
        only |= {n for s in only for n in STEPS[s][0]}
    return [s for s in STEPS if (not only or s in only) and s not in skip]


def _child_argv(argv: list[str], step: str, record: Path) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), *argv, "--step", step, "--record", str(record)]


def _run_step(argv: list[str], step: str, limit_s: float, work: Path) -> dict:
    """Run ``step`` in a process of its own; its record, or one saying how it ended."""
    record = work / f".step-{step}.json"
    record.unlink(missing_ok=True)
    t0 = time.perf_counter()
    print(f"=== {step} (limit {limit_s:.0f} s)", flush=True)
    proc = subprocess.Popen(_child_argv(argv, step, record), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    _CURRENT[:] = [proc]
    tail: list[str] = []
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:  # a thread reads the output: the loop below keeps the deadline whatever the step prints
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + limit_s
    timed_out = False
    while True:
        try:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            timed_out = True
            os.killpg(proc.pid, 9)  # its own session: its children (a server's workers) go too
            break
        if line is None:
            break
        print(line, end="", flush=True)
        tail = (tail + [line.rstrip("\n")])[-40:]
    proc.wait()
    _CURRENT.clear()
    seconds = round(time.perf_counter() - t0, 1)
    if record.exists():
        rec = json.loads(record.read_text())
        record.unlink()
    else:
        why = (f"timed out after {limit_s:.0f} s" if timed_out else f"its process ended with status "
               f"{proc.returncode} before writing its record")
        rec = {"name": step, "status": "timeout" if timed_out else "failed", "error": why, "output_tail": tail}
    rec["seconds"] = seconds
    return rec


#: the step process running now: stopped with this one (it runs in a session of its own, so that a timed-out
#: step's children go with it, and would outlive a stopped parent otherwise)
_CURRENT: list[subprocess.Popen] = []


def _on_stop(signum: int, frame: object) -> None:
    for proc in _CURRENT:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, 9)
    raise SystemExit(128 + signum)


def _write_steps(out: Path, steps: list[dict], header: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / ".steps.json.tmp"
    tmp.write_text(json.dumps({**header, "steps": steps}, indent=1, default=str) + "\n")
    os.replace(tmp, out / "steps.json")


def _write_figures(args: argparse.Namespace, steps: list[dict]) -> None:
    from _results import Figure, write

    figures = [Figure(**f) for s in steps for f in s.get("figures", [])]
    bad = [b for s in steps for b in s.get("bad", [])]
    figures.append(Figure("gpu", "gathered rows differing from the in-memory features (every step)", "rows",
                          float(len(bad)), None, "", higher_is_better=False, target="0"))
    write(args.json, "bench_gpu", figures, " ".join(sys.argv))


def orchestrate(args: argparse.Namespace, argv: list[str]) -> int:
    import tempfile

    work = args.dir or Path(tempfile.mkdtemp(prefix="moment-gpu-", dir="/var/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    out = args.out or work
    if args.dir is None:
        argv = [*argv, "--dir", str(work)]
    header = {"command": " ".join(sys.argv), "dry_run_cpu": bool(args.dry_run_cpu),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "dir": str(work)}
    if args.dry_run_cpu:
        print("DRY RUN on the CPU: checks that the script runs; no figure below is a GPU figure")
    steps: list[dict] = []
    status: dict[str, str] = {}
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_stop)
    for step in _selected(args):
        needs, limit = STEPS[step]
        missing = [n for n in needs if status.get(n, "not run") != "ok"]
        if missing:
            rec = {"name": step, "status": "skipped", "error": f"needs {', '.join(missing)}, which did not succeed"}
            print(f"=== {step}: skipped ({rec['error']})", flush=True)
        else:
            rec = _run_step(argv, step, limit * args.time_scale, work)
        status[step] = rec["status"]
        steps.append(rec)
        _write_steps(out, steps, header)
        if not args.dry_run_cpu:
            _write_figures(args, steps)
    print("\n=== summary")
    for s in steps:
        print(f"{s['name']:>15}: {s['status']:<8} {s.get('seconds', 0):>6} s  {s.get('error') or ''}".rstrip())
    for s in steps:
        for b in s.get("bad", []):
            print(f"ROWS DIFFER ({s['name']}): {b}")
    print(f"records: {out / 'steps.json'}")
    failed = [s for s in steps if s["status"] not in ("ok", "skipped")] + [s for s in steps if s.get("bad")]
    return 1 if failed else 0


def run_one(args: argparse.Namespace) -> int:
    """Child mode: run ``args.step`` and write its record (also when it raised)."""
    import traceback

    import _gpu_steps

    rec: dict = {"name": args.step, "status": "ok", "figures": [], "bad": [], "notes": [], "values": {}}
    try:
        if os.environ.get("MOMENT_BENCH_GPU_FAIL") == args.step:  # tests: one step fails, the others must not care
            raise RuntimeError(f"failure injected into step {args.step} (MOMENT_BENCH_GPU_FAIL)")
        getattr(_gpu_steps, f"step_{args.step}")(args, rec)
    except Exception as exc:  # noqa: BLE001 - recorded: the other steps go on
        rec["status"] = "failed"
        rec["error"] = f"{type(exc).__name__}: {exc}"
        rec["traceback"] = traceback.format_exc()[-4000:]
        print(rec["traceback"], flush=True)
    args.record.write_text(json.dumps(rec, indent=1, default=str) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    if args.step:
        return run_one(args)
    if args.dry_run_cpu and args.json:
        print("--dry-run-cpu measures nothing about GPUs: it writes no --json", file=sys.stderr)
        return 2
    if not args.dry_run_cpu:
        import torch

        if not torch.cuda.is_available():
            from _results import write

            why = "no CUDA device here (torch.cuda.is_available() is False): nothing measured"
            print(f"{why}. Run this on a machine with an NVIDIA GPU and PyTorch built for CUDA "
                  "(--dry-run-cpu checks the script itself).")
            write(args.json, "bench_gpu", [], " ".join(sys.argv), skipped=why)
            return 0
    return orchestrate(args, argv)


if __name__ == "__main__":
    sys.exit(main())
