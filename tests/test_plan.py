"""planner.plan: the whole layout search, its pruning, baselines and what-ifs; `moment plan` end to end."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moment.cli import main
from planner.errors import PlannerError
from planner.inventory import inventory_from_counts
from planner.plan import choose_inventory, plan
from planner.topology.model import Link, LinkKind, Node, NodeKind, Topology
from planner.topology.spec.load import load_machine
from planner.workload import Demand


def _slot(t: Topology, parent: str, sid: str, form: str, lanes: int) -> None:
    t.add_node(Node(sid, NodeKind.SLOT, sid, attrs={
        "designation": sid, "width_lanes": lanes, "pcie_gen": 4, "form_factor": form,
        "double_width": form == "cem", "in_use": False}))
    t.add_link(Link.pcie(parent, sid, 4, lanes))


@st.composite
def machines(draw):
    """Small random machines: 1-2 sockets, 0-2 switches each (maybe cascaded), x16 and U.2 slots."""
    t = Topology("random")
    n_sockets = draw(st.integers(1, 2))
    for s in range(n_sockets):
        t.add_node(Node(f"socket{s}", NodeKind.SOCKET, f"socket {s}", numa_node=s))
        t.add_node(Node(f"mem{s}", NodeKind.MEMORY, f"memory {s}", numa_node=s))
        t.add_link(Link(f"socket{s}", f"mem{s}", LinkKind.MEMORY, 100e9, bandwidth_source="spec"))
    if n_sockets == 2:
        t.add_link(Link("socket0", "socket1", LinkKind.INTER_SOCKET,
                        draw(st.sampled_from([10e9, 20e9, 40e9])), bandwidth_source="spec"))
    k = 0
    for s in range(n_sockets):
        parents = [f"socket{s}"]
        for w in range(draw(st.integers(0, 2))):
            sw = f"sw{s}{w}"
            up = draw(st.sampled_from(parents))
            t.add_node(Node(sw, NodeKind.SWITCH, sw))
            t.add_link(Link.pcie(up, sw, 4, draw(st.sampled_from([8, 16]))))
            parents.append(sw)
        for p in parents:
            for _ in range(draw(st.integers(0 if p.startswith("socket") else 1, 2))):
                form, lanes = draw(st.sampled_from([("cem", 16), ("u.2", 4)]))
                _slot(t, p, f"slot{k}", form, lanes)
                k += 1
    n_cem = sum(1 for n in t.nodes(NodeKind.SLOT) if n.attrs["form_factor"] == "cem")
    n_slots = len(t.nodes(NodeKind.SLOT))
    gpus = draw(st.integers(1, max(1, min(2, n_cem))))
    ssds = draw(st.integers(1, max(1, min(3, n_slots - gpus))))
    return t, gpus, ssds, n_cem, n_slots


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(machines(), st.sampled_from([0.0, 0.3]), st.sampled_from([0.0, 0.4]), st.sampled_from(["maxflow", "concurrent"]))
def test_pruned_search_finds_the_exhaustive_best(machine, gpu_share, cpu_share, model):
    topo, gpus, ssds, n_cem, n_slots = machine
    if gpus > n_cem or gpus + ssds > n_slots:
        with pytest.raises(PlannerError):
            plan(topo, inventory_from_counts(gpus, ssds), Demand(1e9, gpu_share, cpu_share))
        return
    inv = inventory_from_counts(gpus, ssds)
    demand = Demand(1e9, gpu_share, cpu_share)
    full = plan(topo, inv, demand, model=model, exhaustive=True)
    fast = plan(topo, inv, demand, model=model, top=1)
    assert fast.best.seconds_per_iteration == pytest.approx(full.best.seconds_per_iteration, rel=5e-4)
    assert full.solved_count == full.search.distinct_count >= fast.solved_count
    ts = [e.seconds_per_iteration for e in full.ranked]
    assert ts == sorted(ts)


@pytest.fixture(scope="module")
def machine_b():
    return load_machine("moment-b")


def test_machine_b_recommendation_beats_classic_layout_c(machine_b):
    topo, inv = choose_inventory(machine_b, spec="moment-b")
    assert topo is machine_b
    assert str(inv) == "4 × a100-40gb-pcie, 8 × p5510"
    for demand in (Demand(1e9), Demand(1e9, host_memory_share=0.3)):
        result = plan(machine_b, inv, demand)
        c = result.baselines["c"]
        assert result.best.mean_inlet_bytes_per_s > c.mean_inlet_bytes_per_s
        assert result.gain_over("c") > 1.0
        assert set(result.baselines) == {"a", "b", "c", "d"}
        assert result.search.raw_count >= result.search.feasible_count >= result.search.distinct_count
        assert len(result.slot_map()) == 12


def test_concurrent_model_is_never_more_optimistic(machine_b):
    inv = inventory_from_counts(4, 8)
    demand = Demand(1e9, 0.1, 0.3)
    mf = plan(machine_b, inv, demand, model="maxflow")
    cc = plan(machine_b, inv, demand, model="concurrent")
    assert cc.best.seconds_per_iteration >= mf.best.seconds_per_iteration * (1 - 1e-6)
    for name in "abcd":
        assert cc.baselines[name].seconds_per_iteration >= mf.baselines[name].seconds_per_iteration * (1 - 1e-6)


def test_nvlink_what_if_never_slows_a_layout_down(machine_b):
    inv = inventory_from_counts(4, 8)
    demand = Demand(1e9, host_memory_share=0.3)
    base = plan(machine_b, inv, demand)
    bridged = plan(machine_b, inv, demand, nvlink_pairs=[(0, 1), (2, 3)])
    assert bridged.best.seconds_per_iteration <= base.best.seconds_per_iteration * (1 + 1e-6)
    c0, c1 = base.baselines["c"], bridged.baselines["c"]
    assert c1.seconds_per_iteration <= c0.seconds_per_iteration * (1 + 1e-6)
    assert len(c1.placed.links(LinkKind.NVLINK)) == 2
    with pytest.raises(PlannerError, match="no GPU 7"):
        plan(machine_b, inv, demand, nvlink_pairs=[(0, 7)])


def test_demand_scales_time_not_ranking(machine_b):
    inv = inventory_from_counts(2, 4)
    a = plan(machine_b, inv, Demand(1e9))
    b = plan(machine_b, inv, Demand(3e9))
    assert b.best.seconds_per_iteration == pytest.approx(3 * a.best.seconds_per_iteration, rel=1e-3)
    assert b.best.mean_inlet_bytes_per_s == pytest.approx(a.best.mean_inlet_bytes_per_s, rel=1e-3)


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(bytes_per_consumer=0), "positive"),
    (dict(bytes_per_consumer=-1e9), "positive"),
    (dict(bytes_per_consumer=1e9, host_memory_share=1.5), r"\[0, 1\]"),
    (dict(bytes_per_consumer=1e9, accelerator_cache_share=0.7, host_memory_share=0.6), "exceed 1"),
])
def test_bad_demand(kwargs, message):
    with pytest.raises(PlannerError, match=message):
        Demand(**kwargs)


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_cli_plan_prints_ranking_slot_map_and_baselines(tmp_path):
    svg = tmp_path / "plan.svg"
    code, out, err = _run("plan", "--machine", "moment-b", "--svg", str(svg), "--top", "3")
    assert code == 0, err
    assert "Recommended slot map" in out and "GPU 0 →" in out and "bottleneck" in out
    assert "(c) SSDs balanced, GPUs spread" in out
    assert "distinct" in out and "raw" in out
    assert svg.read_text().lstrip().startswith(("<?xml", "<svg"))


def test_cli_plan_json_and_what_ifs():
    code, out, err = _run("plan", "--machine", "moment-a", "--json", "--gpus", "2", "--ssds", "4",
                          "--ssd-model", "samsung-980-pro", "--model", "concurrent")
    assert code == 0, err
    data = json.loads(out)
    assert data["inventory"] == "2 × a100-40gb-pcie, 4 × samsung-980-pro"
    assert data["model"] == "concurrent"
    assert data["counts"]["distinct"] >= 1 and len(data["slot_map"]) == 6
    assert data["best"]["rank"] == 1


@pytest.mark.parametrize(("argv", "message"), [
    (["--gpus", "0", "--ssds", "0"], "nothing to place"),
    (["--gpus", "40"], "too few slots for 40"),
    (["--gpu-model", "toaster-9000"], "toaster-9000"),
    (["--ssd-model", "a100-40gb-pcie"], "not a nvme model"),
    (["--demand-gb", "-1"], "positive"),
    (["--cpu-cache-share", "2"], r"\[0, 1\]"),
    (["--nvlink", "0-9"], "no GPU 9"),
    (["--nvlink", "zero-one"], "two GPU numbers"),
    (["--top", "0"], "at least 1"),
])
def test_cli_plan_bad_input_is_one_line_and_status_2(argv, message):
    code, out, err = _run("plan", "--machine", "moment-b", *argv)
    assert code == 2, (argv, out, err)
    assert "Traceback" not in err and "internal error" not in err
    import re

    assert re.search(message, err), err


@pytest.mark.parametrize("machine,gpus,ssds,model", [("moment-a", None, None, "maxflow"),
                                                     ("moment-b", None, None, "maxflow"),
                                                     ("moment-b", 2, 4, "concurrent")])
def test_untidy_best_reports_what_the_tidy_one_does(machine, gpus, ssds, model):
    """``tidy_best=False`` (moment plan's table) skips the tie-break LP of the best layout only:
    the ranking, ``T``, bottleneck, saturated stores and inlet rates are the same; the flows may not be."""
    topo, inv = choose_inventory(load_machine(machine), spec=machine, gpus=gpus, ssds=ssds)
    demand = Demand(4e9)
    tidy = plan(topo, inv, demand, model=model, top=3)
    bare = plan(topo, inv, demand, model=model, top=3, tidy_best=False)
    assert [e.layout.canonical for e in bare.ranked] == [e.layout.canonical for e in tidy.ranked]
    for a, b in zip(bare.ranked, tidy.ranked, strict=True):
        assert a.seconds_per_iteration == pytest.approx(b.seconds_per_iteration, rel=1e-9)
        assert a.result.bottleneck == b.result.bottleneck
        assert a.result.saturated_stores == b.result.saturated_stores
        assert a.result.inlet_bytes_per_s == pytest.approx(b.result.inlet_bytes_per_s, rel=1e-9)
    assert set(bare.baselines) == set(tidy.baselines)
    # the tidy best spreads reads evenly over identical SSDs; what the ranking solve found need not
    tidy_ssd = [v for k, v in tidy.best.result.store_bytes.items() if k.startswith("ssd")]
    assert tidy_ssd and max(tidy_ssd) == pytest.approx(min(tidy_ssd), rel=1e-6)
