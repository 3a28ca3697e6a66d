"""training.memplan and `moment place --cpu-cache auto`: the memory readers, the sizing, the train warning."""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iostack.placement import load_placement
from moment.cli import main
from training.memplan import (
    MEMORY_LIMIT_ENV,
    GraphSizes,
    MemoryLimit,
    MemoryPlanError,
    TrainingReserve,
    available_memory,
    read_cgroup_limit,
    read_mem_available,
    size_cpu_cache,
    training_reserve,
)
from training.synth import SynthSpec
from training.synth_run import synthesize

GIB = 1 << 30


def _fake(tmp_path, cgroup: str, files: dict[str, str], meminfo_kib: int | None = 4 * 1024 * 1024):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cgroup").write_text(cgroup)
    for rel, text in files.items():
        f = tmp_path / "sys" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    (tmp_path / "sys").mkdir(exist_ok=True)
    if meminfo_kib is not None:
        (tmp_path / "proc" / "meminfo").write_text(f"MemTotal: 9999999 kB\nMemAvailable: {meminfo_kib} kB\n")
    return dict(proc_cgroup=tmp_path / "proc" / "cgroup", cgroup_root=tmp_path / "sys",
                meminfo=tmp_path / "proc" / "meminfo")


def test_a_second_prefetch_worker_reserves_one_batch_more():
    g = GraphSizes(10**5, 10**6, 8 * (10**5 + 1), 4 * 10**6, 128, 512, 8 * 10**5, 10, 10**4)
    one, two, four = (training_reserve(g, batch_size=1000, fanouts=(10, 5), prefetch=p, workers=w)
                      for p, w in ((2, 1), (2, 2), (4, 1)))
    assert two.batch_bytes > one.batch_bytes
    assert two.batch_bytes - one.batch_bytes == (four.batch_bytes - one.batch_bytes) // 2  # a batch each
    with pytest.raises(MemoryPlanError, match="workers 0"):
        training_reserve(g, batch_size=1000, fanouts=(10, 5), workers=0)


def test_cgroup_v2_max_is_no_limit_so_memavailable_counts(tmp_path):
    paths = _fake(tmp_path, "0::/job\n", {"job/memory.max": "max\n", "job/memory.high": "max\n"})
    assert read_cgroup_limit(paths["proc_cgroup"], paths["cgroup_root"]) is None
    got = available_memory(**paths)
    assert got == MemoryLimit(4 * GIB, "MemAvailable", str(paths["meminfo"]))


def test_cgroup_v2_number_and_the_smaller_of_limit_and_memavailable(tmp_path):
    paths = _fake(tmp_path, "0::/a/job\n", {"a/job/memory.max": f"{2 * GIB}\n", "a/memory.high": f"{3 * GIB}\n"})
    got = available_memory(**paths)
    assert (got.bytes, got.source) == (2 * GIB, "cgroup memory.max")
    # a parent's lower limit binds too; and MemAvailable wins when it is the smaller
    (tmp_path / "sys" / "a" / "memory.high").write_text(f"{GIB}\n")
    assert available_memory(**paths).source == "cgroup memory.high"
    (tmp_path / "proc" / "meminfo").write_text("MemAvailable: 1024 kB\n")
    assert available_memory(**paths).source == "MemAvailable"


def test_cgroup_v1_limit_in_bytes_and_its_unlimited_value(tmp_path):
    paths = _fake(tmp_path, "4:memory:/docker/x\n1:cpu:/\n", {"memory/docker/x/memory.limit_in_bytes": f"{GIB}\n"})
    got = read_cgroup_limit(paths["proc_cgroup"], paths["cgroup_root"])
    assert (got.bytes, got.source) == (GIB, "cgroup memory.limit_in_bytes")
    (tmp_path / "sys" / "memory" / "docker" / "x" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert read_cgroup_limit(paths["proc_cgroup"], paths["cgroup_root"]) is None


def test_no_cgroup_no_meminfo_and_the_override(tmp_path):
    paths = _fake(tmp_path, "", {}, meminfo_kib=None)
    assert read_cgroup_limit(paths["proc_cgroup"], paths["cgroup_root"]) is None
    assert read_mem_available(paths["meminfo"]) is None
    with pytest.raises(MemoryPlanError, match="`memory_limit=SIZE`"):
        available_memory(**paths)
    assert available_memory(5 * GIB, **paths).source == "--memory-limit"


reserves = st.builds(TrainingReserve, *[st.integers(0, 1 << 34)] * 8)


@settings(max_examples=200, deadline=None)
@given(limit=st.integers(0, 1 << 40), extra=st.integers(0, 1 << 36), reserve=reserves, nodes=st.integers(1, 8),
       row=st.integers(1, 1 << 14), rows=st.integers(0, 1 << 24))
def test_sizing_properties(limit, extra, reserve, nodes, row, rows):
    feature_bytes = rows * row
    try:
        s = size_cpu_cache(MemoryLimit(limit, "--memory-limit"), reserve, numa_nodes=nodes, row_bytes=row,
                           feature_bytes=feature_bytes)
    except MemoryPlanError as exc:
        assert limit < reserve.total_bytes and "below what training itself needs" in str(exc)
        return
    assert s.per_node_bytes >= 0 and s.per_node_bytes % row == 0
    assert s.total_bytes <= limit - reserve.total_bytes
    assert s.per_node_bytes <= feature_bytes
    assert s.capped == (s.per_node_bytes == feature_bytes)
    more = size_cpu_cache(MemoryLimit(limit + extra, "--memory-limit"), reserve, numa_nodes=nodes, row_bytes=row,
                          feature_bytes=feature_bytes)
    assert more.per_node_bytes >= s.per_node_bytes  # monotone in the limit


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    d = tmp_path_factory.mktemp("mem") / "g"
    synthesize(d, SynthSpec(num_nodes=3000, num_edges=20000, feature_dim=16))
    return d


def _place(graph, out, *extra):
    ssd = [x for _ in range(8) for x in ("--ssd", str(out))]
    return ["place", "--dataset", str(graph), "--machine", "moment-b", "--gpu-cache", "0", *ssd, "--out", str(out),
            "--hotness", "degree", "--fanouts", "5,5", "--batch-size", "64", *extra]


def test_moment_place_cpu_cache_auto_lands_in_the_placement_and_the_report(graph, tmp_path, capsys):
    assert main(_place(graph, tmp_path / "p", "--cpu-cache", "auto", "--memory-limit", "1GiB")) == 0
    out = capsys.readouterr().out
    assert "--cpu-cache auto" in out and "memory limit (--memory-limit)" in out and "runtime" in out
    rep = json.loads((tmp_path / "p" / "place.json").read_text())
    sizing = rep["cpu_cache_sizing"]
    assert sizing["limit"]["source"] == "--memory-limit" and sizing["limit"]["bytes"] == 1 << 30
    assert sizing["numa_nodes"] == 2 and rep["cpu_cache_bytes"] == sizing["per_node_bytes"]
    # 3000 rows of 64 bytes fit in 1 GiB beside the reserve: capped at the features, said so
    assert sizing["capped"] and sizing["per_node_bytes"] == 3000 * 64 and "capped" in sizing["note"]
    assert sizing["reserve"]["total_bytes"] == sum(v for k, v in sizing["reserve"].items() if k != "total_bytes")
    cpu = [b for b in load_placement(tmp_path / "p").bins if b.kind == "cpu"]
    assert [b.capacity_rows for b in cpu] == [3000, 3000]


@pytest.mark.parametrize(("args", "message"), [
    (["--cpu-cache", "auto", "--memory-limit", "100MiB"],
     r"memory limit 100 MiB \(--memory-limit\) is below what training itself needs, [0-9.]+ MiB"),
    (["--cpu-cache", "auto", "--memory-limit", "lots"], "--memory-limit 'lots'"),
    (["--cpu-cache", "1MiB", "--memory-limit", "1GiB"], "sizes --cpu-cache auto only"),
])
def test_bad_auto_input_is_one_line(graph, tmp_path, capsys, args, message):
    assert main(_place(graph, tmp_path / "p", *args)) == 2
    err = capsys.readouterr().err
    assert err.startswith("moment place: error:") and err.count("\n") == 1
    assert __import__("re").search(message, err), err
    assert not (tmp_path / "p" / "placement.json").exists()


def test_train_warns_when_the_cache_and_the_reserve_exceed_the_memory(graph, tmp_path, capsys, caplog,
                                                                       monkeypatch):
    assert main(_place(graph, tmp_path / "p", "--cpu-cache", "auto", "--memory-limit", "1GiB")) == 0
    train = ["train", "--dataset", str(graph), "--placement", str(tmp_path / "p"), "--fanouts", "5,5",
             "--hidden", "8", "--batch-size", "64", "--metrics", str(tmp_path / "m.jsonl")]
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "200MiB")
    with caplog.at_level(logging.WARNING, logger="training.memplan"):
        assert main(train) == 0  # never refused
    warned = [r.getMessage() for r in caplog.records if r.name == "training.memplan"]
    assert len(warned) == 1 and "more than the 200 MiB available ($MOMENT_MEMORY_LIMIT)" in warned[0]
    assert "moment place --cpu-cache auto" in warned[0] and "the placement's CPU cache (" in warned[0]
    start = json.loads((tmp_path / "m.jsonl").read_text().splitlines()[0])
    assert start["kind"] == "start" and "200 MiB" in start["memory_check"]
    caplog.clear()
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "1GiB")
    with caplog.at_level(logging.WARNING, logger="training.memplan"):
        assert main(train) == 0
    assert not [r for r in caplog.records if r.name == "training.memplan"]
