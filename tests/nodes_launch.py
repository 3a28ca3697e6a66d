"""Start "nodes" on localhost for the multi-node tests: process groups with torchrun's environment.

Each node is ``local_size`` processes with ``GROUP_RANK`` = its number, ``RANK``
= ``node * local_size + local_rank``, one ``MASTER_ADDR:MASTER_PORT`` (a c10d
TCP store on localhost): what ``torchrun --nnodes N --node-rank k`` gives its
workers, without the agents (faster, and a test can kill a node's processes).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from tests.conftest import REPO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(argv_per_node: Sequence[Sequence[str]], *, local_size: int = 1, logs: Path,
           env: dict[str, str] | None = None) -> list[list[subprocess.Popen]]:
    """``python -m moment <argv>`` on every rank of every node; their output goes to ``logs/n<k>r<l>.txt``."""
    port = free_port()
    n = len(argv_per_node)
    procs = []
    logs.mkdir(parents=True, exist_ok=True)
    for k, argv in enumerate(argv_per_node):
        node = []
        for lr in range(local_size):
            e = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(port), "WORLD_SIZE": str(n * local_size), "RANK": str(k * local_size + lr),
                 "LOCAL_RANK": str(lr), "LOCAL_WORLD_SIZE": str(local_size), "GROUP_RANK": str(k),
                 **(env or {})}
            with open(logs / f"n{k}r{lr}.txt", "w") as out:
                node.append(subprocess.Popen([sys.executable, "-m", "moment", *argv], cwd=REPO, env=e,
                                             stdout=out, stderr=subprocess.STDOUT))
        procs.append(node)
    return procs


def wait_all(procs: list[list[subprocess.Popen]], timeout: float = 240) -> list[list[int]]:
    """Every process's exit code (killing the rest if ``timeout`` passes)."""
    codes = []
    try:
        for node in procs:
            codes.append([p.wait(timeout=timeout) for p in node])
    finally:
        for node in procs:
            for p in node:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    return codes


def log(logs: Path, node: int, local_rank: int = 0) -> str:
    return (logs / f"n{node}r{local_rank}.txt").read_text()


def kill_mid_run(argv: Sequence[str], metrics: Path, logs: Path, steps: int = 25) -> str:
    """Two nodes of ``argv``; node 1 killed (SIGKILL) once ``metrics`` holds ``steps`` step records.

    Returns node 0's last line of output, after checking that it stopped with exit code 2.
    """
    import json
    import signal
    import time

    procs = launch([argv, argv], logs=logs)
    deadline = time.time() + 120

    def done() -> int:
        return sum(json.loads(x)["kind"] == "step" for x in metrics.read_text().splitlines()) if metrics.exists() else 0

    while done() < steps:
        assert time.time() < deadline and procs[0][0].poll() is None, log(logs, 0)[-2000:]
        time.sleep(0.05)
    procs[1][0].send_signal(signal.SIGKILL)
    assert procs[0][0].wait(timeout=60) == 2, log(logs, 0)[-2000:]
    wait_all(procs)
    return log(logs, 0).strip().splitlines()[-1]
