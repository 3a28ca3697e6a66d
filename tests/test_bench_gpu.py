"""tools/bench_gpu.py: exits cleanly without a GPU; its dry run on the CPU goes through every step."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "tools" / "bench_gpu.py"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, env={"PYTHONPATH": str(REPO),
                                                                                "PATH": "/usr/bin:/bin"})


def test_without_a_gpu_it_says_so_and_writes_no_figures(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "g.json"
    proc = _run("--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "no CUDA device here" in proc.stdout
    data = json.loads(out.read_text())
    assert data["figures"] == [] and "no CUDA device" in data["skipped"] and data["machine"]["gpu"] is None
    assert _run("--dry-run-cpu", "--json", str(out)).returncode == 2  # a dry run writes no figures


@pytest.mark.slow
def test_dry_run_goes_through_every_step(tmp_path):
    proc = _run("--dry-run-cpu", "--dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for step in ("sampling", "gather, gpu tier", "gather, cpu tier", "SSD rows into GPU memory", "epoch (placement)",
                 "epoch (memory)"):
        assert step in proc.stdout, step
    assert "MISMATCH" not in proc.stdout and proc.stdout.count("rows ok") == 4
