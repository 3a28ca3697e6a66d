"""One topology from everything known about a machine.

Sources of one machine (:data:`planner.topology.sources.CAPTURE_SOURCES`: each
declares a phase and a priority) merge in a fixed order, each adding what only it knows:

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
from typing import Any

from planner.errors import PlannerError
from planner.topology.model import Link, LinkKind, NodeKind, Topology
from planner.topology.sources import CAPTURE_SOURCES, PHASES, source_of
from planner.topology.textio import read_text


def topology_from_files(*, machine: str | Path | None = None, name: str | None = None,
                        **captures: str | Path | Sequence[str | Path] | None) -> Topology:
    """Merge captured outputs of one machine (or load a machine spec) into one topology.

    ``captures``: files by keyword of their source (:data:`~planner.topology.sources.CAPTURE_SOURCES`):
    ``lspci`` is ``lspci -tv`` (or ``-t``) output; ``lspci_vvv`` are
    ``lspci -vvv``/``-vvnn`` outputs (a whole dump or per-device ``-s``
    dumps); ``dmidecode``, ``nvidia_smi``, ``hwloc``, ``nccl_topo``; ``None``
    or an empty list is not given. The sources run phase by phase, tree
    sources by priority. ``machine`` is a bundled spec name or a YAML spec
    path and cannot be combined with captures.
    """
    given: dict[str, dict[str, Any]] = {}  # Any: captures as given: paths, texts or lists of them, per source
    for keyword, value in captures.items():
        if value is not None and not (isinstance(value, (list, tuple)) and not value):
            given.setdefault(source_of(keyword), {})[keyword] = value
    if machine is not None:
        if given:
            raise PlannerError("a machine spec describes the whole machine: give it alone, without captured files")
        from planner.topology.spec.load import load_machine

        topo = load_machine(machine)
        if name:
            topo.name = name
        return topo
    if not given:
        raise PlannerError("no source given: name captured files, a machine spec, or run live")
    rank = {p: i for i, p in enumerate(PHASES)}
    order = sorted(given, key=lambda n: (rank[CAPTURE_SOURCES.caps(n)["phase"]],
                                         -CAPTURE_SOURCES.caps(n)["priority"]))
    topo: Topology | None = None
    for src in order:
        tree = CAPTURE_SOURCES.caps(src)["phase"] == "tree"
        parsed = CAPTURE_SOURCES.get(src)(None if tree else topo, given[src], name)
        # the first tree source builds the tree; a later one lends its NVLinks
        topo = _adopt_nvlinks(topo, parsed) if tree and topo is not None else parsed
    assert topo is not None
    if name:
        topo.name = name
    elif not topo.name:
        topo.name = Path(str(topo.sources[0])).parent.name if topo.sources else "machine"
    return topo


# --- the readers of the capture sources (planner.topology.sources names them) ---------------


# Any: captures as given: paths, texts or lists of them, per source
def read_lspci(topo: Topology | None, given: dict[str, Any], name: str | None) -> Topology:
    """``lspci -tv`` and/or ``lspci -vvv`` outputs: the PCI tree."""
    from planner.topology.lspci.parse import topology_from_lspci

    lspci, vvv = given.get("lspci"), list(given.get("lspci_vvv") or ())
    return topology_from_lspci(tree_text=read_text(lspci) if lspci is not None else None,
                               verbose_texts=[(read_text(p), str(p)) for p in vvv],
                               source=str(lspci) if lspci is not None else str(vvv[0]))


# Any: captures as given: paths, texts or lists of them, per source
def read_hwloc(topo: Topology | None, given: dict[str, Any], name: str | None) -> Topology:
    """hwloc XML: the PCI tree."""
    from planner.topology.hwloc.parse import parse_hwloc_xml

    return parse_hwloc_xml(read_text(given["hwloc"]), str(given["hwloc"]))


# Any: captures as given: paths, texts or lists of them, per source
def read_nccl(topo: Topology | None, given: dict[str, Any], name: str | None) -> Topology:
    """NCCL's topology XML: the PCI tree."""
    from planner.topology.nvidia.nccl import parse_nccl_topo

    return parse_nccl_topo(read_text(given["nccl_topo"]), str(given["nccl_topo"]))


# Any: captures as given: paths, texts or lists of them, per source
def read_dmidecode(topo: Topology | None, given: dict[str, Any], name: str | None) -> Topology:
    """``dmidecode``: slot designations, form factors and empty slots, joined to the tree by bus address.

    Raises
    ------
    PlannerError
        No PCI tree was read before the dmidecode capture.
    """
    from planner.topology.dmi.join import apply_dmi_slots
    from planner.topology.dmi.parse import parse_dmidecode

    path = given["dmidecode"]
    dmi = parse_dmidecode(read_text(path), str(path))
    if topo is None:
        raise PlannerError(
            f"{path}: dmidecode lists slots but not what hangs under them; "
            "give a PCI tree too (`lspci`, `lspci_vvv`, `hwloc` or `nccl_topo`)"
        )
    topo = apply_dmi_slots(topo, dmi)
    topo.sources.append(str(path))
    return topo


# Any: captures as given: paths, texts or lists of them, per source
def read_nvidia_smi(topo: Topology | None, given: dict[str, Any], name: str | None) -> Topology:
    """``nvidia-smi topo -m``: NVLinks and GPU order onto the tree, or alone a coarse topology."""
    from planner.topology.nvidia.smi import apply_nvidia_smi, topology_from_nvidia_smi
    from planner.topology.nvidia.smi_matrix import parse_nvidia_smi_topo

    path = given["nvidia_smi"]
    matrix = parse_nvidia_smi_topo(read_text(path), str(path))
    if topo is None:
        return topology_from_nvidia_smi(matrix, name=name or "", source=str(path))
    topo = apply_nvidia_smi(topo, matrix)
    topo.sources.append(str(path))
    return topo


def live_topology(sys_root: str | Path = "/sys", *, use_nvml: bool = True) -> Topology:
    """The topology of the machine this runs on: sysfs, plus NVML when NVIDIA GPUs are present."""
    from planner.topology.sysfs import topology_from_sysfs

    topo = topology_from_sysfs(sys_root)
    if use_nvml and any(n.vendor_id == "10de" for n in topo.nodes(NodeKind.GPU)):
        from planner.topology.nvidia.nvml import apply_nvml, nvml_available, read_nvml

        if nvml_available():
            topo = apply_nvml(topo, read_nvml())
        else:
            topo.notes.append("NVIDIA GPUs found but NVML is not usable: NVLink links unknown")
    return topo


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
