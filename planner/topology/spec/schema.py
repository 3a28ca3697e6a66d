"""What a machine spec (schema ``moment.machine``) may hold: its constants, keys and records.

The format is documented in :mod:`planner.topology.spec.load`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from momentbase.jsontypes import JsonObject
from planner.topology.model import NodeKind, Topology

SCHEMA = "moment.machine"
VERSION = 1

#: slot (and device) form factors a spec may name
FORM_FACTORS = ("cem", "u.2", "m.2", "ocp", "other")

#: device kinds a spec may name, and the node kind each becomes
DEVICE_KINDS = {"gpu": NodeKind.GPU, "nvme": NodeKind.NVME, "nic": NodeKind.NIC,
                "other": NodeKind.OTHER}

#: the most slots one entry may expand to with ``count`` (typo protection)
MAX_COUNT = 256

#: the deepest chain of switches a spec may nest
MAX_SWITCH_DEPTH = 16

#: the most devices of one inventory line
MAX_INVENTORY_COUNT = 4096

_ID = re.compile(r"^[A-Za-z0-9_.\-/]+$")


# ---------------------------------------------------------------------------
# public data


@dataclass(frozen=True)
class InventoryItem:
    """One line of a spec's ``inventory:``: identical devices still to be placed.

    ``fits`` lists the slot form factors the device can go into (a U.2 SSD in
    a CEM slot needs an adapter, so a spec says whether that is allowed);
    ``double_width`` says it needs a double-width slot. ``pcie_gen`` and
    ``lanes`` are the device's own link; ``attrs`` holds its figures in the
    units of their names (``capacity_bytes``, ``read_bytes_per_s``,
    ``write_bytes_per_s``, ``random_read_iops``) plus ``inferred_fields`` /
    ``field_notes`` as on topology nodes. ``line`` is the item's line in the
    spec, for messages.
    """

    kind: NodeKind
    model: str
    count: int
    form_factor: str | None = None
    fits: tuple[str, ...] = FORM_FACTORS
    double_width: bool = False
    pcie_gen: int | None = None
    lanes: int | None = None
    attrs: JsonObject = field(default_factory=dict)
    line: int | None = None


@dataclass(frozen=True)
class MachineSpec:
    """A parsed machine spec: the topology it describes and what is left to place."""

    name: str
    description: str
    sources: tuple[str, ...]
    topology: Topology
    inventory: tuple[InventoryItem, ...]
    source: str


#: the keys each part of a spec may hold
_TOP_KEYS = ("schema", "version", "name", "description", "sources", "defaults", "sockets",
             "interconnect", "nvlink", "inventory")
_DEFAULT_KEYS = ("pcie_gen", "protocol_efficiency")
_SOCKET_KEYS = ("id", "cpu_model", "threads", "clock_ghz", "numa_nodes", "memory_capacity",
                "memory_bandwidth", "ports", "inferred", "note")
_SWITCH_KEYS = ("switch", "name", "model", "uplink", "bus_address", "ports", "inferred", "note")
_UPLINK_KEYS = ("gen", "lanes", "bandwidth", "label", "inferred", "note")
_SLOT_KEYS = ("slot", "count", "designation", "label", "form_factor", "lanes", "gen",
              "double_width", "front_bay", "bandwidth", "bus_address", "device", "inferred", "note")
_DEVICE_KEYS = ("kind", "model", "id", "form_factor", "double_width", "gen", "lanes", "capacity",
                "read_bandwidth", "write_bandwidth", "random_read_iops", "bus_address",
                "inferred", "note")
_INVENTORY_KEYS = tuple(k for k in _DEVICE_KEYS if k not in ("id", "bus_address")) + ("count", "fits")
_INTERCONNECT_KEYS = ("sockets", "bandwidth", "technology", "label", "inferred", "note")
_NVLINK_KEYS = ("devices", "bandwidth", "links", "label", "inferred", "note")


def inferred_figures(topo: Topology) -> list[tuple[str, str, str]]:
    """Every inferred figure of a topology built from a spec.

    Returns ``(element, field, note)`` triples: ``element`` is a node id or
    ``"src→dst"`` for a link, ``field`` an attribute name (``"entry"`` when
    the node or link itself is inferred), ``note`` the spec's note or ``""``.

    >>> from planner.topology.spec.load import load_machine
    >>> ("slot:b-sw1-slot0", "width_lanes") in [
    ...     (e, f) for e, f, _ in inferred_figures(load_machine("moment-b"))]
    True
    """
    out: list[tuple[str, str, str]] = []
    items: list[tuple[str, JsonObject]] = [(n.id, dict(n.attrs)) for n in topo.nodes()]
    items += [(f"{lk.src}→{lk.dst}", dict(lk.attrs)) for lk in topo.links()]
    for element, attrs in items:
        if attrs.get("inferred") is True:
            out.append((element, "entry", str(attrs.get("note", ""))))
        notes = attrs.get("field_notes", {})
        for name in attrs.get("inferred_fields", []):
            out.append((element, name, str(notes.get(name, ""))))
    return out
