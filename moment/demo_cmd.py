"""``moment demo``: plan → data → place → train → report on a bundled default, each step a real command.

The demo is the five commands a user would type, run in this process one
after the other, each announced with its command line and why it is there,
so what the demo shows is exactly what the commands do (nothing is staged
for it). Defaults: the bundled Machine B spec (the paper's cascaded-switch
server: 4 GPUs, 8 NVMe SSDs), a skewed Chung–Lu graph made on the spot, and
one epoch of GraphSAGE on this machine's CPU with its features read from
the SSD tier of the placement. Everything goes under ``--out``; nothing
outside it is touched: an earlier demo there is replaced (running it twice
just works), a directory holding anything else is refused.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import sys
import time
from pathlib import Path

from moment._args import examples
from moment.errors import CommandError
from training.vocab import MODEL_NAMES


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "demo", help="plan -> place -> train one epoch on a bundled default (Machine B, a synthetic graph)",
        description=__doc__.split("\n\n")[1],
        **examples("moment demo                               # about a minute on 2 CPU cores",
                   "moment demo --out /var/tmp/demo           # somewhere else (an earlier demo there is replaced)",
                   "moment demo --machine moment-a --nodes 50000"))
    p.add_argument("--out", default="moment-demo", metavar="DIR",
                   help="where the plan picture, dataset, placement and metrics go (default ./moment-demo)")
    p.add_argument("--machine", default="moment-b", metavar="NAME|FILE",
                   help="machine to plan for (default moment-b, the paper's Machine B)")
    p.add_argument("--nodes", default="200000", metavar="N", help="graph nodes (default 200000)")
    p.add_argument("--edges", default="2000000", metavar="M", help="graph edges (default 2000000)")
    p.add_argument("--feature-dim", default="128", metavar="F", help="feature width, float32 (default 128)")
    p.add_argument("--model", default="sage", choices=MODEL_NAMES, help="GNN (default sage)")
    p.add_argument("--epochs", default="2", metavar="E", help="training epochs (default 2)")
    # an earlier demo is replaced without it now; still accepted, so that scripts that pass it keep working
    p.add_argument("--force", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def _steps(args: argparse.Namespace, out: Path, n_gpus: int, n_ssds: int) -> list[tuple[str, str, list[str]]]:
    """(title, why, argv) of each step."""
    nodes, dim = int(float(args.nodes)), int(args.feature_dim)
    row = dim * 4
    # caches sized so that the features are several times what the caches hold: the SSD
    # tier serves real traffic and the placement matters
    gpu_rows, cpu_rows = nodes // 50, nodes // 20
    ssds = [a for i in range(n_ssds) for a in ("--ssd", str(out / f"ssd{i}"))]
    return [
        ("1. plan the layout",
         f"Where should {n_gpus} GPUs and {n_ssds} NVMe SSDs go in {args.machine}'s slots? Every distinct layout "
         "is scored by a flow model; the table names the links that limit each one.",
         ["plan", "--machine", args.machine, "--top", "3", "--svg", str(out / "plan.svg")]),
        ("2. make a graph",
         f"A skewed power-law graph (Chung-Lu) with {nodes:,} nodes and learnable labels: a few vertices are "
         "read far more often than others, which is what makes placement matter.",
         ["data", "synth", str(out / "graph"), "--nodes", str(args.nodes), "--edges", str(args.edges),
          "--generator", "chung-lu", "--feature-dim", str(dim), "--undirected", "--train-share", "0.05",
          "--seed", "1", "--quiet"]),
        ("3. place the features",
         "Pre-sample to count how often each vertex's row is read, then DDAK puts the hottest rows in the GPU "
         "cache, the next in host memory and the rest on the SSDs so that each bin's traffic matches what the "
         "plan's flow model says the layout can deliver. Hash placement is shown beside it.",
         ["place", "--dataset", str(out / "graph"), "--machine", args.machine,
          "--gpu-cache", str(gpu_rows * row), "--cpu-cache", str(cpu_rows * row), *ssds,
          "--fanouts", "25,10", "--batch-size", "1000", "--out", str(out / "placement")]),
        ("4. measure the disk",
         "Random 4 KiB reads (O_DIRECT, 64 in flight) where the SSD bins are, and host memory bandwidth: the "
         "rates that the training run's prediction uses (on a real server: every NVMe drive, and the figures "
         "go into `moment plan --capacities` too).",
         ["profile", "--ssd", str(out / "ssd0"), "--seconds", "2", "--file-size", "256MiB",
          "--out", str(out / "capacities.yaml")]),
        ("5. train",
         f"{args.model.upper()} with fan-outs 25,10, features gathered through the tiered store (the "
         "'gpu' bin lives in host memory on this machine: there is no GPU here), the next batches sampled "
         "and gathered while the current one trains. At the end: each tier's reads as the placement and the "
         "measured rates predicted them, against what the run measured.",
         ["train", "--dataset", str(out / "graph"), "--placement", str(out / "placement"),
          "--model", args.model, "--fanouts", "25,10", "--batch-size", "1000", "--epochs", str(args.epochs),
          "--metrics", str(out / "metrics.jsonl"), "--capacities", str(out / "capacities.yaml")]),
        ("6. report",
         "Where the time of each epoch went (compute, all-reduce, waiting for I/O; sampling and gathering run "
         "ahead in the background) and how the reads split over the tiers and bins against the plan's targets, "
         "as pictures.",
         ["report", str(out / "metrics.jsonl"), "--out", str(out / "report")]),
    ]


def _is_demo_entry(name: str) -> bool:
    """What ``moment demo`` writes in its directory (and nothing else is removed by ``--force``)."""
    return (name in ("graph", "placement", "plan.svg", "metrics.jsonl", "capacities.yaml", "report")
            or re.fullmatch(r"ssd\d+", name) is not None)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.rule import Rule

    from moment._args import load_topology
    from planner.plan import choose_inventory

    for name in ("nodes", "edges", "feature_dim", "epochs"):  # before anything is touched
        try:
            if float(getattr(args, name)) < 1:
                raise ValueError
        except ValueError:
            raise CommandError(
                f"--{name.replace('_', '-')} {getattr(args, name)}: expected a positive number"
            ) from None
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CommandError(f"--out {out}: exists and is not a directory")
    topo, _ = load_topology(argparse.Namespace(machine=args.machine))  # as `moment plan --machine` loads it
    _, inventory = choose_inventory(topo, spec=args.machine)
    console = Console(highlight=False, emoji=False)
    # an earlier demo is replaced (running the README's command twice just works); anything else is refused
    earlier = sorted(out.iterdir()) if out.exists() else []
    foreign = [p.name for p in earlier if not _is_demo_entry(p.name)]
    if foreign:
        raise CommandError(f"--out {out}: not empty: holds {', '.join(foreign[:3])}, which the demo did not write; "
                           "choose another directory (the demo replaces only an earlier demo)")
    if earlier:
        console.print(f"[dim]replacing the earlier demo in {out}[/dim]")
    for p in earlier:  # only what the demo writes
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CommandError(f"--out {out}: cannot create the directory ({exc.strerror or exc})") from None
    # one SSD bin directory per SSD the plan places (on a real server: one per drive)
    n_ssds = sum(count for model, count in inventory.items if model.kind == "nvme")
    n_gpus = sum(count for model, count in inventory.items if model.kind == "gpu")
    for i in range(n_ssds):
        (out / f"ssd{i}").mkdir(exist_ok=True)
    started = time.perf_counter()
    for title, why, argv in _steps(args, out, n_gpus, n_ssds):
        console.print(Rule(f"[bold]{title}[/bold]", align="left"))
        console.print(why, style="dim")
        console.print(f"[bold]$ moment {shlex.join(argv)}[/bold]")
        sys.stdout.flush()
        t = time.perf_counter()
        code = args.cli_main(argv)  # moment.cli.main, handed over by the parser (no import cycle)
        if code != 0:
            console.print(f"[red]step failed (exit {code}); the demo stops here. Everything so far is in {out}.[/red]")
            return code
        console.print(f"[dim]({time.perf_counter() - t:.1f} s)[/dim]\n")
    console.print(Rule("[bold]done[/bold]", align="left"))
    console.print(f"{time.perf_counter() - started:.0f} s in all. In {out}: plan.svg (the recommended layout and "
                  "its flows; bottleneck links in red), graph/ (the dataset), placement/ (bins, place.json with "
                  "the placement report), metrics.jsonl (per step and per epoch), report/ (report.png and report.svg: "
                  "time split and reads per tier and bin against the targets). The SSD bins are in "
                  f"{out}/ssd*/: on a real server each would be a different NVMe drive.")
    return 0
