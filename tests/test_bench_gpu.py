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
def test_dry_run_goes_through_every_step_and_one_failure_loses_nothing_else(tmp_path):
    """Every step runs (in a process of its own) on the CPU; a step that fails is recorded and the others still
    run and are written to steps.json; the steps that need data are skipped, said, when it fails."""
    import os

    from tools.bench_gpu import STEPS

    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "bench_gpu.py"), "--dry-run-cpu", "--dir",
                           str(tmp_path / "w"), "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=900, env={"PYTHONPATH": str(REPO), "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                            "MOMENT_BENCH_GPU_FAIL": "tiers"})
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]  # the injected failure is reported
    steps = {s["name"]: s for s in json.loads((out / "steps.json").read_text())["steps"]}
    assert list(steps) == list(STEPS)
    assert steps["tiers"]["status"] == "failed" and "injected" in steps["tiers"]["error"]
    assert {n: s["status"] for n, s in steps.items() if n != "tiers"} == {n: "ok" for n in STEPS if n != "tiers"}
    assert not any(s.get("bad") for s in steps.values())
    for step, needle in (("sampling_valid", "valid"), ("pipelined", "every row compared"), ("epoch", "falling"),
                         ("ipc", "checked by the sampling rules"), ("ssd", "page cache dropped")):
        assert any(needle in line for line in steps[step]["lines"]), step
    assert "DRY RUN" in proc.stdout and "MISMATCH" not in proc.stdout
    env = steps["env"]["values"]
    assert env["torch"] == torch.__version__ and "o_direct_opens" in env["dir"]

    proc = subprocess.run([sys.executable, str(REPO / "tools" / "bench_gpu.py"), "--dry-run-cpu", "--dir",
                           str(tmp_path / "w2"), "--out", str(out), "--only", "sampling"], cwd=REPO,
                          capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(REPO), "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                               "MOMENT_BENCH_GPU_FAIL": "data"})
    steps = {s["name"]: s for s in json.loads((out / "steps.json").read_text())["steps"]}
    assert proc.returncode == 1 and steps["data"]["status"] == "failed"
    assert steps["sampling"]["status"] == "skipped" and "needs data" in steps["sampling"]["error"]
