"""Device models and inventories: the table, counts, machine specs and live topologies."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.errors import PlannerError
from planner.inventory import (
    DEVICE_MODELS,
    DeviceModel,
    Inventory,
    device_model,
    inventory_from_counts,
    inventory_from_spec,
    inventory_from_topology,
    merge_inventories,
    recognise_model,
    with_virtual_slots,
)
from planner.topology.discover import topology_from_files
from planner.topology.model import Link, LinkKind, Node, NodeKind, Topology
from planner.topology.spec.load import load_machine, parse_machine_spec
from tests.conftest import topology_fixture

GiB = 2**30


# ---------------------------------------------------------------------------
# the model table


def test_table_has_the_paper_devices_with_sources():
    a100 = DEVICE_MODELS["a100-40gb-pcie"]
    assert (a100.kind, a100.lanes, a100.pcie_gen, a100.form_factors, a100.double_width) == (
        "gpu", 16, 4, ("cem",), True)
    assert a100.memory_bytes == 40 * GiB
    p5510 = DEVICE_MODELS["p5510"]
    assert (p5510.kind, p5510.lanes, p5510.form_factors) == ("nvme", 4, ("u.2", "cem"))
    assert p5510.read_bytes_per_s == 6 * GiB  # §2.2 and the bundled specs
    assert p5510.read_iops == 700_000
    assert DEVICE_MODELS["h100-sxm"].form_factors == ("sxm",)
    assert DEVICE_MODELS["h100-sxm"].double_width is False
    assert DEVICE_MODELS["samsung-980-pro"].form_factors == ("m.2", "cem")
    for name in ("generic-gpu", "generic-nvme", "h100-pcie"):
        assert name in DEVICE_MODELS
    for m in DEVICE_MODELS.values():
        assert m.source, m.name
        assert m.title


def test_spec_figures_agree_with_the_table():
    inv = inventory_from_spec("moment-a")
    for name in ("a100-40gb-pcie", "p5510"):
        spec, table = inv.model(name), DEVICE_MODELS[name]
        for attr in ("kind", "lanes", "pcie_gen", "form_factors", "double_width",
                     "read_bytes_per_s", "read_iops", "memory_bytes"):
            assert getattr(spec, attr) == getattr(table, attr), (name, attr)


@pytest.mark.parametrize("text, name", [
    ("a100", "a100-40gb-pcie"), ("A100-40GB-PCIe", "a100-40gb-pcie"),
    ("NVIDIA A100 40GB PCIe", "a100-40gb-pcie"), ("Intel P5510 3.84 TB", "p5510"),
    ("980pro", "samsung-980-pro"), ("generic-nvme", "generic-nvme"), ("ssd", "generic-nvme"),
])
def test_device_model_lookup(text, name):
    assert device_model(text).name == name


def test_unknown_model_lists_the_known_ones():
    with pytest.raises(PlannerError, match=r"unknown device model 'x100'.*a100-40gb-pcie.*p5510"):
        device_model("x100")


def test_recognise_by_pci_id_and_name():
    assert recognise_model("", "10de", "2330").name == "h100-sxm"
    assert recognise_model("NVIDIA Corporation GA100 [A100 PCIe 40GB]").name == "a100-40gb-pcie"
    assert recognise_model("Samsung SSD 980 PRO 1TB").name == "samsung-980-pro"
    assert recognise_model("NVIDIA A100-SXM4-40GB") is None
    assert recognise_model(None) is None


@pytest.mark.parametrize("kwargs, match", [
    (dict(kind="cpu"), "kind must be one of gpu, nvme"),
    (dict(lanes=3), "lanes must be a PCIe width"),
    (dict(pcie_gen=9), "pcie_gen must be 1 to 7"),
    (dict(form_factors=()), "form_factors must be a non-empty list"),
    (dict(form_factors=("floppy",)), "form_factors must be"),
    (dict(read_bytes_per_s=-1.0), "read_bytes_per_s must be a positive number"),
    (dict(read_iops=float("nan")), "read_iops must be a positive number"),
])
def test_device_model_validation(kwargs, match):
    base = dict(name="x", kind="nvme", lanes=4, pcie_gen=4, form_factors=("u.2",))
    with pytest.raises(PlannerError, match=match):
        DeviceModel(**{**base, **kwargs})


def test_read_bandwidth_is_overridable():
    m = replace(device_model("p5510"), read_bytes_per_s=5.5e9)
    assert m.read_bytes_per_s == 5.5e9 and m.name == "p5510"
    inv = Inventory(((m, 2),))
    assert inv.model("p5510").read_bytes_per_s == 5.5e9


# ---------------------------------------------------------------------------
# inventories


def test_inventory_from_counts():
    inv = inventory_from_counts(4, 8)
    assert str(inv) == "4 × a100-40gb-pcie, 8 × p5510"
    assert inv.total == 12 and inv.count_kind("gpu") == 4 and inv.count_kind("nvme") == 8
    assert inv.kinds() == {"a100-40gb-pcie": "gpu", "p5510": "nvme"}
    assert inv.fixed == () and inv.installed == ()
    assert str(inventory_from_counts(0, 3, ssd_model="samsung-980-pro")) == "3 × samsung-980-pro"


@pytest.mark.parametrize("args, match", [
    ((0, 0), "nothing to place"),
    ((-1, 2), "cannot be negative"),
    ((2, -3), "cannot be negative"),
    ((1.5, 2), "whole number"),
    ((True, 2), "whole number"),
])
def test_bad_counts(args, match):
    with pytest.raises(PlannerError, match=match):
        inventory_from_counts(*args)


def test_model_of_the_wrong_kind():
    with pytest.raises(PlannerError, match="p5510 is a nvme model, not a gpu model"):
        inventory_from_counts(2, 2, gpu_model="p5510")
    with pytest.raises(PlannerError, match="unknown device model"):
        inventory_from_counts(2, 2, ssd_model="nope")


def test_inventory_validation():
    p = device_model("p5510")
    with pytest.raises(PlannerError, match="at least 1"):
        Inventory(((p, 0),))
    with pytest.raises(PlannerError, match="at least 1"):
        Inventory(((p, -2),))
    with pytest.raises(PlannerError, match="nothing to place"):
        Inventory(())
    with pytest.raises(PlannerError, match="listed twice"):
        Inventory(((p, 1), (p, 2)))
    with pytest.raises(PlannerError, match="does not list"):
        Inventory(((p, 1),), installed=(("dev", "a100-40gb-pcie"),))
    with pytest.raises(PlannerError, match="2 installed devices of p5510 but a count of 1"):
        Inventory(((p, 1),), installed=(("d1", "p5510"), ("d2", "p5510")))
    with pytest.raises(PlannerError, match=r"\(DeviceModel, count\) pair"):
        Inventory(((p,),))  # type: ignore[arg-type]
    with pytest.raises(PlannerError, match="no model 'zz'"):
        inventory_from_counts(1, 1).model("zz")


def test_merge_inventories():
    inv = merge_inventories(inventory_from_counts(2, 0), inventory_from_counts(2, 4))
    assert inv.count("a100-40gb-pcie") == 4 and inv.count("p5510") == 4
    other = replace(device_model("p5510"), read_bytes_per_s=1e9)
    with pytest.raises(PlannerError, match="two different device models"):
        merge_inventories(inventory_from_counts(0, 1), Inventory(((other, 1),)))


def test_inventory_from_spec_bundled():
    for name in ("moment-a", "moment-b"):
        inv = inventory_from_spec(name)
        assert str(inv) == "4 × a100-40gb-pcie, 8 × p5510"
        assert inv.model("a100-40gb-pcie").title == "NVIDIA A100 40GB PCIe"
        assert "machine spec" in inv.model("p5510").source
    # Machine A's NICs are installed and stay
    assert inventory_from_spec("moment-a").fixed == ("dev:a1-nic",)
    assert inventory_from_spec("moment-b").fixed == ()


SPEC = """
schema: moment.machine
version: 1
name: lab
defaults: {pcie_gen: 4}
sockets:
  - id: 0
    ports:
      - slot: bay{i}
        count: 2
        form_factor: u.2
        lanes: 4
        device: {kind: nvme, model: Samsung PM9A3, id: "ssd{i}"}
      - slot: m2
        form_factor: m.2
        lanes: 4
inventory:
  - kind: nvme
    model: Kioxia CM7
    count: 1
    form_factor: u.2
    lanes: 4
  - kind: gpu
    model: NVIDIA A100 40GB PCIe
    count: 1
"""


def test_inventory_from_spec_file(tmp_path):
    path = tmp_path / "lab.yaml"
    path.write_text(SPEC)
    inv = inventory_from_spec(str(path))
    cm7 = inv.model("kioxia-cm7")
    assert (cm7.form_factors, cm7.lanes, cm7.kind) == (("u.2",), 4, "nvme")
    assert cm7.read_bytes_per_s == DEVICE_MODELS["generic-nvme"].read_bytes_per_s
    assert any("kioxia" in n.lower() or "Kioxia" in n for n in inv.notes)
    # a known model keeps its needs when the spec is silent about them
    a100 = inv.model("a100-40gb-pcie")
    assert a100.form_factors == ("cem",) and a100.double_width and a100.lanes == 16
    assert set(inv.fixed) == {"dev:ssd0", "dev:ssd1"}


def test_inventory_from_spec_errors(tmp_path):
    path = tmp_path / "nic.yaml"
    path.write_text(SPEC.replace("kind: gpu\n    model: NVIDIA A100 40GB PCIe",
                                 "kind: nic\n    model: ConnectX-7"))
    with pytest.raises(PlannerError, match=r"nic.yaml:\d+: the planner places GPUs and NVMe SSDs"):
        inventory_from_spec(str(path))
    empty = tmp_path / "empty.yaml"
    empty.write_text(SPEC.split("inventory:")[0])
    with pytest.raises(PlannerError, match="lists no devices to place"):
        inventory_from_spec(str(empty))


# ---------------------------------------------------------------------------
# live topologies


def hpe() -> Topology:
    d = "hpe-cray-xd665-2x-epyc9354-h100"
    return topology_from_files(lspci_vvv=[topology_fixture(d, "lspci-vvnn.txt")],
                               dmidecode=topology_fixture(d, "dmidecode.txt"))


def dell() -> Topology:
    d = "dell-poweredge-r640-2x-xeon-gold6230-nvme"
    return topology_from_files(lspci_vvv=[topology_fixture(d, "lspci-vvnn.txt")],
                               dmidecode=topology_fixture(d, "dmidecode.txt"))


def test_inventory_from_hpe_capture():
    topo = hpe()
    inv = inventory_from_topology(topo)
    # 4 H100 SXM5 (10de:2330) in their GPU sockets, 2 Micron 7450 in U.2 bays, and the
    # Marvell NS204i boot controller, which sits in a riser slot
    assert inv.count("h100-sxm") == 4
    micron = [m for m in inv.models if "7450" in m.name]
    assert len(micron) == 1 and inv.count(micron[0].name) == 2
    assert micron[0].form_factors == ("u.2", "cem") and micron[0].lanes == 4
    gpus = {d for d, m in inv.installed if m == "h100-sxm"}
    assert gpus == {"pci:0000:04:00.0", "pci:0000:64:00.0", "pci:0000:84:00.0",
                    "pci:0000:e4:00.0"}
    # onboard I210 (no slot), NICs, switches' management endpoints stay
    assert "pci:0000:68:00.0" in inv.fixed  # I210, onboard, on a root port without a slot
    assert "pci:0000:03:00.0" in inv.fixed  # ConnectX-5 in PCIe slot 1
    assert not set(inv.fixed) & {d for d, _ in inv.installed}
    # keep= pins a device
    kept = inventory_from_topology(topo, keep=["pci:0000:c1:00.0"])
    assert "pci:0000:c1:00.0" in kept.fixed and kept.total == inv.total - 1


def test_inventory_from_dell_capture():
    inv = inventory_from_topology(dell())
    assert inv.total == 2
    (model,) = inv.models
    assert model.kind == "nvme" and model.pcie_gen == 3 and model.form_factors[0] == "u.2"
    assert {d for d, _ in inv.installed} == {"pci:0000:88:00.0", "pci:0000:89:00.0"}


def test_inventory_from_topology_errors():
    with pytest.raises(PlannerError, match="nothing to move"):
        inventory_from_topology(load_machine("moment-a"))
    with pytest.raises(PlannerError, match="keep: no node"):
        inventory_from_topology(hpe(), keep=["pci:nope"])


def toy_without_slots(nvlink: bool = False) -> Topology:
    t = Topology("toy")
    for n in (Node("socket0", NodeKind.SOCKET), Node("sw", NodeKind.SWITCH, "switch"),
              Node("g0", NodeKind.GPU, "NVIDIA A100-PCIE-40GB"),
              Node("g1", NodeKind.GPU, "NVIDIA A100-PCIE-40GB"),
              Node("n0", NodeKind.NVME, "disk")):
        t.add_node(n)
    t.add_link(Link.pcie("socket0", "sw", 4, 16))
    t.add_link(Link.pcie("sw", "g0", 4, 16))
    t.add_link(Link.pcie("sw", "g1", 4, 16))
    t.add_link(Link.pcie("socket0", "n0", 4, 4))
    if nvlink:
        t.add_link(Link("g0", "g1", LinkKind.NVLINK, 1e11))
    return t


def test_virtual_slots_when_a_topology_has_none():
    t = toy_without_slots()
    v = with_virtual_slots(t)
    assert v is not t and with_virtual_slots(v) is v
    assert v.counts()["slot"] == 3 and t.counts()["slot"] == 0
    assert v.parent("g0").id == "slot:virtual:g0"
    assert v.parent("slot:virtual:g0").id == "sw"
    assert v.link_between("sw", "slot:virtual:g0").lanes == 16
    assert "positions" in v.notes[-1]
    inv = inventory_from_topology(t)
    assert inv.count("a100-40gb-pcie") == 2 and inv.count_kind("nvme") == 1
    assert any("positions" in n for n in inv.notes)


def test_nvlinked_devices_stay_unless_asked():
    t = toy_without_slots(nvlink=True)
    inv = inventory_from_topology(t)
    assert inv.count_kind("gpu") == 0 and {"g0", "g1"} <= set(inv.fixed)
    assert any("NVLink" in n for n in inv.notes)
    inv = inventory_from_topology(t, move_nvlinked=True)
    assert inv.count_kind("gpu") == 2


def test_known_model_in_a_narrow_slot_is_allowed_there():
    text = """
schema: moment.machine
version: 1
name: narrow
defaults: {pcie_gen: 4}
sockets:
  - id: 0
    ports:
      - slot: s0
        form_factor: cem
        lanes: 8
        double_width: true
        device: {kind: gpu, model: NVIDIA A100 40GB PCIe}
"""
    topo = parse_machine_spec(text, "narrow.yaml").topology
    inv = inventory_from_topology(topo)
    assert inv.model("a100-40gb-pcie").lanes == 8
    assert any("x8" in n for n in inv.notes)
