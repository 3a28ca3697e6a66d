"""The hardware topology model and the parsers that build it.

``planner.topology`` turns what a machine says about itself (sysfs,
``lspci``, ``dmidecode``, ``nvidia-smi topo -m``, NVML, hwloc and NCCL XML,
or a YAML machine spec) into one :class:`Topology`: typed nodes and links
with a capacity in bytes/s per direction.
"""

from typing import TYPE_CHECKING

# The names below load on first use (PEP 562), so that importing a light submodule such
# as planner.topology.spec.bundled does not pull in networkx through the model.
_LAZY = {
    "DEVICE_KINDS": "planner.topology.model", "Link": "planner.topology.model",
    "LinkKind": "planner.topology.model", "Node": "planner.topology.model",
    "NodeKind": "planner.topology.model", "Topology": "planner.topology.model",
    "pcie_bytes_per_s": "planner.topology.pcie", "PciFunction": "planner.topology.pcitree",
    "build_pci_topology": "planner.topology.pcitree", "classify": "planner.topology.pcitree",
    "normalize_address": "planner.topology.pcitree",
}

if TYPE_CHECKING:
    from planner.topology.model import DEVICE_KINDS, Link, LinkKind, Node, NodeKind, Topology
    from planner.topology.pcie import pcie_bytes_per_s
    from planner.topology.pcitree import (
        PciFunction,
        build_pci_topology,
        classify,
        normalize_address,
    )


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'planner.topology' has no attribute {name!r}")


__all__ = [
    "DEVICE_KINDS",
    "Link",
    "LinkKind",
    "Node",
    "NodeKind",
    "PciFunction",
    "Topology",
    "build_pci_topology",
    "classify",
    "normalize_address",
    "pcie_bytes_per_s",
]
