"""Run the ``moment`` command from a benchmark (not imported by the packages).

Every benchmark that drives the command line (to make a graph, place it, train
on it) runs it the same way: ``python -m moment ARGS`` in a source tree, with
that tree on ``PYTHONPATH`` so that the tree's code is what runs, optionally
under ``torch.distributed.run``; a failed step ends the benchmark with the
command and the tail of its stderr.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

#: the tree this file is in: the code a benchmark measures unless it names another
REPO = Path(__file__).resolve().parents[1]


def moment(*args: str, tree: Path = REPO, ranks: int = 1, omp_threads: str | None = None,
           stderr_tail: int = 3000) -> str:
    """Run ``moment ARGS`` in ``tree``; return its stdout, or exit with the command and its stderr tail.

    Parameters
    ----------
    args : str
        The command's arguments, e.g. ``("data", "synth", "g", "--nodes", "1000")``.
    tree : Path
        The source tree to run (the working directory and ``PYTHONPATH``).
    ranks : int
        More than 1: that many processes under ``torch.distributed.run --standalone``.
    omp_threads : str or None
        ``OMP_NUM_THREADS`` for the command unless the caller's environment sets it;
        ``None`` leaves the environment as it is.
    stderr_tail : int
        Characters of stderr shown when the command fails.
    """
    cmd = [sys.executable, "-m", "moment", *args]
    if ranks > 1:
        cmd[1:1] = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    env = dict(os.environ, PYTHONPATH=str(tree))
    if omp_threads is not None:
        env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", omp_threads)
    proc = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"failed ({tree}): {' '.join(cmd)}\n{proc.stderr[-stderr_tail:]}")
    return proc.stdout


def skewed_graph(dataset: Path, nodes: int, edges: int, train_share: str = "0.05") -> Path:
    """``dataset``, made once by ``moment data synth`` (Chung-Lu, undirected, 1024-wide rows, seed 3) unless
    it holds a dataset already: the skewed graph the SSD-bound benchmarks train on."""
    if not (dataset / "meta.json").exists():
        print("making the graph", flush=True)
        moment("data", "synth", str(dataset), "--nodes", str(nodes), "--edges", str(edges),
               "--generator", "chung-lu", "--undirected", "--feature-dim", "1024", "--train-share",
               str(train_share), "--seed", "3", "--quiet")
    return dataset


def small_graphs(d: Path) -> tuple[Path, Path]:
    """``(Cora, the demo graph)`` under ``d``, each made once: Cora imported from the fixtures, the demo graph
    a 100,000-vertex Chung-Lu graph of 128-wide rows (seed 1): the graphs the cross-socket figures place."""
    cora = d / "cora"
    if not (cora / "meta.json").exists():
        moment("data", "import", "--format", "planetoid", str(REPO.parent / "shared/fixtures/graphs/cora"), str(cora))
    demo = d / "demo-graph"
    if not (demo / "meta.json").exists():
        moment("data", "synth", str(demo), "--nodes", "100000", "--edges", "1000000", "--generator", "chung-lu",
               "--feature-dim", "128", "--undirected", "--train-share", "0.05", "--seed", "1", "--quiet")
    return cora, demo
