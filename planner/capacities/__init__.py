"""Measured capacities: what a profile found, and a topology that uses it.

A capacities file (schema ``moment.capacities``, version 1, documented in
``docs/capacities.md``) holds figures measured on a machine, keyed by what
they describe:

``devices:``
    per storage device, keyed by a topology node id (``pci:0000:3b:00.0``),
    a PCI bus address (``0000:3b:00.0``) or a device model name: the read
    rate (``read_bytes_per_s``; ``read_iops`` at ``block_bytes``) with how it
    was measured (tool, queue depth, file size, O_DIRECT or buffered, date,
    host). Other tools' figures for the same device sit under
    ``other_measurements:``.
``links:``
    per link between two adjacent nodes (``src:``/``dst:``), or per class:
    ``host-to-device`` / ``device-to-host`` (pinned host memory to or from a
    GPU, optionally one ``device:``), ``peer-to-peer`` (GPU to GPU) and
    ``inter-socket``; a ``bytes_per_s`` each.
``memory:``
    per NUMA node (or ``all``): DRAM bandwidth in bytes/s.
``pcie_efficiency:``
    the share of a PCIe link's encoded rate left for payload, as measured.

:func:`load_capacities` reads such a file (YAML, or JSON, which YAML reads
too) and raises :class:`~planner.errors.ParseError` naming the file and line
of anything wrong; :func:`dump_capacities` / :func:`save_capacities` write
one; :func:`apply_capacities` gives a topology whose figures are the
measured ones where a measurement exists, and says which it replaced.

>>> text = '''
... schema: moment.capacities
... version: 1
... host: box
... devices:
...   "0000:01:00.0": {read_iops: 800000, block_bytes: 4096, tool: fio-io_uring, queue_depth: 64}
... memory:
...   0: {bytes_per_s: 60 GB/s, method: numpy-copy}
... '''
>>> caps = parse_capacities(text, "caps.yaml")
>>> caps.devices[0].read.read_bytes_per_s   # derived: read_iops x block_bytes
3276800000.0
>>> caps.memory[0].bytes_per_s
60000000000.0
>>> parse_capacities("schema: moment.capacities\\nversion: 1\\nmemory: {0: {bytes_per_s: fast}}\\n",
...                  "c.yaml")
Traceback (most recent call last):
...
planner.errors.ParseError: c.yaml:3: expected a memory bandwidth (bytes/s, like '6 GiB/s', '20 GB/s', '100 Gb/s'), found 'fast'
"""  # noqa: E501 (a doctest's or a capture's line, as printed)

from __future__ import annotations

from planner.capacities.apply import (
    AppliedCapacities,
    Replacement,
    apply_capacities,
    apply_capacities_report,
    apply_to_inventory,
    find_device,
    measured_figures,
)
from planner.capacities.model import (
    LINK_CLASSES,
    MODES,
    SCHEMA,
    VERSION,
    Capacities,
    DeviceCapacity,
    LinkCapacity,
    MemoryCapacity,
    PcieEfficiency,
    ReadMeasurement,
)
from planner.capacities.reader import load_capacities, parse_capacities
from planner.capacities.writer import dump_capacities, save_capacities, to_dict

__all__ = [
    "SCHEMA", "VERSION", "MODES", "LINK_CLASSES",
    "ReadMeasurement", "DeviceCapacity", "LinkCapacity", "MemoryCapacity", "PcieEfficiency",
    "Capacities", "Replacement", "AppliedCapacities",
    "parse_capacities", "load_capacities", "dump_capacities", "save_capacities",
    "apply_capacities", "apply_to_inventory", "find_device", "measured_figures", "to_dict",
    "apply_capacities_report",
]
