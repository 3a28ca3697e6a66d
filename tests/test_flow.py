"""Flow models (planner.flow) and workloads (planner.workload) on hand-built topologies."""

from __future__ import annotations

import math

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.errors import PlannerError
from planner.flow import FlowResult, solve, solve_concurrent, solve_maxflow
from planner.topology.model import Link, LinkKind, Node, NodeKind, Topology
from planner.topology.pcie import pcie_bytes_per_s
from planner.workload import Consumer, Store, Tier, Workload

MODELS = ("maxflow", "concurrent")
GB = 1e9
X4 = pcie_bytes_per_s(4, 4)  # Gen4 x4, about 6.3 GB/s
X16 = pcie_bytes_per_s(4, 16)


def build(name: str, nodes: dict[str, NodeKind], links: list[Link]) -> Topology:
    topo = Topology(name)
    for node_id, kind in nodes.items():
        topo.add_node(Node(node_id, kind))
    for lk in links:
        topo.add_link(lk)
    return topo


def ssd_tier(*ids: str, read: float | None = None, share: float = 1.0) -> Tier:
    return Tier("ssd", [Store(i, i, read) for i in ids], share)


def one_ssd_one_gpu() -> Topology:
    return build(
        "one-one",
        {"socket0": NodeKind.SOCKET, "gpu0": NodeKind.GPU, "ssd0": NodeKind.NVME},
        [Link.pcie("socket0", "gpu0", 4, 16), Link.pcie("socket0", "ssd0", 4, 4)],
    )


def switch_machine(uplink_lanes: int = 4) -> Topology:
    """Two GPUs under one switch, two SSDs on the root complex."""
    return build(
        "switch",
        {"socket0": NodeKind.SOCKET, "sw": NodeKind.SWITCH, "gpu0": NodeKind.GPU,
         "gpu1": NodeKind.GPU, "ssd0": NodeKind.NVME, "ssd1": NodeKind.NVME},
        [Link.pcie("socket0", "sw", 4, uplink_lanes), Link.pcie("sw", "gpu0", 4, 16),
         Link.pcie("sw", "gpu1", 4, 16), Link.pcie("socket0", "ssd0", 4, 4),
         Link.pcie("socket0", "ssd1", 4, 4)],
    )


def two_sockets(upi: float) -> Topology:
    """A GPU and an SSD on each socket, the sockets joined by a link of ``upi`` bytes/s."""
    nodes = {}
    links = []
    for i in (0, 1):
        nodes |= {f"socket{i}": NodeKind.SOCKET, f"gpu{i}": NodeKind.GPU, f"ssd{i}": NodeKind.NVME,
                  f"mem{i}": NodeKind.MEMORY}
        links += [Link.pcie(f"socket{i}", f"gpu{i}", 4, 16), Link.pcie(f"socket{i}", f"ssd{i}", 4, 4),
                  Link(f"socket{i}", f"mem{i}", LinkKind.MEMORY, 100 * GB)]
    links.append(Link("socket0", "socket1", LinkKind.INTER_SOCKET, upi))
    return build("two-sockets", nodes, links)


def symmetric_machine() -> Topology:
    """Two identical switches, each with a GPU and two SSDs in slots, under one socket each."""
    nodes: dict[str, NodeKind] = {}
    links: list[Link] = []
    for s in (0, 1):
        nodes |= {f"socket{s}": NodeKind.SOCKET, f"sw{s}": NodeKind.SWITCH, f"mem{s}": NodeKind.MEMORY}
        links += [Link.pcie(f"socket{s}", f"sw{s}", 4, 16),
                  Link(f"socket{s}", f"mem{s}", LinkKind.MEMORY, 80 * GB)]
        for dev, kind, lanes in ((f"gpu{s}", NodeKind.GPU, 16), (f"ssd{2 * s}", NodeKind.NVME, 4),
                                 (f"ssd{2 * s + 1}", NodeKind.NVME, 4)):
            nodes |= {f"slot:{dev}": NodeKind.SLOT, dev: kind}
            links += [Link.pcie(f"sw{s}", f"slot:{dev}", 4, lanes), Link.pcie(f"slot:{dev}", dev, 4, lanes)]
    links.append(Link("socket0", "socket1", LinkKind.INTER_SOCKET, 30 * GB))
    return build("symmetric", nodes, links)


def check_consistent(r: FlowResult, w: Workload, topo: Topology) -> None:
    """What every result must satisfy, whatever the model."""
    total = w.total_demand_bytes
    assert sum(r.store_bytes.values()) == pytest.approx(total, rel=1e-6)
    assert set(r.store_bytes) == {s.id for s in w.stores}
    assert sum(r.tier_shares.values()) == pytest.approx(1.0, rel=1e-6)
    for t in w.tiers:
        assert r.tier_shares[t.name] <= t.max_share + 1e-6
    assert set(r.link_bytes) == set(topo.graph.edges)
    for e, u in r.link_utilisation.items():
        assert -1e-9 <= u <= 1 + 1e-5, (e, u)
    for c in w.consumers:
        got = sum(v for (s, g), v in r.flows.items() if g == c.node_id)
        assert got == pytest.approx(c.demand_bytes, rel=1e-5)
        if r.seconds_per_iteration > 0:
            assert r.inlet_bytes_per_s[c.node_id] == pytest.approx(c.demand_bytes / r.seconds_per_iteration)
    for s in w.stores:
        got = sum(v for (sid, g), v in r.flows.items() if sid == s.id)
        assert got == pytest.approx(r.store_bytes[s.id], rel=1e-5, abs=1e-3 * total)
        if s.read_bytes_per_s is not None:
            assert r.store_bytes[s.id] <= s.read_bytes_per_s * r.seconds_per_iteration * (1 + 1e-5)
    # pass-through nodes (not a store, not a consumer) send on what they receive
    busy = {c.node_id for c in w.consumers} | {s.node_id for s in w.stores}
    for n in topo.graph.nodes:
        if n in busy:
            continue
        inflow = sum(r.link_bytes[p, n] for p in topo.graph.predecessors(n))
        outflow = sum(r.link_bytes[n, q] for q in topo.graph.successors(n))
        assert inflow == pytest.approx(outflow, rel=1e-5, abs=1e-6 * total), n
    for e in r.bottleneck:
        assert r.link_utilisation[e] == pytest.approx(1.0, abs=1e-4), e


# -- analytic cases ----------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("read", [None, 3 * GB, 9 * GB])
def test_one_ssd_one_gpu_time_is_demand_over_the_narrowest_of_link_and_device(model, read):
    topo = one_ssd_one_gpu()
    w = Workload([Consumer("gpu0", 12 * GB)], [ssd_tier("ssd0", read=read)])
    r = solve(topo, w, model)
    rate = min(X4, read or math.inf)
    assert r.seconds_per_iteration == pytest.approx(12 * GB / rate, rel=1e-6)
    assert r.inlet_bytes_per_s["gpu0"] == pytest.approx(rate, rel=1e-6)
    assert r.throughput_bytes_per_s == pytest.approx(rate, rel=1e-6)
    if read is not None and read < X4:
        assert r.saturated_stores == ["ssd0"] and r.bottleneck == []
        assert r.link_utilisation["ssd0", "socket0"] == pytest.approx(read / X4)
    else:
        assert r.saturated_stores == [] and r.bottleneck == [("ssd0", "socket0")]
    assert r.store_bytes == {"ssd0": pytest.approx(12 * GB)}
    assert r.flows == {("ssd0", "gpu0"): pytest.approx(12 * GB)}
    assert r.link_bytes["socket0", "gpu0"] == pytest.approx(12 * GB)
    assert r.link_bytes["gpu0", "socket0"] == 0.0
    check_consistent(r, w, topo)


@pytest.mark.parametrize("model", MODELS)
def test_switch_uplink_is_named_as_the_bottleneck(model):
    topo = switch_machine(uplink_lanes=4)
    w = Workload([Consumer("gpu0", 2 * GB), Consumer("gpu1", 2 * GB)], [ssd_tier("ssd0", "ssd1")])
    r = solve(topo, w, model)
    # all 4 GB go down the x4 uplink; the two SSD links carry 2 GB each in the same time
    assert r.seconds_per_iteration == pytest.approx(4 * GB / X4, rel=1e-6)
    assert r.bottleneck == [("socket0", "sw")]
    assert r.link_utilisation["socket0", "sw"] == pytest.approx(1.0)
    assert r.link_utilisation["ssd0", "socket0"] == pytest.approx(0.5)
    assert r.store_bytes == {"ssd0": pytest.approx(2 * GB), "ssd1": pytest.approx(2 * GB)}
    check_consistent(r, w, topo)


@pytest.mark.parametrize("model", MODELS)
def test_wide_uplink_moves_the_bottleneck_to_the_ssds(model):
    topo = switch_machine(uplink_lanes=16)
    w = Workload([Consumer("gpu0", 2 * GB), Consumer("gpu1", 2 * GB)], [ssd_tier("ssd0", "ssd1")])
    r = solve(topo, w, model)
    assert r.seconds_per_iteration == pytest.approx(2 * GB / X4, rel=1e-6)
    assert r.bottleneck == [("ssd0", "socket0"), ("ssd1", "socket0")]


@pytest.mark.parametrize("model", MODELS)
def test_replicated_gpu_tier_with_half_the_accesses_halves_the_interconnect_bytes(model):
    topo = one_ssd_one_gpu()
    ssd_only = Workload([Consumer("gpu0", 8 * GB)], [ssd_tier("ssd0")])
    cached = Workload([Consumer("gpu0", 8 * GB)],
                      [Tier("hbm", [Store("hbm0", "gpu0")], 0.5, replicated=True), ssd_tier("ssd0")])
    a, b = solve(topo, ssd_only, model), solve(topo, cached, model)
    assert b.link_bytes["socket0", "gpu0"] == pytest.approx(0.5 * a.link_bytes["socket0", "gpu0"])
    assert b.link_bytes["ssd0", "socket0"] == pytest.approx(4 * GB)
    assert b.seconds_per_iteration == pytest.approx(0.5 * a.seconds_per_iteration, rel=1e-6)
    assert b.store_bytes == {"hbm0": pytest.approx(4 * GB), "ssd0": pytest.approx(4 * GB)}
    assert b.tier_shares == {"hbm": pytest.approx(0.5), "ssd": pytest.approx(0.5)}
    assert b.flows[("hbm0", "gpu0")] == pytest.approx(4 * GB)
    check_consistent(b, cached, topo)


def test_cross_socket_link_binds_in_concurrent_but_not_in_maxflow():
    upi = 2 * GB
    topo = two_sockets(upi)
    w = Workload([Consumer("gpu0", 4 * GB), Consumer("gpu1", 4 * GB)], [ssd_tier("ssd0", "ssd1")])
    mf, cc = solve_maxflow(topo, w), solve_concurrent(topo, w)
    # maxflow: each GPU reads its own SSD, nothing crosses
    assert mf.seconds_per_iteration == pytest.approx(4 * GB / X4, rel=1e-6)
    assert mf.link_bytes["socket0", "socket1"] == 0.0
    assert not {("socket0", "socket1"), ("socket1", "socket0")} & set(mf.bottleneck)
    assert mf.flows == {("ssd0", "gpu0"): pytest.approx(4 * GB), ("ssd1", "gpu1"): pytest.approx(4 * GB)}
    # concurrent: each GPU reads half its bytes from the other socket's SSD
    assert cc.seconds_per_iteration == pytest.approx(2 * GB / upi, rel=1e-6)
    assert cc.bottleneck == [("socket0", "socket1"), ("socket1", "socket0")]
    assert cc.link_bytes["socket0", "socket1"] == pytest.approx(2 * GB)
    assert cc.flows[("ssd1", "gpu0")] == pytest.approx(2 * GB)
    assert cc.seconds_per_iteration > mf.seconds_per_iteration
    check_consistent(mf, w, topo)
    check_consistent(cc, w, topo)


def test_memory_tier_prefers_the_local_numa_node():
    topo = two_sockets(upi=40 * GB)
    w = Workload(
        [Consumer("gpu0", 1 * GB)],
        [Tier("cpu", [Store("dram0", "mem0"), Store("dram1", "mem1")], 0.4), ssd_tier("ssd0", "ssd1")],
    )
    r = solve_maxflow(topo, w)
    # the CPU tier is used to the full, from the GPU's own socket
    assert r.tier_shares["cpu"] == pytest.approx(0.4)
    assert r.store_bytes["dram0"] == pytest.approx(0.4 * GB)
    check_consistent(r, w, topo)


@pytest.mark.parametrize("model", MODELS)
def test_nvlink_lets_a_gpu_relay_for_a_peer_behind_a_narrow_link(model):
    topo = build(
        "nvlink",
        {"socket0": NodeKind.SOCKET, "gpu0": NodeKind.GPU, "gpu1": NodeKind.GPU,
         "ssd0": NodeKind.NVME, "ssd1": NodeKind.NVME},
        [Link.pcie("socket0", "gpu0", 4, 1), Link.pcie("socket0", "gpu1", 4, 16),
         Link.pcie("socket0", "ssd0", 4, 4), Link.pcie("socket0", "ssd1", 4, 4),
         Link("gpu0", "gpu1", LinkKind.NVLINK, 50 * GB)],
    )
    w = Workload([Consumer("gpu0", 1 * GB), Consumer("gpu1", 1 * GB)], [ssd_tier("ssd0", "ssd1")])
    relay = solve(topo, w, model)
    direct = solve(topo, w, model, nvlink_relay=False)
    assert direct.seconds_per_iteration == pytest.approx(1 * GB / pcie_bytes_per_s(4, 1), rel=1e-6)
    assert direct.bottleneck == [("socket0", "gpu0")]
    assert relay.seconds_per_iteration == pytest.approx(2 * GB / (2 * X4), rel=1e-6)
    assert relay.link_bytes["gpu1", "gpu0"] > 0
    check_consistent(relay, w, topo)


# -- properties ----------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_time_scales_linearly_with_demand(model):
    topo = symmetric_machine()
    tiers = [Tier("cpu", [Store("dram0", "mem0"), Store("dram1", "mem1")], 0.3),
             ssd_tier("ssd0", "ssd1", "ssd2", "ssd3", read=5 * GB)]
    base = solve(topo, Workload([Consumer("gpu0", 1 * GB), Consumer("gpu1", 2 * GB)], tiers), model)
    triple = solve(topo, Workload([Consumer("gpu0", 3 * GB), Consumer("gpu1", 6 * GB)], tiers), model)
    assert triple.seconds_per_iteration == pytest.approx(3 * base.seconds_per_iteration, rel=1e-6)
    assert triple.bottleneck == base.bottleneck
    for sid, b in base.store_bytes.items():
        assert triple.store_bytes[sid] == pytest.approx(3 * b, rel=1e-5, abs=1.0)


@pytest.mark.parametrize("model", MODELS)
def test_symmetric_devices_get_equal_bandwidth_and_equal_store_traffic(model):
    topo = symmetric_machine()
    w = Workload(
        [Consumer("gpu0", 2 * GB), Consumer("gpu1", 2 * GB)],
        [Tier("cpu", [Store("dram0", "mem0"), Store("dram1", "mem1")], 0.25),
         ssd_tier("ssd0", "ssd1", "ssd2", "ssd3", read=6 * GB)],
    )
    r = solve(topo, w, model)
    assert r.inlet_bytes_per_s["gpu0"] == pytest.approx(r.inlet_bytes_per_s["gpu1"])
    ssd = [r.store_bytes[f"ssd{i}"] for i in range(4)]
    assert ssd == pytest.approx([ssd[0]] * 4, rel=1e-6)
    assert r.store_bytes["dram0"] == pytest.approx(r.store_bytes["dram1"], rel=1e-6)
    up = [r.link_utilisation["socket0", "sw0"], r.link_utilisation["socket1", "sw1"]]
    assert up[0] == pytest.approx(up[1], abs=1e-6)
    check_consistent(r, w, topo)


@pytest.mark.parametrize("model", MODELS)
def test_tie_break_off_keeps_the_time_and_the_bottleneck(model):
    topo = symmetric_machine()
    w = Workload([Consumer("gpu0", 2 * GB), Consumer("gpu1", 1 * GB)],
                 [Tier("cpu", [Store("dram0", "mem0"), Store("dram1", "mem1")], 0.3),
                  ssd_tier("ssd0", "ssd1", "ssd2", "ssd3")])
    full = solve(topo, w, model)
    fast = solve(topo, w, model, tie_break=False)
    assert fast.seconds_per_iteration == pytest.approx(full.seconds_per_iteration, rel=1e-6)
    assert fast.bottleneck == full.bottleneck
    check_consistent(fast, w, topo)


def test_everything_served_locally_takes_no_time():
    topo = one_ssd_one_gpu()
    w = Workload([Consumer("gpu0", 1 * GB)], [Tier("hbm", [Store("hbm0", "gpu0")], 1.0, replicated=True)])
    for model in MODELS:
        r = solve(topo, w, model)
        assert r.seconds_per_iteration == 0.0
        assert r.inlet_bytes_per_s["gpu0"] == math.inf and r.throughput_bytes_per_s == math.inf
        assert r.bottleneck == [] and r.store_bytes == {"hbm0": pytest.approx(GB)}


@pytest.mark.parametrize("model", MODELS)
def test_a_replicated_read_limit_bounds_the_time(model):
    topo = one_ssd_one_gpu()
    hbm = Tier("hbm", [Store("hbm0", "gpu0", read_bytes_per_s=1000 * GB)], 1.0, replicated=True)
    r = solve(topo, Workload([Consumer("gpu0", 10 * GB)], [hbm]), model)
    assert r.seconds_per_iteration == pytest.approx(0.01, rel=1e-6)
    assert r.saturated_stores == ["hbm0"]
    # with the SSD beside it, both run flat out: 10 GB at 1000 + 6.3 GB/s
    r = solve(topo, Workload([Consumer("gpu0", 10 * GB)], [hbm, ssd_tier("ssd0")]), model)
    assert r.seconds_per_iteration == pytest.approx(10 * GB / (1000 * GB + X4), rel=1e-6)
    assert r.saturated_stores == ["hbm0"] and r.bottleneck == [("ssd0", "socket0")]
    assert r.store_bytes["ssd0"] == pytest.approx(X4 * r.seconds_per_iteration, rel=1e-6)


@st.composite
def machines(draw, nvlink: bool = False):
    """A random PCIe tree (1–2 sockets, switches, optional slots) and a workload on it."""
    topo = Topology("random")
    sockets = [f"socket{i}" for i in range(draw(st.integers(1, 2)))]
    hubs = list(sockets)
    for s in sockets:
        topo.add_node(Node(s, NodeKind.SOCKET))
        mem = "mem" + s[len("socket"):]
        topo.add_node(Node(mem, NodeKind.MEMORY))
        topo.add_link(Link(s, mem, LinkKind.MEMORY, draw(st.floats(5, 200)) * GB))
    if len(sockets) == 2:
        topo.add_link(Link("socket0", "socket1", LinkKind.INTER_SOCKET, draw(st.floats(1, 80)) * GB))
    for i in range(draw(st.integers(0, 3))):
        sw = f"sw{i}"
        topo.add_node(Node(sw, NodeKind.SWITCH))
        topo.add_link(Link.pcie(draw(st.sampled_from(hubs)), sw, draw(st.sampled_from([3, 4, 5])),
                                draw(st.sampled_from([4, 8, 16]))))
        hubs.append(sw)

    def attach(dev: str, kind: NodeKind, lanes: list[int]) -> None:
        topo.add_node(Node(dev, kind))
        parent = draw(st.sampled_from(hubs))
        gen, width = draw(st.sampled_from([3, 4, 5])), draw(st.sampled_from(lanes))
        if draw(st.booleans()):
            slot = f"slot:{dev}"
            topo.add_node(Node(slot, NodeKind.SLOT))
            topo.add_link(Link.pcie(parent, slot, gen, max(lanes)))
            parent = slot
        topo.add_link(Link.pcie(parent, dev, gen, width))

    gpus = [f"gpu{i}" for i in range(draw(st.integers(1, 4)))]
    ssds = [f"nvme{i}" for i in range(draw(st.integers(1, 5)))]
    for g in gpus:
        attach(g, NodeKind.GPU, [4, 8, 16])
    for s in ssds:
        attach(s, NodeKind.NVME, [1, 2, 4])
    if nvlink and len(gpus) >= 2:
        for _ in range(draw(st.integers(1, 3))):
            a, b = draw(st.permutations(gpus))[:2]
            if topo.link_between(a, b) is None:
                topo.add_link(Link(a, b, LinkKind.NVLINK, draw(st.floats(5, 100)) * GB))
    consumers = [Consumer(g, draw(st.floats(0.1, 10)) * GB) for g in gpus]
    tiers = []
    if draw(st.booleans()):
        tiers.append(Tier("hbm", [Store(f"hbm{g}", g) for g in gpus], draw(st.floats(0, 0.5)),
                          replicated=True))
    if draw(st.booleans()):
        mems = [n.id for n in topo.nodes(NodeKind.MEMORY)]
        tiers.append(Tier("cpu", [Store(f"dram{m}", m) for m in mems], draw(st.floats(0, 0.6))))
    reads = st.one_of(st.none(), st.floats(1, 10).map(lambda x: x * GB))
    tiers.append(Tier("ssd", [Store(s, s, draw(reads)) for s in ssds], 1.0))
    return topo, Workload(consumers, tiers)


def reference_maxflow_time(topo: Topology, w: Workload) -> float:
    """The paper's model, built and bisected independently with networkx (trees only)."""
    total = w.total_demand_bytes

    def flow(T: float) -> float:
        g = nx.DiGraph()
        for u, v, data in topo.graph.edges(data=True):
            g.add_edge(u, v, capacity=data["bytes_per_s"] * T)
        for t in w.tiers:
            if t.replicated:
                for c in w.consumers:
                    s = next(s for s in t.stores if s.node_id == c.node_id)
                    g.add_edge("s", ("rep", s.id), capacity=t.max_share * c.demand_bytes)
                    if s.read_bytes_per_s is None:
                        g.add_edge(("rep", s.id), ("sink", c.node_id))
                    else:
                        g.add_edge(("rep", s.id), ("sink", c.node_id), capacity=s.read_bytes_per_s * T)
                continue
            g.add_edge("s", ("tier", t.name), capacity=t.max_share * total)
            for s in t.stores:
                if s.read_bytes_per_s is None:
                    g.add_edge(("tier", t.name), ("store", s.id))
                else:
                    g.add_edge(("tier", t.name), ("store", s.id), capacity=s.read_bytes_per_s * T)
                g.add_edge(("store", s.id), s.node_id)
        for c in w.consumers:
            g.add_edge(c.node_id, ("sink", c.node_id))
            g.add_edge(("sink", c.node_id), "t", capacity=c.demand_bytes)
        return nx.maximum_flow_value(g, "s", "t")

    enough = total - 1e-9 * min(c.demand_bytes for c in w.consumers)
    lo, hi = 0.0, 1e-3
    while flow(hi) < enough:
        lo, hi = hi, hi * 2
    for _ in range(60):
        mid = (lo + hi) / 2
        if flow(mid) >= enough:
            hi = mid
        else:
            lo = mid
    return hi


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(machines())
def test_maxflow_never_beats_concurrent_and_both_are_consistent(case):
    topo, w = case
    mf = solve_maxflow(topo, w)
    cc = solve_concurrent(topo, w)
    assert mf.seconds_per_iteration <= cc.seconds_per_iteration * (1 + 1e-6) + 1e-12
    check_consistent(mf, w, topo)
    check_consistent(cc, w, topo)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(machines())
def test_maxflow_time_matches_an_independent_networkx_bisection(case):
    topo, w = case
    expected = reference_maxflow_time(topo, w)
    assert solve_maxflow(topo, w).seconds_per_iteration == pytest.approx(expected, rel=1e-6)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(machines(nvlink=True))
def test_nvlink_cycles_keep_the_models_ordered(case):
    topo, w = case
    mf = solve_maxflow(topo, w)
    cc = solve_concurrent(topo, w)
    assert mf.seconds_per_iteration <= cc.seconds_per_iteration * (1 + 1e-6) + 1e-12
    assert solve_maxflow(topo, w, nvlink_relay=False).seconds_per_iteration >= (
        mf.seconds_per_iteration * (1 - 1e-6))
    check_consistent(mf, w, topo)
    check_consistent(cc, w, topo)


# -- infeasible and invalid inputs ---------------------------------------------


def test_tier_shares_below_one_are_refused_naming_the_tiers():
    with pytest.raises(PlannerError, match=r"at most 70%.*hbm 20%, cpu 50%.*must reach 100%"):
        Workload([Consumer("gpu0", GB)],
                 [Tier("hbm", [Store("h", "gpu0")], 0.2, replicated=True),
                  Tier("cpu", [Store("m", "mem0")], 0.5)])


@pytest.mark.parametrize("model", MODELS)
def test_a_consumer_without_a_path_to_any_store(model):
    topo = one_ssd_one_gpu()
    topo.add_node(Node("gpu9", NodeKind.GPU))
    w = Workload([Consumer("gpu0", GB), Consumer("gpu9", GB)], [ssd_tier("ssd0")])
    with pytest.raises(PlannerError, match="consumer 'gpu9' has no path from any store"):
        solve(topo, w, model)


@pytest.mark.parametrize("model", MODELS)
def test_a_zero_capacity_path_carries_nothing(model):
    topo = one_ssd_one_gpu()
    topo.graph.edges["ssd0", "socket0"]["bytes_per_s"] = 0.0  # a dead direction
    w = Workload([Consumer("gpu0", GB)], [ssd_tier("ssd0")])
    with pytest.raises(PlannerError, match="consumer 'gpu0' has no path from any store"):
        solve(topo, w, model)


@pytest.mark.parametrize("model", MODELS)
def test_a_consumer_reaching_too_small_a_share(model):
    topo = two_sockets(upi=10 * GB)
    topo.remove_node("ssd1")
    topo.replace_link(Link.pcie("socket1", "gpu1", 4, 16))
    topo.graph.remove_edge("socket0", "socket1")  # socket 1 cannot read socket 0 any more
    w = Workload([Consumer("gpu0", GB), Consumer("gpu1", GB)],
                 [Tier("cpu", [Store("dram1", "mem1")], 0.3), ssd_tier("ssd0")])
    with pytest.raises(PlannerError, match=r"'gpu1' reaches no store of tier\(s\) ssd.*at most 30%"):
        solve(topo, w, model)


def test_concurrent_needs_every_consumer_to_reach_every_sharded_store():
    topo = two_sockets(upi=10 * GB)
    topo.remove_node("mem0")
    w = Workload([Consumer("gpu0", GB), Consumer("gpu1", GB)],
                 [ssd_tier("ssd0", "ssd1")])
    for e in (("socket0", "socket1"), ("socket1", "socket0")):
        topo.graph.edges[e]["bytes_per_s"] = 0.0
    assert solve_maxflow(topo, w).seconds_per_iteration == pytest.approx(GB / X4)
    with pytest.raises(PlannerError, match="concurrent model.*tier\\(s\\) ssd"):
        solve_concurrent(topo, w)


@pytest.mark.parametrize("model", MODELS)
def test_unknown_node_ids(model):
    topo = one_ssd_one_gpu()
    with pytest.raises(PlannerError, match="consumer 'gpu7' is not a node of topology 'one-one'"):
        solve(topo, Workload([Consumer("gpu7", GB)], [ssd_tier("ssd0")]), model)
    with pytest.raises(PlannerError, match="store 'ssd3' of tier 'ssd' sits on node 'ssd3'"):
        solve(topo, Workload([Consumer("gpu0", GB)], [ssd_tier("ssd3")]), model)


@pytest.mark.parametrize("model", MODELS)
def test_links_of_unknown_bandwidth_need_an_assumed_figure(model):
    topo = build(
        "unknown",
        {"socket0": NodeKind.SOCKET, "gpu0": NodeKind.GPU, "ssd0": NodeKind.NVME, "nic0": NodeKind.NIC},
        [Link.pcie("socket0", "gpu0", 4, 16), Link.pcie("socket0", "ssd0", None, None),
         Link.pcie("socket0", "nic0", None, None)],
    )
    w = Workload([Consumer("gpu0", GB)], [ssd_tier("ssd0")])
    with pytest.raises(PlannerError, match=r"link ssd0 → socket0 \(pcie\).*unknown_link_bytes_per_s="):
        solve(topo, w, model)
    r = solve(topo, w, model, unknown_link_bytes_per_s=2 * GB)
    assert r.seconds_per_iteration == pytest.approx(0.5)
    assert r.link_utilisation["nic0", "socket0"] == 0.0
    # a link no flow can use (the NIC's) needs no figure
    topo.replace_link(Link.pcie("socket0", "ssd0", 4, 4))
    assert solve(topo, w, model).seconds_per_iteration == pytest.approx(GB / X4)
    with pytest.raises(PlannerError, match="unknown_link_bytes_per_s must be a positive number"):
        solve(topo, w, model, unknown_link_bytes_per_s=-1)


@pytest.mark.parametrize("model", MODELS)
def test_replicated_tier_needs_a_store_on_every_consumer(model):
    topo = switch_machine()
    w = Workload([Consumer("gpu0", GB), Consumer("gpu1", GB)],
                 [Tier("hbm", [Store("h0", "gpu0")], 0.5, replicated=True), ssd_tier("ssd0", "ssd1")])
    with pytest.raises(PlannerError, match=r"replicated tier 'hbm' has no store on consumer\(s\) gpu1"):
        solve(topo, w, model)


def test_solve_rejects_unknown_models_and_options():
    topo = one_ssd_one_gpu()
    w = Workload([Consumer("gpu0", GB)], [ssd_tier("ssd0")])
    with pytest.raises(PlannerError, match="unknown flow model 'fastest'"):
        solve(topo, w, "fastest")
    with pytest.raises(PlannerError, match="rel_tol"):
        solve_maxflow(topo, w, rel_tol=0)
    with pytest.raises(PlannerError, match="expected a Topology"):
        solve_maxflow(w, topo)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Consumer("gpu0", 0), "demand_bytes must be a positive finite number"),
        (lambda: Consumer("gpu0", -1e9), "demand_bytes must be a positive finite number"),
        (lambda: Consumer("gpu0", math.nan), "demand_bytes must be a positive finite number"),
        (lambda: Consumer("", 1e9), "node_id must be a non-empty string"),
        (lambda: Store("s", "n", read_bytes_per_s=0), "read_bytes_per_s must be a positive"),
        (lambda: Tier("t", [Store("s", "n")], -0.1), r"max_share must be in \[0, 1\]"),
        (lambda: Tier("t", [Store("s", "n")], 1.01), r"max_share must be in \[0, 1\]"),
        (lambda: Tier("t", [], 1.0), "tier 't' has no stores"),
        (lambda: Tier("t", [Store("s", "a"), Store("s", "b")], 1.0), "store ids repeated: s"),
        (lambda: Tier("t", [Store("a", "n"), Store("b", "n")], 0.5, replicated=True),
         "several stores on node"),
        (lambda: Tier("t", ["not a store"], 1.0), "must hold Store objects"),
        (lambda: Workload([], [Tier("t", [Store("s", "n")], 1.0)]), "has no consumers"),
        (lambda: Workload([Consumer("g", 1.0), Consumer("g", 2.0)], [Tier("t", [Store("s", "n")], 1.0)]),
         "several consumers on node"),
        (lambda: Workload([Consumer("g", 1.0)], [Tier("t", [Store("s", "n")], 1.0),
                                                 Tier("t", [Store("u", "n")], 1.0)]),
         "tier names repeated"),
        (lambda: Workload([Consumer("g", 1.0)], [Tier("a", [Store("s", "n")], 1.0),
                                                 Tier("b", [Store("s", "m")], 1.0)]),
         "store ids repeated across tiers"),
    ],
)
def test_workload_parts_are_validated_on_construction(make, message):
    with pytest.raises(PlannerError, match=message):
        make()


def test_workload_helpers():
    w = Workload([Consumer("g0", 1.0), Consumer("g1", 3.0)],
                 (Tier("cpu", (Store("m", "mem0"),), 0.5), Tier("ssd", [Store("s", "n")], 1.0)))
    assert w.total_demand_bytes == 4.0
    assert [s.id for s in w.stores] == ["m", "s"]
    assert w.tier_of("s").name == "ssd"
    assert isinstance(w.tiers[1].stores, tuple)
    with pytest.raises(PlannerError, match="no store 'x'"):
        w.tier_of("x")
