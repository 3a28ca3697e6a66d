"""``nvidia-smi topo -m``: the parser on real captures, the coarse topology, and NVLink merging."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.errors import ParseError, PlannerError
from planner.topology.model import Link, LinkKind, Node, NodeKind, Topology
from planner.topology.nvidia.nvlink import DEFAULT_NVLINK_BYTES_PER_S, nvlink_rate
from planner.topology.nvidia.smi import apply_nvidia_smi, topology_from_nvidia_smi
from planner.topology.nvidia.smi_matrix import TopoMatrix, parse_cpu_list, parse_nvidia_smi_topo
from tests.conftest import expected_counts, topology_fixture
from tests.fuzz import mutated_text, parses_or_refuses

DGX = "dgx-a100-class-8x-a100-sxm-2x-epyc7742-topo"
ASUS = "asus-esc8000a-e12-epyc9374f-stelline"
PUGET = "puget-rackstation-wrx90-trpro-stelline"
MACHINES = (DGX, ASUS, PUGET)


def load(machine: str) -> tuple[str, str]:
    path = topology_fixture(machine, "nvidia-smi-topo.txt")
    return path.read_text(), str(path)


def matrix_of(machine: str) -> TopoMatrix:
    text, src = load(machine)
    return parse_nvidia_smi_topo(text, src)


def topo_of(machine: str, **kw) -> Topology:
    text, src = load(machine)
    return topology_from_nvidia_smi(parse_nvidia_smi_topo(text, src), name=machine, source=src, **kw)


def parent_id(topo: Topology, dev: str) -> str:
    return topo.parent(f"{'gpu' if dev.startswith('GPU') else 'nic'}:{dev}").id


def socket_id(topo: Topology, dev: str) -> str:
    return topo.socket_of(f"{'gpu' if dev.startswith('GPU') else 'nic'}:{dev}").id


# -- DGX A100 class (tab-separated, no GPU NUMA ID column) -----------------------------

def test_dgx_matrix_devices_and_legend():
    m = matrix_of(DGX)
    assert m.gpus == tuple(f"GPU{i}" for i in range(8))
    assert [d for d in m.devices if m.kind(d) == NodeKind.NIC] == [f"NIC{i}" for i in range(10)]
    assert m.nic_names == {f"NIC{i}": f"mlx5_{i}" for i in range(10)}
    assert m.cpu_affinity["GPU0"] == "48-63,176-191" and m.numa_node("GPU0") == 3
    assert m.cpu_affinity["GPU2"] == "16-31,144-159" and m.numa_node("GPU3") == 1
    assert m.cpu_affinity["GPU4"] == "112-127,240-255" and m.numa_node("GPU5") == 7
    assert m.cpu_affinity["GPU6"] == "80-95,208-223" and m.numa_node("GPU7") == 5
    # NIC rows leave the affinity columns empty; there is no GPU NUMA ID column
    assert all(m.cpu_affinity[f"NIC{i}"] is None and m.numa_affinity[f"NIC{i}"] is None for i in range(10))
    assert all(v is None for v in m.gpu_numa_id.values())


def test_dgx_matrix_relations():
    m = matrix_of(DGX)
    gpus = m.gpus
    assert all(m.relation[(a, b)] == "NV12" for a in gpus for b in gpus if a != b)
    pairs = {0: (0, 1), 1: (2, 3), 2: (4, 5), 3: (6, 7)}
    for k, (ga, gb) in pairs.items():
        for g in (ga, gb):
            for n in range(10):
                want = "PXB" if n in (2 * k, 2 * k + 1) else "SYS"
                assert m.relation[(f"GPU{g}", f"NIC{n}")] == want
                assert m.relation[(f"NIC{n}", f"GPU{g}")] == want
        assert m.relation[(f"NIC{2 * k}", f"NIC{2 * k + 1}")] == "PXB"
    assert m.relation[("NIC8", "NIC9")] == "PIX"
    assert all(m.relation[(f"NIC{n}", f"GPU{g}")] == "SYS" for n in (8, 9) for g in range(8))


def test_dgx_topology_nvlinks():
    t = topo_of(DGX)
    links = t.links(LinkKind.NVLINK)
    assert len(links) == 28
    pairs = {frozenset((lk.src, lk.dst)) for lk in links}
    assert len(pairs) == 28 and all(len(p) == 2 for p in pairs)
    for lk in links:
        assert lk.attrs["nvlink_count"] == 12
        assert lk.bytes_per_s == pytest.approx(12 * DEFAULT_NVLINK_BYTES_PER_S)
        assert lk.bandwidth_source == "nvidia-smi-table"
        assert lk.attrs["via"] == "nvswitch"  # 7 peers × 12 links is more than any GPU has
    assert any("NVSwitch" in n for n in t.notes)


def test_dgx_topology_groups_and_sockets():
    t = topo_of(DGX)
    counts = t.counts()
    assert counts["gpu"] == 8 and counts["nic"] == 10
    for numa, (ga, gb, na, nb) in {3: (0, 1, 0, 1), 1: (2, 3, 2, 3), 7: (4, 5, 4, 5), 5: (6, 7, 6, 7)}.items():
        members = [f"GPU{ga}", f"GPU{gb}", f"NIC{na}", f"NIC{nb}"]
        sw = {parent_id(t, d) for d in members}
        assert len(sw) == 1
        switch = t.node(sw.pop())
        assert switch.kind == NodeKind.SWITCH and switch.attrs["inferred"] and switch.attrs["evidence"] == "PXB"
        assert {socket_id(t, d) for d in members} == {f"socket{numa}"}
        assert t.node(f"socket{numa}").numa_node == numa
    # NIC8/NIC9: PIX to each other, SYS to everything else, no affinity → one switch under socket?
    assert parent_id(t, "NIC8") == parent_id(t, "NIC9")
    assert t.node(parent_id(t, "NIC8")).attrs["evidence"] == "PIX"
    assert socket_id(t, "NIC8") == socket_id(t, "NIC9") == "socket?"
    assert any("NIC8, NIC9" in n and "other than 1, 3, 5, 7" in n for n in t.notes)
    # one socket per NUMA node seen, and a note that the matrix cannot merge them into packages
    assert sorted(s.id for s in t.nodes(NodeKind.SOCKET)) == ["socket1", "socket3", "socket5", "socket7", "socket?"]
    assert any("NPS" in n for n in t.notes)
    # PCIe capacities are unknown without a caller's figures
    assert all(lk.bytes_per_s is None for lk in t.links(LinkKind.PCIE))


def test_dgx_numa_to_socket_merges_nps4_nodes():
    # lscpu of this machine: NUMA 0-3 on package 0, 4-7 on package 1
    t = topo_of(DGX, numa_to_socket={0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1})
    assert socket_id(t, "GPU0") == socket_id(t, "GPU2") == "socket0"
    assert socket_id(t, "GPU4") == socket_id(t, "GPU6") == "socket1"
    assert t.node("socket0").attrs["numa_nodes"] == [1, 3]


def test_gpu_name_and_pcie_figures_from_the_caller():
    t = topo_of(DGX, gpu_name="NVIDIA A100-SXM4-40GB", pcie_links={"GPU0": (4, 16)})
    lk = t.links(LinkKind.NVLINK)[0]
    assert lk.attrs["nvlink_generation"] == 3 and lk.attrs["rate_basis"] == "gpu-name"
    up = t.link_between(parent_id(t, "GPU0"), "gpu:GPU0")
    assert up.pcie_gen == 4 and up.lanes == 16 and up.bytes_per_s > 25e9
    assert t.link_between(parent_id(t, "GPU1"), "gpu:GPU1").bytes_per_s is None


# -- stelline captures (space-aligned, with GPU NUMA ID) -------------------------------

def test_asus_matrix_and_topology():
    m = matrix_of(ASUS)
    assert m.gpus == ("GPU0", "GPU1", "GPU2", "GPU3")
    assert [m.numa_node(g) for g in m.gpus] == [0, 0, 1, 1]
    assert [m.cpu_affinity[g] for g in m.gpus] == ["0-31", "0-31", "32-63", "32-63"]
    assert all(m.gpu_numa_id[g] is None for g in m.gpus)  # the column says N/A
    assert m.relation[("GPU0", "GPU1")] == m.relation[("GPU2", "GPU3")] == "NODE"
    assert m.relation[("GPU0", "GPU2")] == m.relation[("GPU1", "GPU3")] == "SYS"
    assert m.relation[("NIC0", "NIC1")] == m.relation[("NIC2", "NIC3")] == "PIX"
    assert m.relation[("GPU0", "NIC0")] == m.relation[("GPU3", "NIC2")] == "NODE"
    assert m.nic_names == {"NIC0": "mlx5_0", "NIC1": "mlx5_1", "NIC2": "mlx5_2", "NIC3": "mlx5_3"}

    t = topo_of(ASUS)
    assert t.counts()["gpu"] == 4 and t.counts()["socket"] == 2
    assert [socket_id(t, g) for g in m.gpus] == ["socket0", "socket0", "socket1", "socket1"]
    assert parent_id(t, "GPU0") == "socket0" and parent_id(t, "GPU2") == "socket1"  # NODE: no switch
    assert parent_id(t, "NIC0") == parent_id(t, "NIC1") != parent_id(t, "NIC2")
    assert t.node(parent_id(t, "NIC0")).kind == NodeKind.SWITCH
    # the NICs have no affinity of their own: NODE to GPU0/GPU1 puts them on NUMA 0
    assert socket_id(t, "NIC0") == "socket0" and socket_id(t, "NIC3") == "socket1"
    assert not t.links(LinkKind.NVLINK)


def test_puget_matrix_and_topology():
    m = matrix_of(PUGET)
    assert m.gpus == ("GPU0", "GPU1")
    assert m.relation[("GPU0", "GPU1")] == "PHB"
    assert m.relation[("NIC0", "NIC1")] == "PIX"
    assert m.relation[("GPU1", "NIC0")] == "NODE"
    t = topo_of(PUGET)
    assert t.counts()["socket"] == 1 and t.counts()["gpu"] == 2
    assert parent_id(t, "GPU0") == parent_id(t, "GPU1") == "socket0"
    g0, g1 = t.node("gpu:GPU0"), t.node("gpu:GPU1")
    assert g0.attrs["host_bridge"] == g1.attrs["host_bridge"]  # PHB: one host bridge
    assert socket_id(t, "NIC0") == "socket0"


@pytest.mark.parametrize("machine", MACHINES)
def test_counts_match_expected_json(machine):
    expected = expected_counts()[machine]
    counts = topo_of(machine).counts()
    for kind in ("gpu", "nic"):
        if kind in expected:
            assert counts[kind] == expected[kind]


@pytest.mark.parametrize("machine", MACHINES)
def test_topologies_are_well_formed(machine):
    t = topo_of(machine)
    for n in t.nodes():
        if n.kind in (NodeKind.GPU, NodeKind.NIC, NodeKind.SWITCH):
            assert t.socket_of(n.id) is not None, n.id
    for s in t.nodes(NodeKind.SWITCH):
        assert t.children(s.id)


# -- older formats and hand-made inputs -----------------------------------------------

OLD_STYLE = """\
        GPU0    GPU1    GPU2    GPU3    mlx4_0  CPU Affinity
GPU0     X      PIX     SOC     SOC     PHB     0-9,20-29
GPU1    PIX      X      SOC     SOC     PHB     0-9,20-29
GPU2    SOC     SOC      X      PIX     SOC     10-19,30-39
GPU3    SOC     SOC     PIX      X      SOC     10-19,30-39
mlx4_0  PHB     PHB     SOC     SOC      X

Legend:

  X   = Self
  SOC  = Connection traversing PCIe as well as the SMP link between CPU sockets(e.g. QPI)
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe switches (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing a single PCIe switch
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def test_old_style_rdma_columns_and_soc():
    m = parse_nvidia_smi_topo(OLD_STYLE, "old.txt")
    assert m.kind("mlx4_0") == NodeKind.NIC and m.nic_names == {}
    assert m.relation[("GPU0", "GPU2")] == "SOC"
    assert m.numa_affinity["GPU0"] is None and m.numa_node("GPU0") is None
    t = topology_from_nvidia_smi(m)
    # no NUMA affinity anywhere: everything hangs under socket?, PIX pairs share switches
    assert parent_id(t, "GPU0") == parent_id(t, "GPU1") != parent_id(t, "GPU2")
    assert t.socket_of("nic:mlx4_0").id == "socket?"


def test_tab_output_with_gpu_numa_id_and_empty_field():
    # real nvidia-smi puts an empty field before GPU NUMA ID: "0\t\tN/A"
    text = ("\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
            "GPU0\t X \tPHB\t0-63\t0\t\tN/A\n"
            "GPU1\tPHB\t X \t0-63\t0\t\t2\n")
    m = parse_nvidia_smi_topo(text, "t.txt")
    assert m.numa_node("GPU1") == 0 and m.gpu_numa_id == {"GPU0": None, "GPU1": 2}


def test_cpu_list():
    assert parse_cpu_list("48-50,176") == (48, 49, 50, 176)
    assert parse_cpu_list("N/A") == () and parse_cpu_list("") == () and parse_cpu_list("5-2") == ()


def test_nvlink_rates():
    assert nvlink_rate("Tesla P100-SXM2-16GB").per_link_bytes_per_s == 20e9
    assert nvlink_rate("GV100GL [Tesla V100 SXM2 32GB]").generation == 2
    assert nvlink_rate("NVIDIA H100 80GB HBM3").generation == 4
    assert nvlink_rate("NVIDIA B200").per_link_bytes_per_s == 50e9
    assert nvlink_rate("NVIDIA RTX A6000").per_link_bytes_per_s == pytest.approx(14.0625e9)
    assert nvlink_rate(generation=4, gpu_name="Tesla P100").generation == 4  # a contradicted name loses
    assert nvlink_rate("NVIDIA RTX A6000", generation=3).per_link_bytes_per_s == pytest.approx(14.0625e9)
    r = nvlink_rate("Device 10de:2330")
    assert r.basis == "default" and r.per_link_bytes_per_s == DEFAULT_NVLINK_BYTES_PER_S


# -- errors ------------------------------------------------------------------------

def _err(text: str) -> ParseError:
    with pytest.raises(ParseError) as info:
        parse_nvidia_smi_topo(text, "in.txt")
    assert info.value.source == "in.txt"
    return info.value


GOOD = "  GPU0  GPU1  CPU Affinity\nGPU0  X  NV2  0-7\nGPU1  NV2  X  0-7\n"


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("", 1, "header"),
        ("\n \n\t\n", 1, "header"),
        ("GPU0\x00\x01\x02", 1, "text output"),
        ("Architecture:  x86_64\nCPU(s):  256\n", 1, "header"),
        (" \tGPU0\tGPU1\t\nGPU0\tX\tOK\t\nGPU1\tOK\tX\t\n", 1, "header"),  # topo -p2p r
        ("  GPU0  GPU1  CPU Affinity\nGPU0  X  NV2  0-7\n", 3, "row for GPU1"),  # truncated
        ("  GPU0  GPU1  CPU Affinity\nGPU0  X  NV2  0-7\nGPU1  NV3  X  0-7\n", 3, "mirror"),
        ("  GPU0  GPU1  CPU Affinity\nGPU0  X  FOO  0-7\nGPU1  NV2  X  0-7\n", 2, "relation"),
        ("  GPU0  GPU1  CPU Affinity\nGPU0  NV2  X  0-7\nGPU1  NV2  X  0-7\n", 2, "diagonal"),
        ("  GPU0  GPU1  CPU Affinity\nGPU0  X  NV2  0-7\nGPU0  X  NV2  0-7\n", 3, "one row per device"),
        ("  GPU0  GPU1  CPU Affinity\nGPU0  X\n", 2, "2 relation cells"),
        ("  GPU0  GPU1  CPU Affinity\nGPU0  X  NV2  zero\nGPU1  NV2  X  0-7\n", 2, "CPU list"),
        ("  GPU0  GPU1  CPU Affinity\nGPU0  X  NV2  0-7  3\nGPU1  NV2  X  0-7\n", 2, "at most 1"),
        ("  GPU0  GPU0  CPU Affinity\n", 1, "once"),
        (GOOD + "GPU2  X  X\n", 4, "header's devices"),
        (GOOD + "\nsomething else\n", 5, "Legend"),
        (GOOD + "\nLegend:\n\n  X = Self\n  garbage\n", 8, "legend line"),
        (GOOD + "\nNIC Legend:\n\n  NIC0: mlx5_0\n", 7, "NIC legend entry"),
    ],
)
def test_bad_input_gives_parse_error_with_line(text, line, words):
    err = _err(text)
    assert err.line == line
    assert words in err.expected


def test_apply_requires_same_gpu_count():
    t = _hand_topology()
    m = parse_nvidia_smi_topo(GOOD, "two.txt")
    with pytest.raises(PlannerError, match=r"nvidia-smi shows 2 GPU\(s\).*has 4"):
        apply_nvidia_smi(t, m)


# -- applying the matrix to a PCI tree -------------------------------------------------

FOUR = """\
        GPU0    GPU1    GPU2    GPU3    CPU Affinity    NUMA Affinity
GPU0     X      NV4     SYS     SYS     0-15    0
GPU1    NV4      X      SYS     SYS     0-15    0
GPU2    SYS     SYS      X      NV2     16-31   1
GPU3    SYS     SYS     NV2      X      16-31   1
"""


def _hand_topology() -> Topology:
    t = Topology("hand")
    for s in (0, 1):
        t.add_node(Node(f"socket{s}", NodeKind.SOCKET, f"socket {s}", numa_node=s))
    # inserted out of bus order on purpose; nvidia-smi numbers GPUs by bus address
    for addr, sock in (("0000:c1:00.0", 1), ("0000:41:00.0", 0), ("0000:e1:00.0", 1), ("0000:01:00.0", 0)):
        t.add_node(Node(f"pci:{addr}", NodeKind.GPU, "GV100GL [Tesla V100 SXM2 32GB]", bus_address=addr))
        t.add_link(Link.pcie(f"socket{sock}", f"pci:{addr}", 3, 16))
    return t


def test_apply_matches_gpus_by_bus_order_and_adds_nvlinks():
    t = _hand_topology()
    out = apply_nvidia_smi(t, parse_nvidia_smi_topo(FOUR, "four.txt"))
    assert not t.links(LinkKind.NVLINK)  # the input is untouched
    order = ["0000:01:00.0", "0000:41:00.0", "0000:c1:00.0", "0000:e1:00.0"]
    for i, addr in enumerate(order):
        node = out.node(f"pci:{addr}")
        assert node.attrs["nvidia_smi_name"] == f"GPU{i}"
        assert node.numa_node == (0 if i < 2 else 1)
    links = {frozenset((lk.src, lk.dst)): lk for lk in out.links(LinkKind.NVLINK)}
    assert set(links) == {frozenset(("pci:0000:01:00.0", "pci:0000:41:00.0")),
                          frozenset(("pci:0000:c1:00.0", "pci:0000:e1:00.0"))}
    lk = links[frozenset(("pci:0000:01:00.0", "pci:0000:41:00.0"))]
    assert lk.attrs["nvlink_count"] == 4 and lk.attrs["nvlink_generation"] == 2  # V100 from the PCI name
    assert lk.bytes_per_s == pytest.approx(4 * 25e9) and "via" not in lk.attrs
    assert not any("disagrees" in n for n in out.notes)


def test_apply_notes_contradictions():
    swapped = FOUR.replace("GPU0     X      NV4     SYS", "GPU0     X      NV4     NODE").replace(
        "GPU2    SYS     SYS", "GPU2    NODE    SYS")
    out = apply_nvidia_smi(_hand_topology(), parse_nvidia_smi_topo(swapped, "s.txt"))
    assert any("GPU0-GPU2 NODE but different sockets" in n for n in out.notes)


def test_apply_requires_bus_addresses():
    t = Topology("x")
    t.add_node(Node("socket0", NodeKind.SOCKET))
    t.add_node(Node("g", NodeKind.GPU))
    t.add_link(Link.pcie("socket0", "g", None, None))
    with pytest.raises(PlannerError, match="no bus address"):
        apply_nvidia_smi(t, parse_nvidia_smi_topo("  GPU0  CPU Affinity\nGPU0  X  0-3\n", "one.txt"))


# -- property tests ------------------------------------------------------------------

def _parse_or_error(text: str) -> TopoMatrix | None:
    m = parses_or_refuses(parse_nvidia_smi_topo, text, "fuzz.txt")
    if m is None:
        return None
    # whatever parses must build a topology
    t = topology_from_nvidia_smi(m)
    assert t.counts()["gpu"] == len(m.gpus)
    assert len(t.links(LinkKind.NVLINK)) == sum(
        1 for i, a in enumerate(m.devices) for b in m.devices[i + 1:] if m.nvlink_count(a, b))
    return m


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("GPUNIC0123 \t\nXSYPHBNODEV-,/A:=")), max_size=300))
def test_random_text_only_parse_errors(text):
    _parse_or_error(text)


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_only_parse_errors(data):
    _parse_or_error(data.decode("latin-1"))


_REAL = None


def _real_texts() -> list[str]:
    global _REAL
    if _REAL is None:
        _REAL = [load(m)[0] for m in MACHINES]
    return _REAL


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_real_input_only_parse_errors(data):
    ops = ("delete", "duplicate", "cut", "flip", "swap")
    _parse_or_error(data.draw(mutated_text(_real_texts(), "X0123456789NVSPIHB\t -,:", ops)))


def test_real_inputs_survive_the_property_check():
    for text in _real_texts():
        assert _parse_or_error(text) is not None


@st.composite
def rendered_matrices(draw):
    """A random but well-formed matrix, printed tab-separated or space-aligned."""
    gpus = [f"GPU{i}" for i in range(draw(st.integers(1, 5)))]
    nics = [f"NIC{i}" for i in range(draw(st.integers(0, 4)))]
    devs = gpus + nics
    cells = st.sampled_from(["SYS", "SOC", "NODE", "PHB", "PXB", "PIX", "NV1", "NV4", "NV12", "NV18"])
    rel = {}
    for i, a in enumerate(devs):
        for b in devs[i + 1:]:
            rel[(a, b)] = rel[(b, a)] = draw(cells)
    numa = {g: draw(st.one_of(st.none(), st.integers(0, 3))) for g in gpus}
    sep = draw(st.sampled_from(["\t", "    "]))
    gpu_numa = draw(st.booleans())
    cols = ["CPU Affinity", "NUMA Affinity"] + (["GPU NUMA ID"] if gpu_numa else [])
    lines = [sep + sep.join(devs + cols)]
    for d in devs:
        row = [d] + [" X " if a == d else rel[(d, a)] for a in devs]
        if d in numa:
            n = numa[d]
            row += [f"{8 * n}-{8 * n + 7}" if n is not None else "N/A", str(n) if n is not None else "N/A"]
            row += ["N/A"] if gpu_numa else []
        lines.append(sep.join(row))
    lines += ["", "Legend:", "", "  X    = Self"]
    if nics:
        lines += ["", "NIC Legend:", ""] + [f"  {n}: mlx5_{i}" for i, n in enumerate(nics)]
    return "\n".join(lines) + "\n", rel, numa


@settings(max_examples=120, deadline=None)
@given(rendered_matrices())
def test_random_well_formed_matrices_round_trip_and_build(case):
    text, rel, numa = case
    m = parse_nvidia_smi_topo(text, "gen.txt")
    assert dict(m.relation) == rel
    assert {g: m.numa_node(g) for g in m.gpus} == numa
    t = _parse_or_error(text) and topology_from_nvidia_smi(m)
    for d in m.devices:
        node_id = f"{m.kind(d).value}:{d}"
        assert t.socket_of(node_id) is not None
        if numa.get(d) is not None:
            assert t.node(node_id).numa_node == numa[d]
    for (a, b), r in rel.items():
        if r in ("PIX", "PXB"):
            ka, kb = f"{m.kind(a).value}:{a}", f"{m.kind(b).value}:{b}"
            assert t.socket_of(ka).id == t.socket_of(kb).id


# -- with the PCI tree of the same machine (lspci captures) ------------------------------

def _lspci_topology(machine: str) -> Topology:
    lspci = pytest.importorskip("planner.topology.lspci.parse")
    tree = topology_fixture(machine, "lspci-tv.txt")
    verbose = [(p.read_text(), str(p)) for p in sorted(tree.parent.glob("lspci-vvv-s-*.txt"))]
    return lspci.topology_from_lspci(tree.read_text(), verbose, source=str(tree))


def test_asus_matrix_on_its_lspci_tree():
    out = apply_nvidia_smi(_lspci_topology(ASUS), matrix_of(ASUS))
    names = {g.bus_address: g.attrs["nvidia_smi_name"] for g in out.nodes(NodeKind.GPU)}
    assert names == {"0000:01:00.0": "GPU0", "0000:41:00.0": "GPU1", "0000:c1:00.0": "GPU2", "0000:e1:00.0": "GPU3"}
    assert not out.links(LinkKind.NVLINK)
    assert not any("disagrees" in n for n in out.notes)  # NODE/SYS agree with the tree's sockets


def test_matrix_of_another_machine_is_refused():
    with pytest.raises(PlannerError, match=r"shows 4 GPU\(s\) .* has 2 \(0000:c1:00.0, 0000:c2:00.0\)"):
        apply_nvidia_smi(_lspci_topology(PUGET), matrix_of(ASUS))
