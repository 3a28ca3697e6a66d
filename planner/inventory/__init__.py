"""What to place: device models and the inventory of devices to put into slots.

A :class:`DeviceModel` says what a kind of device needs from a slot (its
form factors, electrical width, a double-width opening) and what it can do
(read bandwidth and IOPS for an SSD, memory for a GPU). An
:class:`Inventory` lists how many devices of each model are to be placed,
which of them sit in slots already (``installed``: they may move) and which
devices stay where they are (``fixed``).

Three ways to get an inventory:

- :func:`inventory_from_counts`: "4 GPUs and 8 SSDs" of named models (the
  paper's A100 40GB PCIe and Intel P5510 by default);
- :func:`inventory_from_spec`: the ``inventory:`` of a machine spec;
- :func:`inventory_from_topology`: the GPUs and NVMe SSDs a (live or
  captured) machine has in its slots.

>>> inv = inventory_from_counts(4, 8)
>>> str(inv)
'4 × a100-40gb-pcie, 8 × p5510'
>>> inv.count("p5510"), inv.model("p5510").read_bytes_per_s / 2**30
(8, 6.0)
>>> device_model("a100").name
'a100-40gb-pcie'
>>> inventory_from_counts(0, 0)
Traceback (most recent call last):
...
planner.errors.PlannerError: nothing to place: 0 GPUs and 0 SSDs

Figures can be overridden with :func:`dataclasses.replace`, e.g. a measured
read bandwidth (``replace(device_model("p5510"), read_bytes_per_s=5.8e9)``).
"""

from __future__ import annotations

from planner.inventory.core import (
    Inventory,
    inventory_from_counts,
    inventory_from_spec,
    merge_inventories,
)
from planner.inventory.models import (
    DEVICE_MODELS,
    PLACEABLE_KINDS,
    SLOT_FORM_FACTORS,
    DeviceModel,
    device_attrs,
    device_model,
    recognise_model,
)
from planner.inventory.slots import inventory_from_topology, slot_form_factor, with_virtual_slots

__all__ = [
    "DEVICE_MODELS",
    "PLACEABLE_KINDS",
    "SLOT_FORM_FACTORS",
    "DeviceModel",
    "Inventory",
    "device_attrs",
    "device_model",
    "inventory_from_counts",
    "inventory_from_spec",
    "inventory_from_topology",
    "merge_inventories",
    "recognise_model",
    "slot_form_factor",
    "with_virtual_slots",
]
