"""moment bench emulate / record: workload validation, replay figures, recorded streams, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import yaml

from iostack.bench.emulate import compute_on, emulate, make_stream, metrics_device, metrics_times
from iostack.bench.workload import ComputeSpec, StreamSpec, WorkloadError, load_workload, workload_from_dict
from training.stream import record_stream
from training.synth import SynthSpec
from training.synth_run import synthesize


def synthetic(tmp_path, **over):
    d = {"name": "t", "data": {"synthetic": {"rows": 2048, "row_bytes": "4KiB", "dir": str(tmp_path / "ssd")}},
         "stream": {"kind": "uniform", "rows_per_step": 256, "steps": 6}}
    d.update(over)
    return workload_from_dict(d)


@pytest.mark.parametrize("bad, message", [
    ({"data": {}}, "data: missing"),
    ({"data": {"placement": "a", "synthetic": {}}}, "not both"),
    ({"data": {"synthetic": {"rows": 10, "row_bytes": 8}}}, "data.synthetic.dir: missing"),
    ({"data": {"synthetic": {"rows": 0, "row_bytes": 8, "dir": "x"}}}, "data.synthetic.rows: 0 is below 1"),
    ({"data": {"synthetic": {"rows": 10, "row_bytes": "4 parsecs", "dir": "x"}}}, "not a size"),
    ({"data": {"placement": "p"}, "stream": {"kind": "poisson"}}, "stream.kind: 'poisson'"),
    ({"data": {"placement": "p"}, "stream": {"kind": "recorded"}}, "stream.path: missing"),
    ({"data": {"placement": "p"}, "stream": {"kind": "zipf", "rows_per_step": 5}}, "stream.steps: missing"),
    ({"data": {"placement": "p"}, "stream": {"kind": "uniform", "rows_per_step": 5, "steps": 1}, "readers": 0},
     "readers: 0 is below 1"),
    ({"data": {"placement": "p"}, "stream": {"kind": "uniform", "rows_per_step": 5, "steps": 1},
      "checkpoint": {"bytes": 10, "every_steps": 1}}, "checkpoint.dir: missing"),
    ({"data": {"placement": "p"}, "stream": {"kind": "uniform", "rows_per_step": 5, "steps": 1},
      "compute": {"on": "gpu"}}, "compute.on: 'gpu'; expected auto, device, host"),
    ({"data": {"placement": "p"}, "stream": {"kind": "uniform", "rows_per_step": 5, "steps": 1}, "gpus": 2},
     "unknown key(s) gpus"),
])
def test_bad_workloads_name_the_key(bad, message):
    with pytest.raises(WorkloadError) as err:
        workload_from_dict(bad)
    assert message in str(err.value)


def test_synthetic_replay_counts_every_row_and_the_checkpoints(tmp_path):
    w = synthetic(tmp_path, compute={"seconds_per_step": 0.01}, epochs=2,
                  checkpoint={"bytes": "1MiB", "every_steps": 4, "dir": str(tmp_path / "ck")})
    r = emulate(w)
    assert r.steps == 12 and r.rows == 12 * 256 and r.bytes == 12 * 256 * 4096
    assert set(r.tiers) == {"ssd"} and r.tiers["ssd"].rows == r.rows
    # uniform draws repeat some rows within a step; requests are the distinct pages read
    assert 0 < r.tiers["ssd"].requests <= r.rows
    assert (
        r.checkpoint_bytes == 3 * (1 << 20)
        and (tmp_path / "ck" / "emulated-checkpoint-0.bin").stat().st_size == 1 << 20
    )
    assert r.compute_s == pytest.approx(0.12)
    # the shares are of the wall time: compute + waiting + checkpoints (+ loop overhead) add up to it
    assert r.accelerator_utilisation + r.io_wait_share <= 1.0 + 1e-9
    assert r.compute_s + r.io_wait_s + r.checkpoint_s <= r.seconds * (1 + 1e-6)
    assert len(r.step_wait_s) == 12 and r.latency_p99_s >= r.latency_p50_s > 0


def test_zipf_stream_is_seeded_and_skewed():
    spec = StreamSpec("zipf", rows_per_step=1000, steps=20, exponent=1.2, seed=3)
    a, b = make_stream(spec, 10_000), make_stream(spec, 10_000)
    assert np.array_equal(a.ids, b.ids) and a.steps == 20
    counts = np.bincount(a.ids, minlength=10_000)
    assert np.sort(counts)[-100:].sum() > 0.4 * a.ids.size  # 1% of the rows take well over 40% of reads


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    d = tmp_path_factory.mktemp("g")
    synthesize(d / "g", SynthSpec(num_nodes=3000, num_edges=30_000, feature_dim=16, train_share=0.2, seed=1))
    return d / "g"


def test_recorded_stream_is_what_training_reads(graph, tmp_path):
    """The recorded ids of each step are the n_id of the trainer's own batch source, step by step."""
    import torch

    from training.batches import LocalBatchSource
    from training.data import open_dataset
    from training.sampler import NeighborSampler

    record_stream(graph, tmp_path / "s.npz", fanouts=(5, 3), batch_size=64, seed=4)
    s = make_stream(StreamSpec("recorded", str(tmp_path / "s.npz")), 3000)
    ds = open_dataset(graph)
    src = LocalBatchSource(NeighborSampler(ds.indptr, ds.indices, (5, 3), seed=4), np.asarray(ds.train_idx),
                           64, seed=4)
    ref = [b.n_id for b in src.batches(0)]
    assert s.steps == len(ref) == 10 and s.sample_s is not None and s.sample_s.shape == (10,)
    assert all(torch.equal(torch.from_numpy(s.step(i)), r.to(torch.int64)) for i, r in enumerate(ref))
    with pytest.raises(WorkloadError, match="the data has 100 rows"):
        make_stream(StreamSpec("recorded", str(tmp_path / "s.npz")), 100)


def test_metrics_times_reads_the_first_epoch(tmp_path):
    recs = [{"kind": "step", "epoch": e, "step": s, "compute_s": 0.1 * s + e, "allreduce_s": 0.01, "sample_s": 0.5}
            for e in (1, 0) for s in (1, 0)]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs) + "{cut short")
    compute, sample = metrics_times(tmp_path / "m.jsonl")
    assert compute.tolist() == pytest.approx([0.01, 0.11]) and sample.tolist() == [0.5, 0.5]
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(WorkloadError, match="no step records"):
        metrics_times(tmp_path / "e.jsonl")


def _metrics(path, device):
    recs = [{"kind": "start", "device": device}] if device else []
    recs += [{"kind": "step", "epoch": 0, "step": s, "compute_s": 0.002, "sample_s": 0.001} for s in range(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return str(path)


def test_compute_on_follows_the_measured_runs_device(tmp_path):
    """auto: a CPU run's compute occupied the host's cores (host); a GPU run's, or a fixed time, is a sleep."""
    cpu, gpu, old = (_metrics(tmp_path / f"{n}.jsonl", d) for n, d in (("c", "cpu"), ("g", "cuda:0"), ("o", None)))
    assert metrics_device(cpu) == "cpu" and metrics_device(gpu) == "cuda:0" and metrics_device(old) is None
    assert compute_on(ComputeSpec(from_metrics=cpu)) == "host"
    assert compute_on(ComputeSpec(from_metrics=gpu)) == "device"
    assert compute_on(ComputeSpec(from_metrics=old)) == "device"  # no start record: DLIO's default
    assert compute_on(ComputeSpec(seconds_per_step=0.1)) == "device"
    assert compute_on(ComputeSpec(from_metrics=gpu, on="host")) == "host"
    assert compute_on(ComputeSpec(from_metrics=cpu, on="device")) == "device"


def test_host_compute_spends_cpu_time_where_a_sleep_does_not(tmp_path):
    """compute.on host keeps the host busy for the steps' compute and sampling time (CPU seconds are
    spent); the same workload with device sleeps them. Same rows and steps either way."""
    import resource

    def cpu_s():
        u = resource.getrusage(resource.RUSAGE_SELF)
        return u.ru_utime + u.ru_stime

    m = _metrics(tmp_path / "m.jsonl", "cpu")
    spent = {}
    for on in ("host", "device"):
        w = synthetic(tmp_path, compute={"from_metrics": m, "on": on}, prefetch=0,
                      stream={"kind": "uniform", "rows_per_step": 8, "steps": 40})
        c0 = cpu_s()
        r = emulate(w)
        spent[on] = cpu_s() - c0
        assert r.compute_on == on and r.steps == 40 and r.compute_s == pytest.approx(40 * 0.002)
    # 40 steps x 3 ms of busy host work, against reads of 8 rows a step and two sleeps
    assert spent["host"] > spent["device"]


def moment(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moment", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.heavy  # four CLI processes end to end (~19 s)
def test_cli_record_place_and_emulate_two_readers(graph, tmp_path):
    """The real commands: record a stream, place the graph, replay it with 2 reader processes."""
    assert moment("bench", "record", str(tmp_path / "s.npz"), "--dataset", str(graph), "--fanouts", "5,3",
                  "--batch-size", "64").returncode == 0
    pl = tmp_path / "pl"
    ssd = [a for _ in range(8) for a in ("--ssd", str(pl))]
    proc = moment("place", "--dataset", str(graph), "--machine", "moment-b", "--gpu-cache", "0", "--cpu-cache",
                  "8KiB", *ssd, "--out", str(pl), "--fanouts", "5,3", "--batch-size", "64")
    assert proc.returncode == 0, proc.stderr
    wl = {"name": "recorded", "data": {"placement": str(pl), "features": str(graph / "features.npy")},
          "stream": {"kind": "recorded", "path": str(tmp_path / "s.npz")}, "readers": 2,
          "compute": {"seconds_per_step": 0.001}}
    (tmp_path / "w.yaml").write_text(yaml.safe_dump(wl))
    proc = moment("bench", "emulate", str(tmp_path / "w.yaml"), "--json", "--plot", str(tmp_path / "p.png"))
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    stream = make_stream(StreamSpec("recorded", str(tmp_path / "s.npz")), 3000)
    assert r["readers"] == 2 and r["steps"] == stream.steps and r["rows"] == stream.ids.size
    assert set(r["tiers"]) == {"cpu", "ssd"} and r["tiers"]["cpu"]["rows"] > 0
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    # a bad workload is one line naming the file and the key
    (tmp_path / "bad.yaml").write_text("data: {placement: nowhere}\nstream: {kind: uniform}\n")
    proc = moment("bench", "emulate", str(tmp_path / "bad.yaml"))
    assert proc.returncode == 2 and "bad.yaml" in proc.stderr and "stream.rows_per_step" in proc.stderr
    assert "Traceback" not in proc.stderr
    wl["data"]["placement"] = str(tmp_path / "nowhere")
    (tmp_path / "w2.yaml").write_text(yaml.safe_dump(wl))
    proc = moment("bench", "emulate", str(tmp_path / "w2.yaml"))
    assert proc.returncode == 2 and "no placement there" in proc.stderr


def test_load_workload_resolves_relative_paths(tmp_path):
    (tmp_path / "w.yaml").write_text("data: {synthetic: {rows: 8, row_bytes: 4096, dir: ssd}}\n"
                                     "stream: {kind: uniform, rows_per_step: 2, steps: 1}\n")
    assert load_workload(tmp_path / "w.yaml").synthetic.dir == str(tmp_path / "ssd")
    with pytest.raises(WorkloadError, match="no such workload file"):
        load_workload(tmp_path / "none.yaml")
