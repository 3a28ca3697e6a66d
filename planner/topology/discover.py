"""One topology from everything known about a machine.

Sources of one machine merge in a fixed order, each adding what only it knows:

1. the PCI tree: ``lspci -tv`` and/or ``lspci -vvv`` text, else hwloc XML,
   else NCCL topology XML (a tree source given beside the chosen one adds
   its NVLink links, matched by bus address);
2. ``dmidecode``: slot designations, form factors and empty slots, joined
   to the tree by bus address;
3. ``nvidia-smi topo -m`` and NVML: NVLink links and GPU details, matched to
   the tree's GPUs in PCI bus order.

With no PCI tree source, ``nvidia-smi topo -m`` alone gives a coarse
topology (switch groups inferred from PIX/PXB).

>>> from pathlib import Path
>>> topo = topology_from_files(machine="moment-b")
>>> topo.counts()["socket"]
2
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from planner.errors import PlannerError
from planner.topology.model import Link, LinkKind, NodeKind, Topology
from planner.topology.textio import read_text


def _pci_tree(lspci: str | Path | None, lspci_vvv: Sequence[str | Path], hwloc: str | Path | None,
              nccl_topo: str | Path | None) -> Topology | None:
    """The PCI tree from lspci, else hwloc, else NCCL's topology; the others lend their NVLinks."""
    topo: Topology | None = None
    extra_trees: list[Topology] = []
    if lspci is not None or lspci_vvv:
        from planner.topology.lspci import topology_from_lspci

        tree_text = read_text(lspci) if lspci is not None else None
        verbose = [(read_text(p), str(p)) for p in lspci_vvv]
        topo = topology_from_lspci(
            tree_text=tree_text,
            verbose_texts=verbose,
            source=str(lspci) if lspci is not None else str(lspci_vvv[0]),
        )
    for path, parse in ((hwloc, _hwloc), (nccl_topo, _nccl)):
        if path is None:
            continue
        parsed = parse(read_text(path), str(path))
        if topo is None:
            topo = parsed
        else:
            extra_trees.append(parsed)
    for other in extra_trees:
        topo = _adopt_nvlinks(topo, other)
    return topo


def topology_from_files(
    *,
    lspci: str | Path | None = None,
    lspci_vvv: Sequence[str | Path] = (),
    dmidecode: str | Path | None = None,
    nvidia_smi: str | Path | None = None,
    hwloc: str | Path | None = None,
    nccl_topo: str | Path | None = None,
    machine: str | Path | None = None,
    name: str | None = None,
) -> Topology:
    """Merge captured outputs of one machine (or load a machine spec) into one topology.

    ``lspci`` is ``lspci -tv`` (or ``-t``) output; ``lspci_vvv`` are
    ``lspci -vvv``/``-vvnn`` outputs (a whole dump or per-device ``-s``
    dumps). ``machine`` is a bundled spec name or a YAML spec path and
    cannot be combined with captures.
    """
    captures = [lspci, *lspci_vvv, dmidecode, nvidia_smi, hwloc, nccl_topo]
    if machine is not None:
        if any(c is not None for c in captures):
            raise PlannerError("a machine spec describes the whole machine: give it alone, without captured files")
        from planner.topology.spec import load_machine

        topo = load_machine(machine)
        if name:
            topo.name = name
        return topo
    if all(c is None for c in captures):
        raise PlannerError("no source given: name captured files, a machine spec, or run live")

    topo = _pci_tree(lspci, lspci_vvv, hwloc, nccl_topo)
    if dmidecode is not None:
        from planner.topology.dmi_join import apply_dmi_slots
        from planner.topology.dmidecode import parse_dmidecode

        dmi = parse_dmidecode(read_text(dmidecode), str(dmidecode))
        if topo is None:
            raise PlannerError(
                f"{dmidecode}: dmidecode lists slots but not what hangs under them; "
                "give a PCI tree too (`lspci`, `lspci_vvv`, `hwloc` or `nccl_topo`)"
            )
        topo = apply_dmi_slots(topo, dmi)
        topo.sources.append(str(dmidecode))

    if nvidia_smi is not None:
        from planner.topology.nvidia_smi import apply_nvidia_smi, topology_from_nvidia_smi
        from planner.topology.nvsmi_matrix import parse_nvidia_smi_topo

        matrix = parse_nvidia_smi_topo(read_text(nvidia_smi), str(nvidia_smi))
        if topo is None:
            topo = topology_from_nvidia_smi(matrix, name=name or "", source=str(nvidia_smi))
        else:
            topo = apply_nvidia_smi(topo, matrix)
            topo.sources.append(str(nvidia_smi))

    assert topo is not None
    if name:
        topo.name = name
    elif not topo.name:
        topo.name = Path(str(topo.sources[0])).parent.name if topo.sources else "machine"
    return topo


def live_topology(sys_root: str | Path = "/sys", *, use_nvml: bool = True) -> Topology:
    """The topology of the machine this runs on: sysfs, plus NVML when NVIDIA GPUs are present."""
    from planner.topology.sysfs import topology_from_sysfs

    topo = topology_from_sysfs(sys_root)
    if use_nvml and any(n.vendor_id == "10de" for n in topo.nodes(NodeKind.GPU)):
        from planner.topology.nvml import apply_nvml, nvml_available, read_nvml

        if nvml_available():
            topo = apply_nvml(topo, read_nvml())
        else:
            topo.notes.append("NVIDIA GPUs found but NVML is not usable: NVLink links unknown")
    return topo


def _hwloc(text: str, source: str) -> Topology:
    from planner.topology.hwloc import parse_hwloc_xml

    return parse_hwloc_xml(text, source)


def _nccl(text: str, source: str) -> Topology:
    from planner.topology.nccl import parse_nccl_topo

    return parse_nccl_topo(text, source)


def _adopt_nvlinks(base: Topology, other: Topology) -> Topology:
    """Copy ``other``'s NVLink links into ``base`` where both ends exist there by bus address."""
    out = base.copy()
    out.sources.extend(s for s in other.sources if s not in out.sources)
    missed = 0
    for lk in other.links(LinkKind.NVLINK):
        a, b = other.node(lk.src), other.node(lk.dst)
        na = out.find(a.bus_address) if a.bus_address else None
        nb = out.find(b.bus_address) if b.bus_address else None
        if na is None or nb is None:
            missed += 1
            continue
        if out.link_between(na.id, nb.id) is None:
            out.add_link(Link(na.id, nb.id, lk.kind, lk.bytes_per_s, lk.pcie_gen, lk.lanes,
                              lk.bandwidth_source, dict(lk.attrs)))
    if missed:
        out.notes.append(f"{missed} NVLink link(s) of {other.sources} match no device of the PCI tree")
    return out
