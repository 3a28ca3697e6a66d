"""tools/_results.py: every benchmark's ``--json`` records its environment; the CPU/wall check and its warning.

Running each benchmark (even its smallest mode) would take minutes, so the
benchmarks are read instead: each one that takes ``--json`` must write it
through ``_results.write``, which adds :func:`_results.environment`.
"""

from __future__ import annotations

import ast
import json
import sys
import threading

import numpy as np
import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "tools"))  # the benchmarks' sibling import of _results
import _results  # noqa: E402

BENCHES = sorted(p for p in (REPO / "tools").glob("bench_*.py") if p.name != "bench_all.py")  # bench_all collects


def _imports_and_calls(path) -> tuple[set[str], set[str]]:
    """Names imported from ``_results``, and the names called, in a benchmark's source."""
    tree = ast.parse(path.read_text())
    imported = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "_results"
                for a in n.names}
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return imported, called


@pytest.mark.parametrize("path", BENCHES, ids=lambda p: p.name)
def test_every_json_of_a_benchmark_goes_through_the_recorder(path):
    if '"--json"' not in path.read_text():
        pytest.skip(f"{path.name} has no --json")
    imported, called = _imports_and_calls(path)
    assert "write" in imported and "write" in called, \
        f"{path.name} takes --json but does not write it with _results.write (which records the environment)"


def test_the_recorder_writes_the_environment(tmp_path):
    out = tmp_path / "r.json"
    _results.write(out, "bench_x", [_results.Figure("x", "a figure", "s", 1.0, 2.0, "ref")], "cmd")
    env = json.loads(out.read_text())["environment"]
    assert len(env["load_before"]) == 3 and len(env["load_after"]) == 3
    assert env["cores"] >= 1 and env["cpu_count"] >= env["cores"]
    assert {"OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "NUMBA_CACHE_DIR"} <= set(env["threads"])
    assert env["versions"]["numpy"] and env["versions"]["python"]
    assert env["commit"] is None or len(env["commit"].split("+")[0]) == 40
    assert env["numba_cache_at_start"]["state"].split()[0] in {"warm", "partly", "cold", "unknown"}
    assert env["run"]["wall_s"] > 0 and env["run"]["cpu_s"] > 0


def test_the_kernel_cache_state_reads_numba_cache_dir(tmp_path, monkeypatch):
    from planner.compiled import KERNELS

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    assert _results._kernel_cache_state()["state"].startswith("cold")
    sub = tmp_path / "planner_0123"  # numba's layout: a folder per source folder
    sub.mkdir()
    (sub / f"_kernels.{KERNELS[0]}-25.py311.nbi").write_bytes(b"")
    state = _results._kernel_cache_state()
    assert state["state"] == "partly warm" and state["kernels_cached"] == 1
    for k in KERNELS[1:]:
        (sub / f"_kernels.{k}-99.py311.nbi").write_bytes(b"")
    assert _results._kernel_cache_state()["state"] == "warm"


@pytest.mark.parametrize(("cpu", "busiest", "cores", "says"), [
    (19.0, 9.5, 2, None),  # 1.9 cores busy
    (10.0, 9.9, 2, "one thread"),  # one thread did the work
    (10.0, 5.0, 2, "busy"),  # two threads shared it, yet one core's worth: the machine was busy
    (10.0, 10.0, 1, None),  # one core is all there is
])
def test_the_parallel_warning_names_its_cause(cpu, busiest, cores, says):
    w = _results.CpuUse(wall_s=10.0, cpu_s=cpu, wait_s=5.0, busiest_thread_s=busiest, cores=cores).warning("the sort")
    if says is None:
        assert w is None
    else:
        assert w.startswith("WARNING: the sort") and says in w


def test_the_meter_counts_the_cpu_of_every_thread():
    def spin() -> None:
        x = 0
        for i in range(3_000_000):
            x += i

    with _results.CpuMeter() as m:
        ts = [threading.Thread(target=spin) for _ in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    use = m.use
    assert use.wall_s > 0 and use.cpu_s > 0 and use.wait_s >= 0 and use.cores >= 1
    assert use.cpu_s <= use.wall_s * use.cores * 1.05 + 0.05  # no more CPU than the cores could give
    # Python threads take turns on the GIL: the main thread sat in join, the threads ended (schedstat
    # forgets them), so no live thread accounts for the work
    assert 0 <= use.busiest_thread_s < use.cpu_s


def test_the_spread_tells_parallel_work_from_serial():
    pytest.importorskip("numba")
    from planner import compiled

    h = np.random.default_rng(0).random(3_000_000).astype(np.float32)
    compiled.hot_sort(h[:1000])  # compiled or loaded, and the threads started, outside the meter
    with _results.CpuMeter() as par:
        for _ in range(3):
            compiled.hot_sort(h)
    with _results.CpuMeter() as ser:
        np.sort(h)
    if par.use.cores < 2:
        pytest.skip("one core: nothing to spread over")
    assert par.use.spread > 1.5  # both threads sorted their share
    assert ser.use.spread < 1.2  # numpy's sort is one thread
