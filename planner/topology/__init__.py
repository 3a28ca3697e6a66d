"""The hardware topology model and the parsers that build it.

``planner.topology`` turns what a machine says about itself (sysfs,
``lspci``, ``dmidecode``, ``nvidia-smi topo -m``, NVML, hwloc and NCCL XML,
or a YAML machine spec) into one :class:`Topology`: typed nodes and links
with a capacity in bytes/s per direction.
"""

from planner.topology.model import (
    DEVICE_KINDS,
    Link,
    LinkKind,
    Node,
    NodeKind,
    Topology,
)
from planner.topology.pcie import pcie_bytes_per_s
from planner.topology.pcitree import PciFunction, build_pci_topology, classify, normalize_address

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
