"""training.place and `moment place`: bins from a plan, DDAK placement, bin files a FeatureStore opens."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from iostack.placement import load_placement
from iostack.store import FeatureStore
from moment.cli import main
from planner.handoff import PlanTargets, StoreTarget
from tests.conftest import graph_fixture
from training.data import open_dataset
from training.hotness import HotnessSpec, compute_hotness
from training.importers.planetoid import import_planetoid
from training.place.bins import ZERO_TARGET_SHARE, PlacingError, build_bins
from training.place.policy import place


@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    return open_dataset(import_planetoid(graph_fixture("cora"), tmp_path_factory.mktemp("p") / "cora"))


def two_socket_plan(nvlink: bool = False) -> PlanTargets:
    """2 GPUs (one per socket), 2 host memories, 3 SSDs (two on socket 0); one memory without a share."""
    stores = (
        StoreTarget("cache:gpu0", "gpu", "gpu0", "socket0", 100.0),
        StoreTarget("cache:gpu1", "gpu", "gpu1", "socket1", 100.0),
        StoreTarget("mem0", "cpu", "mem0", "socket0", 300.0, numa_node=0),
        StoreTarget("mem1", "cpu", "mem1", "socket1", 0.0, numa_node=1),
        StoreTarget("ssd1", "ssd", "ssd1", "socket0", 200.0),
        StoreTarget("ssd0", "ssd", "ssd0", "socket0", 200.0),
        StoreTarget("ssd2", "ssd", "ssd2", "socket1", 100.0),
    )
    return PlanTargets("toy", (("gpu0", "socket0"), ("gpu1", "socket1")), stores,
                       (("gpu0", "gpu1"),) if nvlink else (), "toy plan")


def test_bins_replicated_gpu_cache_and_ssd_order(tmp_path):
    bins = build_bins(two_socket_plan(), num_rows=1000, row_bytes=100, gpu_cache_bytes=5000, cpu_cache_bytes=10_000,
                      ssd_dirs=[tmp_path / "a", tmp_path / "b", tmp_path], out_dir=tmp_path)
    assert [(b.kind, b.device, b.capacity_rows) for b in bins] == [
        ("gpu", "cuda", 50), ("cpu", "numa0", 100), ("cpu", "numa1", 100),
        ("ssd", "ssd0", 1000), ("ssd", "ssd1", 1000), ("ssd", "ssd2", 1000)]
    # one logical GPU bin serves both caches' share; shares are of all bytes
    assert bins[0].target_share == pytest.approx(0.2) and bins[0].stores == ("cache:gpu0", "cache:gpu1")
    assert bins[2].target_share == ZERO_TARGET_SHARE  # mem1: no share in the plan, still a bin
    # SSD bins in id order, each in its own --ssd directory; relative when that is the output
    # ... named after the placement outside it, so placements sharing SSD directories do not collide
    name = Path(bins[3].path).name
    assert Path(bins[3].path).parent == (tmp_path / "a").resolve()
    assert re.fullmatch(rf"{re.escape(tmp_path.resolve().name)}-[0-9a-f]{{8}}-bin3-ssd0\.dat", name), name
    other = build_bins(two_socket_plan(), num_rows=1000, row_bytes=100, gpu_cache_bytes=5000, cpu_cache_bytes=10_000,
                       ssd_dirs=[tmp_path / "a", tmp_path / "b", tmp_path], out_dir=tmp_path / "x" / tmp_path.name)
    assert other[3].path != bins[3].path  # same name, another directory: distinct bin files
    assert bins[5].path == "bin5-ssd2.dat"


def test_partitioned_gpu_caches_need_nvlink(tmp_path):
    kw = dict(num_rows=1000, row_bytes=100, gpu_cache_bytes=5000, cpu_cache_bytes=0,
              ssd_dirs=[tmp_path] * 3, out_dir=tmp_path, gpu_mode="partition")
    with pytest.raises(PlacingError, match="partitioned GPU caches need NVLink.*replicate"):
        build_bins(two_socket_plan(), **kw)
    bins = build_bins(two_socket_plan(nvlink=True), **kw)
    gpu = [b for b in bins if b.kind == "gpu"]
    assert [(b.device, b.socket, b.capacity_rows) for b in gpu] == [
        ("cuda:0", "socket0", 50),
        ("cuda:1", "socket1", 50),
    ]
    assert sum(b.target_share for b in gpu) == pytest.approx(0.2)
    assert not any(b.kind == "cpu" for b in bins)  # no CPU cache asked for


def test_ssd_count_must_match_the_plan(tmp_path):
    with pytest.raises(
        PlacingError, match=r"2 `ssd_dirs` path\(s\) given, the plan \(toy plan\) has 3 SSD\(s\).*ssd0, ssd1, ssd2"
    ):
        build_bins(two_socket_plan(), num_rows=10, row_bytes=4, gpu_cache_bytes=0, cpu_cache_bytes=0,
                   ssd_dirs=[tmp_path, tmp_path], out_dir=tmp_path)


def test_place_on_cora_reports_against_hash(cora, tmp_path):
    hot = compute_hotness(cora, HotnessSpec("degree")).values
    t = two_socket_plan()
    row = cora.row_bytes
    bins = build_bins(t, num_rows=cora.num_nodes, row_bytes=row, gpu_cache_bytes=100 * row,
                      cpu_cache_bytes=300 * row, ssd_dirs=[tmp_path] * 3, out_dir=tmp_path)
    res = place(hot, bins, t, row_bytes=row, pool=10, reads_per_epoch=1000.0)
    p = res.placement
    assert p.num_vertices == cora.num_nodes and p.rows_per_bin().sum() == cora.num_nodes
    assert all(p.rows_per_bin()[i] <= b.capacity_rows for i, b in enumerate(p.bins))
    r, base = res.report, res.baseline
    assert base.strategy == "hash" and r.strategy == "ddak"
    assert sum(b.traffic_share for b in r.bins) == pytest.approx(1.0)
    assert r.ssd_share == pytest.approx(sum(b.traffic_share for b in r.bins if b.kind == "ssd"))
    assert r.ssd_bytes_per_epoch == pytest.approx(r.ssd_share * 1000.0 * row)
    # the hottest rows are in the GPU bin; DDAK is closer to the targets and reads less from SSD than hash
    assert p.bin_of[int(np.argmax(hot))] == 0
    assert r.max_relative_deviation < base.max_relative_deviation
    assert r.ssd_share < base.ssd_share
    # cross-socket share by hand: GPU g reads bins on the other socket (never the GPU cache)
    by_hand = np.mean([sum(b.traffic_share for b in r.bins if b.kind != "gpu" and b.socket not in (None, s))
                       for s in ("socket0", "socket1")])
    assert r.cross_socket_share == pytest.approx(by_hand)
    for strategy in ("hash", "hot-first", "random"):
        other = place(hot, bins, t, row_bytes=row, strategy=strategy, baseline=False)
        assert other.report.strategy == strategy and other.baseline is None
        assert other.placement.rows_per_bin().sum() == cora.num_nodes


def test_plan_json_round_trip_and_old_plans(capsys, tmp_path):
    from planner.handoff import PlanFileError, plan_file_dict, read_plan_file
    from planner.topology.jsonio import to_dict

    assert main(["plan", "--machine", "moment-b", "--gpu-cache-share", "0.1", "--cpu-cache-share", "0.2",
                 "--json", "--top", "1"]) == 0
    data = json.loads(capsys.readouterr().out)
    h = read_plan_file(data, "plan.json")
    t = h.targets
    assert len(t.gpus) == 4 and {s for _, s in t.gpus} <= {"socket0", "socket1"}
    assert {s.socket for s in t.of_kind("cpu")} == {"socket0", "socket1"}
    assert len(t.of_kind("ssd")) == 8 and len(t.of_kind("cpu")) == 2 and len(t.of_kind("gpu")) == 4
    assert sum(s.target_bytes for s in t.stores) == pytest.approx(4e9, rel=1e-6)  # 4 GPUs x 1 GB
    # every store's bytes split by the reading GPUs' sockets add up to its target
    for s in t.stores:
        assert sum(b for _, b in s.bytes_by_socket) == pytest.approx(s.target_bytes, rel=1e-6, abs=1.0)
    # the plan's own shares: no re-solve
    same, note = h.resolve(0.1, 0.2)
    assert same == t and note is None
    # exact round trip: writing what was read gives the same file, and the same object back
    again = read_plan_file(json.loads(json.dumps(plan_file_dict(h))), "plan.json")
    assert plan_file_dict(again) == plan_file_dict(h) == {k: data[k] for k in plan_file_dict(h)}
    assert again.targets == t and again.demand == h.demand and to_dict(again.placed) == to_dict(h.placed)
    # the per-layout devices/nvlink that earlier writers added are gone, and a file with them still reads
    assert not {"devices", "nvlink"} & set(data["best"])
    earlier = json.loads(json.dumps(data))
    earlier["best"].update(devices={"gpu0": {"kind": "gpu", "socket": "socket0", "numa_node": 0}}, nvlink=[])
    assert plan_file_dict(read_plan_file(earlier, "plan.json")) == plan_file_dict(h)
    old = dict(data, version=1)
    with pytest.raises(PlanFileError, match=r"plan.json: plan file version 1, this Moment reads version 2.*"
                                            r"`planner.handoff.plan_document`"):
        read_plan_file(old, "plan.json")
    broken = json.loads(json.dumps(data))
    del broken["handoff"]["topology"]
    with pytest.raises(PlanFileError, match="plan.json: malformed .*topology"):
        read_plan_file(broken, "plan.json")
    with pytest.raises(PlanFileError, match="not a plan"):
        read_plan_file({"schema": "moment.topology"}, "x.json")
    # and from the command line: one line, exit 2
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert main(["place", "--dataset", str(tmp_path), "--plan", str(tmp_path / "old.json"), "--gpu-cache", "0",
                 "--cpu-cache", "0", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "plan file version 1" in err and "write it again with `moment plan --json > FILE`" in err


def _place_args(cora, ssd, out, *extra):
    return ["place", "--dataset", str(cora.path), "--machine", "moment-b", "--gpu-cache", "256KiB",
            "--cpu-cache", "1MiB", *[a for _ in range(8) for a in ("--ssd", str(ssd))], "--out", str(out), *extra]


def test_moment_place_end_to_end_opens_with_feature_store(cora, tmp_path, capsys):
    ssd, out = tmp_path / "ssd", tmp_path / "out"
    args = _place_args(cora, ssd, out, "--fanouts", "10,5", "--batch-size", "32", "--hotness-dir",
                       str(tmp_path / "hot"))
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "against the hash baseline" in text and "cross-socket share" in text
    p = load_placement(out)
    assert len([b for b in p.bins if b.kind == "ssd"]) == 8 and p.bins[0].kind == "gpu"
    assert (tmp_path / "hot" / "presample.npy").exists()
    with FeatureStore(p, out, features=cora.features, backend_options={"processes": 0}) as store:
        ids = torch.randperm(cora.num_nodes, generator=torch.Generator().manual_seed(0))
        np.testing.assert_array_equal(store.gather(ids).numpy(), np.asarray(cora.features)[ids.numpy()])
        assert {t for t in store.tier_stats()} == {"gpu", "cpu", "ssd"}
    report = json.loads((out / "place.json").read_text())
    assert report["dataset_fingerprint"]["num_nodes"] == cora.num_nodes
    assert report["report"]["strategy"] == "ddak" and report["baseline"]["strategy"] == "hash"
    assert report["hotness"]["method"] == "presample" and report["hotness"]["fanouts"] == [10, 5]

    # refusing to overwrite: nothing is touched
    before = {f: f.stat().st_mtime_ns for f in list(out.iterdir()) + list(ssd.iterdir())}
    assert main(args) == 2
    assert "holds a placement already" in capsys.readouterr().err
    # other placements share the SSD directories without a clash, even one of the same name,
    # and leave the first one's files alone
    for other in (tmp_path / "out2", tmp_path / "elsewhere" / "out"):
        assert main(_place_args(cora, ssd, other, "--hotness", "degree")) == 0
        capsys.readouterr()
    assert {f: f.stat().st_mtime_ns for f in before} == before
    # the bins of an interrupted run (no placement index; their manifests name out2) are swept by the
    # next run of out2, each named (issue 28, item 11); other placements' bins stay
    (tmp_path / "out2" / "placement.json").unlink()
    assert main(_place_args(cora, ssd, tmp_path / "out2", "--hotness", "degree")) == 0
    assert capsys.readouterr().err.count("left by a placement writer of " + str(tmp_path / "out2")) == 16
    assert {f: f.stat().st_mtime_ns for f in before} == before
    # a bin of an unknown writer (no manifest naming out2) is still not overwritten silently
    (tmp_path / "out2" / "placement.json").unlink()
    for man in ssd.glob("out2-*.dat.json"):
        man.write_text(man.read_text().replace('"placement_dir"', '"placed_by"'))
    assert main(_place_args(cora, ssd, tmp_path / "out2", "--hotness", "degree")) == 2
    assert "exists already" in capsys.readouterr().err
    # --force replaces it (the hotness is loaded this time), --json prints the report
    assert main([*args, "--force", "--json", "--strategy", "hot-first"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["hotness"]["loaded"] and again["report"]["strategy"] == "hot-first"
    assert load_placement(out).num_vertices == cora.num_nodes


def test_moment_place_bin_files_next_to_the_placement(cora, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(_place_args(cora, out, out, "--hotness", "pagerank", "--gpu-cache", "0", "--json")) == 0
    rep = json.loads(capsys.readouterr().out)
    assert not any(b["kind"] == "gpu" for b in rep["bins"])
    p = load_placement(out)
    assert all(b.path == f"bin{b.id}-ssd{b.id - 2}.dat" for b in p.bins if b.kind == "ssd")
    with FeatureStore(p, out, features=cora.features, backend_options={"processes": 0}) as store:
        ids = torch.arange(cora.num_nodes)
        np.testing.assert_array_equal(store.gather(ids).numpy(), np.asarray(cora.features))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"--gpu-cache": "lots"}, "--gpu-cache 'lots'"),
        ({"--dataset": "/nonexistent/ds"}, "no such dataset directory"),
        ({"--fanouts": "25,x"}, "--fanouts '25,x'"),
        ({"--pool": "0"}, "--pool 0"),
        ({"--ssd": 1}, r"1 --ssd path\(s\) given, the plan .* has 8 SSD\(s\)"),
        ({"--gpu-cache-mode": "partition"}, "need NVLink"),
        ({"--plan": "/nonexistent/plan.json"}, "--plan /nonexistent/plan.json: no such file"),
    ],
)
def test_bad_input_exits_2_with_one_line(cora, tmp_path, capsys, change, message):
    args = _place_args(cora, tmp_path / "ssd", tmp_path / "out", "--hotness", "degree")
    if change.get("--ssd") == 1:
        i = args.index("--ssd")
        args = args[:i + 2] + [a for a in args[i + 2:] if a != "--ssd" and a != str(tmp_path / "ssd")]
    elif "--plan" in change:
        i = args.index("--machine")
        args[i:i + 2] = ["--plan", change["--plan"]]
    else:
        for flag, value in change.items():
            if flag in args:
                args[args.index(flag) + 1] = value
            else:
                args += [flag, value]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("moment place: error:") and err.count("\n") == 1
    assert __import__("re").search(message, err), err
    assert not (tmp_path / "out" / "placement.json").exists()


def test_training_refuses_a_placement_made_from_another_dataset(cora, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(_place_args(cora, tmp_path / "ssd", out, "--hotness", "degree")) == 0
    # the same counts and row width, other feature values: only the fingerprint tells them apart
    twin = _twin(cora, tmp_path / "twin")
    capsys.readouterr()
    assert main(["train", "--dataset", str(twin), "--placement", str(out), "--fanouts", "5", "--hidden", "8"]) == 2
    err = capsys.readouterr().err
    assert "placed from another dataset" in err and "features_crc32" in err and err.count("\n") == 1
    assert main(["train", "--dataset", str(cora.path), "--placement", str(out), "--fanouts", "5", "--hidden", "8",
                 "--batch-size", "140"]) == 0


def test_plan_file_from_stdin_places_exactly_as_a_plan_made_now(cora, tmp_path, capsys, monkeypatch):
    """README's route (`moment plan --json | moment place --plan -`) and `moment place` alone: the same bins."""
    import io

    ssd = tmp_path / "ssd"
    assert main(_place_args(cora, ssd, tmp_path / "now", "--json")) == 0
    now = json.loads(capsys.readouterr().out)
    assert main(["plan", "--machine", "moment-b", "--json", "--top", "1"]) == 0
    plan_text = capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", io.StringIO(plan_text))
    args = [a for a in _place_args(cora, ssd, tmp_path / "piped", "--json") if a != "moment-b"]
    args.remove("--machine")
    assert main([*args, "--plan", "-"]) == 0
    piped = json.loads(capsys.readouterr().out)
    a, b = np.load(tmp_path / "now" / "bin_of.npy"), np.load(tmp_path / "piped" / "bin_of.npy")
    assert np.array_equal(a, b)
    assert [x["target_share"] for x in now["report"]["bins"]] == [x["target_share"] for x in piped["report"]["bins"]]
    # the plan had cache shares of 0: the caches got targets anyway, and the report says why
    assert any("re-solved on the plan's layout" in n for n in piped["plan_notes"])
    gpu = [x for x in piped["report"]["bins"] if x["kind"] == "gpu"][0]
    assert gpu["target_share"] > 0.01 and piped["report"]["ssd_share"] < piped["baseline"]["ssd_share"]
    # a plan file and machine options at once: refused, naming both
    monkeypatch.setattr("sys.stdin", io.StringIO(plan_text))
    assert main([*_place_args(cora, ssd, tmp_path / "x"), "--plan", "-"]) == 2
    assert "drop --machine" in capsys.readouterr().err


def test_measured_ssd_figures_reach_the_plan_and_unmatched_ones_are_named(tmp_path, capsys):
    """A profile's SSD measurement changes the plan (through the device model the plan places)."""
    def plan_json(*extra):
        assert main(["plan", "--machine", "moment-b", "--json", "--top", "1", *extra]) == 0
        return json.loads(capsys.readouterr().out)

    base = plan_json()
    slow = tmp_path / "slow.yaml"
    slow.write_text("schema: moment.capacities\nversion: 1\ndevices:\n"
                    "  p5510:\n    read_bytes_per_s: 1 GB/s\n    read_iops: 200000\n    block_bytes: 4096\n")
    measured = plan_json("--capacities", str(slow))
    assert measured["best"]["mean_inlet_bytes_per_s"] < 0.5 * base["best"]["mean_inlet_bytes_per_s"]
    assert any("p5510: 1.00 GB/s measured" in n for n in measured["notes"])
    other = tmp_path / "other.yaml"
    other.write_text("schema: moment.capacities\nversion: 1\ndevices:\n"
                     "  vda:\n    model: Virtio disk\n    read_bytes_per_s: 1 GB/s\n")
    unmatched = plan_json("--capacities", str(other))
    assert unmatched["best"]["mean_inlet_bytes_per_s"] == pytest.approx(base["best"]["mean_inlet_bytes_per_s"])
    assert any("measured device vda (Virtio disk) is none of the devices to place" in n for n in unmatched["notes"])


def _routed_plan() -> PlanTargets:
    """Two sockets, a GPU on each; every store serves its own socket's GPU (the flow's routing)."""
    stores = (
        StoreTarget("cache:gpu0", "gpu", "gpu0", "socket0", 50.0, bytes_by_socket=(("socket0", 50.0),)),
        StoreTarget("cache:gpu1", "gpu", "gpu1", "socket1", 50.0, bytes_by_socket=(("socket1", 50.0),)),
        StoreTarget("mem0", "cpu", "mem0", "socket0", 150.0, numa_node=0, bytes_by_socket=(("socket0", 150.0),)),
        StoreTarget("mem1", "cpu", "mem1", "socket1", 150.0, numa_node=1, bytes_by_socket=(("socket1", 150.0),)),
        StoreTarget("ssd0", "ssd", "ssd0", "socket0", 300.0, bytes_by_socket=(("socket0", 300.0),)),
        StoreTarget("ssd1", "ssd", "ssd1", "socket1", 300.0, bytes_by_socket=(("socket1", 300.0),)),
    )
    return PlanTargets("toy", (("gpu0", "socket0"), ("gpu1", "socket1")), stores, (), "routed plan")


def test_reads_per_socket_put_rows_near_their_readers(cora, tmp_path):
    """With each socket's reads, DDAK follows the plan's routing: fewer cross-socket reads than hash,
    reported per (reader socket, bin socket); without them every GPU reads alike."""
    from training.place.bins import bin_split

    t = _routed_plan()
    row = cora.row_bytes
    bins = build_bins(t, num_rows=cora.num_nodes, row_bytes=row, gpu_cache_bytes=50 * row,
                      cpu_cache_bytes=200 * row, ssd_dirs=[tmp_path] * 2, out_dir=tmp_path)
    assert bin_split(t, bins).tolist() == [[0.5, 0.5], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]
    hot = compute_hotness(cora, HotnessSpec("presample", fanouts=(10, 5), batch_size=64, epochs=2)).values
    # each socket's GPU trains on its own half of the vertices (ids below / above the middle) and
    # reads their neighbourhoods: rows are read mostly by one socket
    half = cora.num_nodes // 2
    lean = np.where(np.arange(cora.num_nodes) < half, 0.9, 0.1)
    reads = np.stack([hot * lean, hot * (1 - lean)], axis=1)
    res = place(hot, bins, t, row_bytes=row, group_reads=reads)
    r, base = res.report, res.baseline
    assert r.cross_socket_share < 0.5 * base.cross_socket_share
    assert sum(v for _, _, v in r.socket_reads) == pytest.approx(1.0)
    by_hand = sum(v for a, b, v in r.socket_reads if a != b)
    assert r.cross_socket_share == pytest.approx(by_hand)
    # rows read mostly by socket 1 sit on socket 1's bins
    where = np.array([bins[b].socket for b in res.placement.bin_of])
    mine = (lean < 0.5) & (hot > 0)  # rows nobody reads go anywhere
    on1 = np.isin(where[mine], ["socket1"]) | np.array([bins[b].kind == "gpu" for b in res.placement.bin_of])[mine]
    assert on1.mean() > 0.9
    plain = place(hot, bins, t, row_bytes=row)  # no reads per socket: GPUs read alike, half crosses
    assert plain.report.cross_socket_share == pytest.approx(
        0.5 * sum(b.traffic_share for b in plain.report.bins if b.kind != "gpu"))
    with pytest.raises(PlacingError, match="reads per socket: expected shape"):
        place(hot, bins, t, row_bytes=row, group_reads=reads[:, :1])


def test_plan_for_the_layout_the_machine_has(cora, tmp_path, capsys, monkeypatch):
    """`moment plan --layout c` hands placement the classic layout's targets, not the recommended one's;
    a layout the plan does not have is one line naming it and the fix."""
    import io

    assert main(["plan", "--machine", "moment-a", "--json", "--top", "1", "--layout", "c"]) == 0
    plan_text = capsys.readouterr().out
    h = json.loads(plan_text)["handoff"]
    assert h["layout"] == "c"
    # classic (c) spreads the GPUs over both sockets, the recommended layout of moment-a does not
    assert {s for _, s in h["targets"]["gpus"]} == {"socket0", "socket1"}
    assert main(["plan", "--machine", "moment-a", "--json", "--top", "1"]) == 0
    best = json.loads(capsys.readouterr().out)["handoff"]
    assert best["layout"] == "recommended" and best["topology"] != h["topology"]
    monkeypatch.setattr("sys.stdin", io.StringIO(plan_text))
    args = [a for a in _place_args(cora, tmp_path / "ssd", tmp_path / "c", "--json") if a not in ("moment-b",
                                                                                                   "--machine")]
    assert main([*args, "--plan", "-"]) == 0
    placed = json.loads(capsys.readouterr().out)
    # half the GPUs on each socket, reading every row alike: a GPU cache is the only local store for all
    assert {p[0] for p in placed["report"]["socket_reads"]} == {"socket0", "socket1"}
    assert main(["plan", "--machine", "moment-a", "--json", "--layout", "current"]) == 2
    err = capsys.readouterr().err
    assert "layout 'current'" in err and "captures" in err and "Traceback" not in err


def _twin(cora, where: Path) -> Path:
    """Cora's graph and counts with other feature values: only the fingerprint tells them apart."""
    import shutil

    shutil.copytree(cora.path, where, ignore=shutil.ignore_patterns("hotness"))
    np.save(where / "features.npy", np.load(where / "features.npy") + 1)
    meta = json.loads((where / "meta.json").read_text())
    del meta["checksums"]["files"]["features"]  # a twin, not a corrupt copy: features without a checksum
    (where / "meta.json").write_text(json.dumps(meta))
    return where


def test_a_library_placement_carries_the_fingerprint_and_is_refused_for_another_dataset(cora, tmp_path):
    """place_dataset is the whole job: its manifest records the dataset, and opening checks it."""
    from planner.handoff import plan_now
    from planner.topology.discover import topology_from_files
    from training.features import open_features
    from training.place.run import place_dataset
    from training.place.specs import PlaceSpec, TierSpec

    out, seen = tmp_path / "out", []
    plan = plan_now(topology_from_files(machine="moment-b"), spec="moment-b")
    spec = PlaceSpec(TierSpec(gpu_cache_bytes=256 << 10, cpu_cache_bytes=1 << 20, ssd_dirs=[out] * 8),
                     hotness=HotnessSpec("degree"))
    placed = place_dataset(cora.path, plan, out, spec, progress=lambda stage, done, total: seen.append(stage),
                           warn=lambda note: None)
    assert any(s.startswith("placing (ddak)") for s in seen)  # progress through the one callback
    assert load_placement(out).dataset_fingerprint == placed.report["dataset_fingerprint"]
    assert json.loads((out / "placement.json").read_text())["dataset_fingerprint"]["num_nodes"] == cora.num_nodes
    (out / "place.json").unlink()  # the report is not what the check rests on
    open_features(cora, str(out)).close()
    twin = open_dataset(_twin(cora, tmp_path / "twin"))
    with pytest.raises(PlacingError) as err:
        open_features(twin, str(out))
    msg = str(err.value)
    assert str(out) in msg and str(twin.path) in msg and "features_crc32" in msg and "moment place" in msg
    assert "\n" not in msg


def test_an_old_placement_without_a_fingerprint_still_opens_and_says_so(cora, tmp_path, caplog):
    from training.features import open_features

    out = tmp_path / "old"
    assert main(_place_args(cora, out, out, "--hotness", "degree", "--json")) == 0
    man = json.loads((out / "placement.json").read_text())
    del man["dataset_fingerprint"]  # as placements were written before the manifest carried it
    (out / "placement.json").write_text(json.dumps(man))
    rep = json.loads((out / "place.json").read_text())
    del rep["dataset_fingerprint"]
    (out / "place.json").write_text(json.dumps(rep))
    twin = open_dataset(_twin(cora, tmp_path / "twin"))
    with caplog.at_level("WARNING", logger="training.place.run"):
        open_features(twin, str(out)).close()  # nothing to compare: it opens
    assert any("records no dataset fingerprint" in r.getMessage() and str(out) in r.getMessage()
               for r in caplog.records)
