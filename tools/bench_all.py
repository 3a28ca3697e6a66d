"""Run every benchmark of the project and write one table: ours, the reference measured in the same run, the ratio.

    python tools/bench_all.py [--quick] [--only plan,io,...] [--out docs/benchmarks.md]

Each benchmark runs as its own process (its own peak memory, its own failures) with
``--json`` and writes its figures (``tools/_results.py``); this script collects them into
``docs/benchmarks.md`` (Markdown, with the machine it came from and each command) and
``docs/benchmarks.json``. A ratio above 1 always means ours is better (for times and
memory the ratio is reference / ours). A benchmark that fails or whose reference cannot run
here is listed with the reason, never dropped silently. ``--quick`` shrinks the inputs so
the whole suite takes minutes instead of about an hour; the figures the issues ask for
come from the full sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import machine  # noqa: E402

#: name -> (script, full-size arguments, quick arguments)
BENCHES: dict[str, tuple[str, list[str], list[str]]] = {
    "plan": ("bench_plan.py", ["--repeats", "5"], ["--repeats", "1"]),
    "io": ("bench_io.py", ["--runs", "10", "--seconds", "3"],
           ["--runs", "4", "--seconds", "2", "--vertices", "100000"]),
    "import": ("bench_import.py", ["--edges", "1e7", "--nodes", "1e6"], ["--edges", "2e6", "--nodes", "2e5"]),
    "sample": ("bench_sample.py", [], ["--nodes", "300000", "--edges", "3000000", "--rounds", "3"]),
    "ddak": ("bench_ddak.py", [], ["--items", "10000000"]),
    "accuracy": ("bench_accuracy.py", [], ["--seeds", "1", "--epochs", "100"]),
    # Cora link prediction beside PyG's examples/link_pred.py and the published GAE AUC
    "link": ("bench_link.py", ["--seeds", "3"], ["--seeds", "1", "--epochs", "30"]),
    # the edge split read in chunks beside the in-memory split: peak memory per CSR edge, equal output
    "split_edges": ("bench_split_edges.py", ["--edges", "1e7", "3e7"], ["--edges", "1e6"]),
    "train": ("bench_train.py", [], ["--quick"]),
    # the epoch's last prefetch steps with the prefetch threads held until close() vs ended with their batches
    "prefetch_tail": ("bench_prefetch_tail.py", ["--repeat", "3"], ["--repeat", "1", "--epochs", "2"]),
    "serve": ("bench_serve.py", [], ["--nodes", "50000", "--edges", "500000", "--rounds", "1", "--steps", "10"]),
    "gpu": ("bench_gpu.py", [], ["--quick"]),
    "integrity": ("bench_integrity.py", ["--nodes", "1e6", "--repeats", "5"], ["--nodes", "2e5", "--repeats", "2"]),
    "bin_integrity": ("bench_bin_integrity.py", ["--repeats", "7"], ["--rows", "8192", "--repeats", "2"]),
    "multinode": ("bench_multinode.py", [], ["--quick"]),
    # replica groups' whole jobs at N = 4, W = 1, 2, 4: seeds/s, remote share, bytes per step beside hot-row replication
    "multinode_groups": ("bench_multinode.py", ["--replica-groups", "1,2,4", "--batch-size", "250"],
                         ["--quick", "--replica-groups", "1,2,4"]),
    # the graph partitioned over 2 nodes (moment data partition, train --partition) vs one node with all of it
    "multinode_partitioned": ("bench_multinode.py", ["--partitioned"], ["--partitioned", "--quick"]),
    # METIS vs streaming LDG, partition vs hash/random ownership; the scale runs measure the writer's memory
    "partition": ("bench_partition.py", ["--scale-edges", "1e6", "1e7"], ["--quick", "--scale-edges", "1e6"]),
    # ownership by the partitions vs hash with and without the halo cache: remote share per step, memory per node,
    # moment plan --nodes's predicted exchange beside the measured one
    "partition_place": ("bench_partition_place.py", [], ["--quick"]),
    # the graph partitioned over 2 ranks (spawned gloo processes) against one process holding all of it
    "distsample": ("bench_distsample.py", [], ["--quick"]),
    "train_dgl": ("bench_train_dgl.py", ["--rounds", "5"],
                  ["--rounds", "1", "--nodes", "50000", "--edges", "500000"]),
    "emulate": ("bench_emulate.py", ["--rounds", "3"], ["--rounds", "1", "--skip", "dlio"]),
    "loop": ("bench_loop.py", ["--rounds", "3", "--one-ssd", "--gpu-cache"],
             ["--rounds", "1", "--nodes", "30000", "--edges", "300000", "--one-ssd", "--gpu-cache"]),
    # the same SSD-bound run as found and beside a busy process per core: plain vs contention-adjusted error
    "contention": ("bench_contention.py", ["--rounds", "3"], ["--rounds", "1"]),
    "precision": ("bench_precision.py", [], ["--quick"]),
    # Machine A's layouts (a)-(d): socket-aware DDAK, and DDAK with every GPU alike, against hash (paper Fig. 17)
    "sockets": ("bench_sockets.py", [], []),
    # training's reads on a socket-aware placement: each socket's ranks on their part, measured against place.json
    "sockets_train": ("bench_sockets.py", ["--train", "--gpus", "2,4"], ["--train", "--epochs", "2"]),
    # --precision bf16-mixed / 16-mixed against float32: accuracy and seeds/s on Cora, Amazon Photo, a synthetic graph
    "mixed_precision": ("bench_mixed_precision.py", [], ["--quick"]),
    "dyncache": ("bench_dyncache.py", ["--repeats", "3"],
                 ["--nodes", "50000", "--batches", "10", "--window", "5000", "--shift", "2500", "--repeats", "1"]),
    # the remote-row cache of a sharded run filling on access vs its static fill, in-process nodes, drifting hot set
    "dyncache_remote": ("bench_dyncache_remote.py", ["--repeats", "3"],
                        ["--parts", "2", "--nodes", "20000", "--batches", "5", "--window", "3000", "--shift", "1500",
                         "--epochs", "4", "--repeats", "1"]),
    # re-placement between epochs against static DDAK on a drifting hot set: cache share, seeds/s, rows moved
    "replace": ("bench_replace.py", ["--repeats", "3"], ["--nodes", "30000", "--batches", "10", "--repeats", "1"]),
    # the same inside the trainer: moment train's --replace-every 1 (the move in the background) against static DDAK
    "replace_train": ("bench_replace.py", ["--train", "--batches", "60", "--repeats", "3"],
                      ["--train", "--nodes", "30000", "--batches", "20", "--window", "6000", "--shift", "1500",
                       "--epochs", "4", "--repeats", "1", "--hidden", "16"]),
    # replica groups (DDStore's width) at N = 4, W = 1, 2, 4: memory per node and remote share vs hot-row replication
    "replica_groups": ("bench_replica_groups.py", ["--seeds", "3"], ["--nodes-graph", "20000", "--edges", "200000",
                                                                    "--seeds", "1"]),
    # heterogeneous rows: DDAK sized by each type's row bytes vs rows padded to the widest type (synth_mag, moment-b)
    "hetero_place": ("bench_hetero_place.py", ["--repeats", "5"], ["--papers", "20000", "--repeats", "2"]),
    # heterogeneous training: seeds/s at 2 torchrun ranks vs 1 process, the same global batch (synth_mag, CPU, gloo)
    "hetero_train": ("bench_hetero_train.py", ["--papers", "100000", "--repeats", "3"],
                     ["--papers", "2000", "--batch-size", "256", "--epochs", "2", "--repeats", "1"]),
    "startup": ("bench_startup.py", ["--repeats", "15"], ["--repeats", "5"]),
    # the step alone, flat all-reduce and DDP interleaved (the whole run against an old tree: --reference)
    "ddp": ("bench_ddp.py", ["--exchange", "--steps", "150"], ["--exchange", "--steps", "40"]),
    # the size needs ~50 GB free on --ooc-dir (the features are written once)
    "outofcore": ("bench_outofcore.py", ["--features-gib", "48"], []),
    # papers100M's shape end to end: ~40 GB free on /var/tmp/billion and about 90 minutes on 2 cores
    "billion": ("bench_billion.py", ["--resume"], ["--nodes", "1e6", "--edges", "1.5e7", "--small-edges", "1e6",
                                                   "--steps", "10"]),
    # against the code before the bucketed builder: give it --ref-tree (a checkout of 9ca259c), so run by hand
    "synth_memory": ("bench_synth_memory.py", ["--nodes", "1e6", "--edges", "1e7", "4e7"],
                     ["--nodes", "1e5", "--edges", "1e6", "4e6"]),
    # the store's gathers against another checkout (a refactor's cost): give it --ref DIR, so run by hand
    "gather_ab": ("bench_gather_ab.py", ["--rounds", "9", "--seconds", "3"], ["--rounds", "2", "--seconds", "1"]),
    # layer-wise inference: ours vs the in-memory full-graph forward, and under a cgroup below the features (root)
    "infer": ("bench_infer.py", ["--rounds", "3"], ["--rounds", "1", "--nodes", "250000", "--edges", "1250000",
                                                    "--small-nodes", "5000", "--small-edges", "25000"]),
    # a CSR on the SSD under a memory limit below its size (root: a cgroup); the dataset is made by hand
    # 8 SSDs emulated by throttled loop devices on this disk (root, loop devices, cgroup v1 blkio): DDAK vs hash
    "emulated_ssds": ("bench_emulated_ssds.py", ["--rounds", "3"],
                      ["--rounds", "1", "--count", "3", "--slow", "2", "--size", "512MiB", "--nodes", "10000",
                       "--edges", "100000"]),
    "csr_ssd": ("bench_csr_ssd.py", ["--dataset", "/var/tmp/ssdcsr/g2e8", "--rounds", "5", "--memory-limit", "512MiB"],
                ["--dataset", "/var/tmp/ssdcsr/g2e8", "--rounds", "1", "--memory-limit", "512MiB"]),
}


def run_one(name: str, quick: bool, extra: dict[str, list[str]], timeout_s: float) -> dict:
    script, full, small = BENCHES[name]
    path = REPO / "tools" / script
    if not path.exists():
        return {"bench": name, "error": f"tools/{script} does not exist yet", "figures": []}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        cmd = [sys.executable, str(path), *(small if quick else full), *extra.get(name, []), "--json", str(out)]
        t = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"bench": name, "error": f"no result within {timeout_s:.0f} s", "figures": [],
                    "command": " ".join(cmd[1:])}
        seconds = time.perf_counter() - t
        log = REPO / "tools" / ".bench-logs"
        log.mkdir(exist_ok=True)
        (log / f"{name}.txt").write_text(proc.stdout + ("\n--- stderr ---\n" + proc.stderr if proc.stderr else ""))
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            return {"bench": name, "error": f"exit {proc.returncode}: {tail[0][:200]}", "figures": [],
                    "command": " ".join(cmd[1:-2]), "seconds": seconds}
        data = json.loads(out.read_text())
        data.update(command=" ".join(["python", *[str(Path(c).relative_to(REPO)) if c.startswith(str(REPO)) else c
                                                  for c in cmd[1:-2]]]), seconds=seconds)
        return data


def _fmt(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:,.3g}" if abs(x) < 1000 else f"{x:,.0f}"


def _gpu_sentence(results: list[dict]) -> str:
    """Which figures came from a GPU, and which one (the machine each result was measured on)."""
    gpus = sorted({f"{r['bench']} on {r['machine']['gpu']} ({r['machine'].get('host', '?')})" for r in results
                   if (r.get("machine") or {}).get("gpu") and r.get("figures")})
    if not gpus:
        return "No figure below comes from a GPU: they are CPU and disk figures (no GPU path has run on one yet)."
    return "GPU figures: " + "; ".join(gpus) + ". Every other figure is a CPU or disk figure."


#: the device tool's command for tools/bench_gpu.py (with ``carry: [".whl"]``, ``timeout_s: 540``)
GPU_RUN_COMMAND = ("python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "
                   ".whl/*.whl && export PYTHONPATH=/tmp/site || exit; export PYTHONUNBUFFERED=1; "
                   "timeout -s TERM 450 python3 tools/bench_gpu.py --quick --dir /tmp/moment-gpu --out $OUT "
                   "--json $OUT/bench_gpu.json > $OUT/log 2>&1; echo \"exit $?\"; tail -c 8000 $OUT/log")

#: how to run tools/bench_gpu.py on the project's device machine (kept here: this page is generated)
FIRST_GPU_RUN = f"""
## A first GPU run

The project's device machine (one H200; torch 2.11 with CUDA 13, cupy, nvidia-ml-py, cuFile and PyG, but
no KvikIO and no network; 15 minutes of device time per task, 10 per command) runs `tools/bench_gpu.py`
in one command of about 5 minutes. Each step runs in a process of its own under a time limit and is
written to `$OUT/steps.json` as it ends, so a run cut short keeps what it did.

Once, here: `sh tools/fetch_kvikio_wheels.sh` (KvikIO 26.6 for CUDA 13 and Python 3.12, with
libkvikio and rapids-logger, 3.1 MB, into `.whl/`, which git ignores). Then the device tool's `run`
with `carry: [".whl"]`, `timeout_s: 540` and the command

```
{GPU_RUN_COMMAND}
```

`$OUT/steps.json` holds every step's record (the environment record first), `$OUT/bench_gpu.json` the
figures for `python tools/bench_all.py --use gpu=FILE`, `$OUT/log` the whole output. Without the wheels
the KvikIO halves of `ssd`, `pipelined` and `overlap` are said not measured and the rest runs. Not run
yet: no task so far has been lent a GPU.
"""


def markdown(results: list[dict], quick: bool) -> str:
    m = machine()
    lines = ["# Benchmarks", "",
             f"Assembled by `python tools/bench_all.py{' --quick' if quick else ''}` on {m['date']} from the "
             f"latest run of each benchmark (dates below); host {m['host']}, {m['cpus']} CPUs, "
             f"Python {m['python']}, {m['platform']}.",
             "", "A ratio above 1 means ours is better (for times and memory: reference / ours). Every reference "
             "was measured in the same run as ours, on the same machine. "
             + _gpu_sentence(results), "",
             "| bench | figure | unit | ours | reference | ratio | target | note |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r.get("error") or r.get("skipped"):
            lines.append(f"| {r['bench']} | **not measured**: {r.get('error') or r['skipped']} | | | | | | |")
            continue
        for f in r["figures"]:
            ratio = "–" if f["ratio"] is None else f"{f['ratio']:.2f}×"
            ref = _fmt(f["reference"]) + (f" ({f['reference_name']})" if f["reference_name"] else "")
            lines.append(f"| {r['bench']} | {f['figure']} | {f['unit']} | {_fmt(f['ours'])} | {ref} | {ratio} | "
                         f"{f['target']} | {f['note']} |")
    lines += ["", "Commands (each run as its own process; full output in `tools/.bench-logs/`):", ""]
    lines += [f"- {r['bench']}: `{r.get('command', '')}`" + (f" ({r['seconds']:.0f} s" if "seconds" in r else " (")
              + f", {r.get('when') or r.get('machine', {}).get('date', '?')})" for r in results]
    return "\n".join(lines) + "\n" + FIRST_GPU_RUN


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small inputs: minutes, not an hour")
    ap.add_argument("--only", help=f"comma-separated subset of {','.join(BENCHES)}")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks.md",
                    help="Markdown table (a .json beside it gets the raw figures)")
    ap.add_argument("--dgl-venv", help="DGL reference environment for the sampler benchmark")
    ap.add_argument("--io-dir", default="/var/tmp/moment-io", help="directory on the SSD for the I/O benchmark")
    ap.add_argument("--ooc-dir", default="/var/tmp/moment-ooc", help="directory on the SSD for the out-of-core one")
    ap.add_argument("--timeout", type=float, default=3600, help="per benchmark, seconds")
    ap.add_argument("--use", action="append", default=[], metavar="NAME=FILE",
                    help="take benchmark NAME's figures from FILE (its --json of a run already made) instead of "
                         "running it again")
    args = ap.parse_args()
    used = {}
    for item in args.use:
        name, _, path = item.partition("=")
        if name not in BENCHES or not path:
            print(f"--use {item}: expected NAME=FILE with NAME one of {', '.join(BENCHES)}", file=sys.stderr)
            return 2
        used[name] = json.loads(Path(path).read_text())
    names = list(BENCHES) if not args.only else [n.strip() for n in args.only.split(",")]
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        print(f"--only: unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHES)}", file=sys.stderr)
        return 2
    extra = {"io": ["--dir", args.io_dir], "outofcore": ["--dir", args.ooc_dir]}
    if args.dgl_venv:
        extra["sample"] = ["--dgl-venv", args.dgl_venv]
        extra["train_dgl"] = ["--dgl-venv", args.dgl_venv]
    results = []
    for n in names:
        if n in used:
            r = {"seconds": 0.0, **used[n]}
            results.append({**r, "bench": n, "when": r.get("machine", {}).get("date", "")})
            continue
        print(f"running {n} ...", file=sys.stderr, flush=True)
        r = run_one(n, args.quick, extra, args.timeout)
        print(f"  {n}: " + (r["error"] if r.get("error") else f"{len(r['figures'])} figures, {r['seconds']:.0f} s"),
              file=sys.stderr, flush=True)
        r["bench"] = n  # the short name, whatever the script calls itself
        r["when"] = machine()["date"]
        results.append(r)
    js = args.out.with_suffix(".json")
    if args.only and js.exists():  # keep the other benchmarks' latest figures
        try:
            earlier = json.loads(js.read_text())["results"]
        except (ValueError, KeyError, OSError):
            earlier = []
        for r in earlier:
            r["bench"] = r["bench"].removeprefix("bench_")
        fresh = {r["bench"] for r in results}
        order = list(BENCHES)
        results = sorted([r for r in earlier if r["bench"] not in fresh] + results,
                         key=lambda r: order.index(r["bench"]) if r["bench"] in order else len(order))
    text = markdown(results, args.quick)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(f".{args.out.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, args.out)
    js.write_text(json.dumps({"quick": args.quick, "machine": machine(), "results": results}, indent=1) + "\n")
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
