"""Planning for several nodes: NICs on the real captures, the network as a capacity, where NICs go."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moment.cli import main
from planner.errors import PlannerError
from planner.flow import solve
from planner.multinode import (
    NIC_MODELS,
    NetworkDemand,
    data_nics,
    place_nics,
    port_rate,
    recognise_nic,
    remote_share,
    solve_nodes,
)
from planner.topology.discover import topology_from_files
from planner.topology.model import NodeKind
from planner.workload import Consumer, Store, Tier, Workload
from tests.conftest import topology_fixture


def _machine(name):
    if name == "xd665":
        d = "hpe-cray-xd665-2x-epyc9354-h100"
        return topology_from_files(lspci_vvv=[topology_fixture(d, "lspci-vvnn.txt")],
                                   dmidecode=topology_fixture(d, "dmidecode.txt"))
    d = {"ndv4": "azure-ndv4-a100-nccl", "p4d": "aws-p4d-24xlarge-nccl"}[name]
    return topology_from_files(nccl_topo=topology_fixture(d, "nccl-topo.xml"))


def _in_memory(t):
    """Every GPU reads 1 GB per iteration from host memory (a DDStore-like in-memory store)."""
    return Workload([Consumer(g.id, 1e9) for g in t.nodes(NodeKind.GPU)],
                    [Tier("cpu-memory", [Store(m.id, m.id) for m in t.nodes(NodeKind.MEMORY)], 1.0)])


@pytest.mark.parametrize("name", ["ndv4", "p4d", "xd665"])
def test_one_node_is_the_maxflow_model(name):
    t = _machine(name)
    w = _in_memory(t)
    mf = solve(t, w, model="maxflow", unknown_link_bytes_per_s=16e9)
    one = solve_nodes(t, w, NetworkDemand(1, 0.0), unknown_link_bytes_per_s=16e9)
    assert one.seconds_per_iteration == pytest.approx(mf.seconds_per_iteration, rel=1e-6)


def test_the_captures_data_nics_and_their_gpudirect_paths():
    ndv4, p4d, xd = _machine("ndv4"), _machine("p4d"), _machine("xd665")
    assert len(data_nics(ndv4)) == 8 and len(data_nics(p4d)) == 4
    # the XD665's two ConnectX-5 carry data; its 10 GbE OCP card and the board's 1 GbE port do not
    assert sorted(recognise_nic(n).name for n in data_nics(xd)) == ["connectx-5-100g"] * 2
    assert port_rate(p4d, data_nics(p4d)[0]) == pytest.approx(100e9 / 8)  # EFA: its port, below its x16 link
    for t, per_nic in ((ndv4, 2), (p4d, 2), (xd, 1)):
        r = solve_nodes(t, _in_memory(t), NetworkDemand(2, 0.5), unknown_link_bytes_per_s=16e9)
        assert all(len(g) == per_nic for g in r.gdr_paths.values())  # each NIC under a GPU's switch


@pytest.mark.parametrize("name", ["ndv4", "p4d"])
def test_gpudirect_keeps_the_inlet_and_a_bounce_through_memory_costs(name):
    """NICs under the GPUs' switches: fetched rows never climb to the socket, served ones take the reads'
    place on the uplink: the same inlet as one node. Through host memory they cross the uplink twice."""
    t = _machine(name)
    w = _in_memory(t)
    one = solve_nodes(t, w, NetworkDemand(1, 0.0))
    for n in (2, 4):
        gdr = solve_nodes(t, w, NetworkDemand(n, remote_share(n)))
        bounce = solve_nodes(t, w, NetworkDemand(n, remote_share(n), gpudirect=False))
        assert gdr.mean_inlet_bytes_per_s == pytest.approx(one.mean_inlet_bytes_per_s, rel=1e-6)
        assert bounce.mean_inlet_bytes_per_s < 0.8 * gdr.mean_inlet_bytes_per_s
        assert sum(gdr.nic_in_bytes.values()) == pytest.approx(remote_share(n) * 8e9, rel=1e-6)
        assert sum(gdr.nic_out_bytes.values()) == pytest.approx(remote_share(n) * 8e9, rel=1e-6)


def test_two_connectx5_ports_bound_four_h100s_and_a_400g_nic_in_a_free_slot_helps():
    t = _machine("xd665")
    w = _in_memory(t)
    two = solve_nodes(t, w, NetworkDemand(2, 0.5), unknown_link_bytes_per_s=16e9)
    # 2 ports x 12.5 GB/s carry half of 4 GPUs' reads each way
    assert two.mean_inlet_bytes_per_s == pytest.approx(2 * 12.5e9 / (4 * 0.5), rel=1e-6)
    assert any(b.startswith("port:") for b in two.bottleneck)
    best = place_nics(t, w, NetworkDemand(2, 0.5), NIC_MODELS["connectx-7-400g"], 1, unknown_link_bytes_per_s=16e9)
    assert best[0].slots == ("slot:dmi:0x001D",)  # the free x16 slot, not the x8 one
    assert best[0].mean_inlet_bytes_per_s > 1.5 * two.mean_inlet_bytes_per_s
    assert best[0].mean_inlet_bytes_per_s >= best[-1].mean_inlet_bytes_per_s
    with pytest.raises(PlannerError, match="need 4 free slot"):
        place_nics(t, w, NetworkDemand(2, 0.5), NIC_MODELS["connectx-7-400g"], 4)


@given(st.integers(1, 16), st.data())
def test_remote_share_is_what_a_node_does_not_hold(nodes, data):
    w = data.draw(st.integers(1, nodes))
    hot = data.draw(st.floats(0, 1))
    g = data.draw(st.floats(0, 1))
    r = remote_share(nodes, replicas=w, hot_read_share=hot, gpu_cache_share=g)
    assert 0 <= r <= 1 - g + 1e-12
    if nodes > 1:
        assert remote_share(nodes, replicas=w, hot_read_share=hot, gpu_cache_share=g) \
            <= remote_share(nodes + 1, replicas=w, hot_read_share=hot, gpu_cache_share=g) + 1e-12
    assert remote_share(nodes, replicas=nodes, hot_read_share=1.0) == pytest.approx(0.0, abs=1e-12)


def test_moment_plan_nodes(capsys):
    azure = topology_fixture("azure-ndv4-a100-nccl", "nccl-topo.xml")
    assert main(["plan", "--nccl-topo", str(azure), "--cpu-cache-share", "1", "--nodes", "4", "--top", "1",
                 "--json"]) == 0
    nodes = json.loads(capsys.readouterr().out)["nodes"]
    assert nodes["remote_share"] == 0.75 and nodes["gpudirect"] is True
    assert nodes["with_its_nics"]["mean_inlet_bytes_per_s"] == pytest.approx(
        nodes["one_node"]["mean_inlet_bytes_per_s"], rel=1e-6)
    assert main(["plan", "--machine", "moment-b", "--gpus", "2", "--ssds", "4", "--nodes", "2", "--top", "1"]) == 2
    err = capsys.readouterr().err
    assert "needs NICs" in err and "--nics K" in err and err.count("\n") == 1
    assert main(["plan", "--machine", "moment-b", "--gpus", "2", "--ssds", "4", "--nodes", "2", "--nics", "1",
                 "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "as one node of 2" in out and "(best)" in out and "GPUDirect path" in out
