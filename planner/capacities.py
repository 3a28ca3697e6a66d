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
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from yaml.nodes import MappingNode, ScalarNode
from yaml.nodes import Node as YamlNode

from momentbase.units import format_size, parse_size  # re-exported: the old home of the size units
from planner.errors import PlannerError, TopologyError
from planner.topology.model import DEVICE_KINDS, Link, LinkKind, Node, NodeKind, Topology
from planner.topology.pcie import pcie_bytes_per_s
from planner.topology.pcitree import normalize_address

# The machine-spec reader keeps YAML line numbers and parses bandwidths and
# sizes the same way; capacities files should accept exactly what specs do.
from planner.topology.spec import _Reader
from planner.topology.textio import read_text

__all__ = [
    "SCHEMA", "VERSION", "MODES", "LINK_CLASSES",
    "ReadMeasurement", "DeviceCapacity", "LinkCapacity", "MemoryCapacity", "PcieEfficiency",
    "Capacities", "Replacement", "AppliedCapacities",
    "parse_capacities", "load_capacities", "dump_capacities", "save_capacities",
    "apply_capacities", "apply_to_inventory", "find_device", "measured_figures", "to_dict",
    "apply_capacities_report",
    "parse_size", "format_size",
]

SCHEMA = "moment.capacities"
VERSION = 1

#: how a read test opened its file: O_DIRECT (past the page cache) or buffered
MODES = ("direct", "buffered")

#: link classes a ``links:`` entry may name instead of ``src:``/``dst:``
LINK_CLASSES = ("host-to-device", "device-to-host", "peer-to-peer", "inter-socket")

_TOP_KEYS = ("schema", "version", "host", "date", "tool", "notes", "devices", "links", "memory",
             "pcie_efficiency")
_MEASUREMENT_KEYS = ("read_bytes_per_s", "read_iops", "block_bytes", "queue_depth", "tool",
                     "mode", "file_bytes", "seconds", "jobs", "date", "host", "note")
_DEVICE_KEYS = (*_MEASUREMENT_KEYS, "model", "block_device", "path", "other_measurements")
_LINK_KEYS = ("src", "dst", "class", "device", "bytes_per_s", "transfer_bytes", "tool", "date",
              "host", "note")
_MEMORY_KEYS = ("bytes_per_s", "method", "convention", "array_bytes", "repeats", "threads",
                "date", "host", "note")
_EFFICIENCY_KEYS = ("value", "derived_from", "note")


# ---------------------------------------------------------------------------
# data


@dataclass(frozen=True)
class ReadMeasurement:
    """One read test of a storage device.

    ``read_bytes_per_s`` is what the planner uses; ``read_iops`` is the
    number of reads of ``block_bytes`` each per second (random, aligned
    reads when a profile measured it). ``queue_depth`` is the number of
    reads in flight, ``tool`` what issued them (``fio-io_uring``,
    ``fio-libaio``, ``fio-psync``, ``moment-posix``, or anything a person
    wrote), ``mode`` ``"direct"`` (O_DIRECT) or ``"buffered"``,
    ``file_bytes`` the size of the file read, ``jobs`` how the tool
    spread the queue depth ("2 processes x 32 threads"), ``date`` an ISO
    8601 time.
    """

    read_bytes_per_s: float
    read_iops: float | None = None
    block_bytes: int | None = None
    queue_depth: int | None = None
    tool: str | None = None
    mode: str | None = None
    file_bytes: int | None = None
    seconds: float | None = None
    jobs: str | None = None
    date: str | None = None
    host: str | None = None
    note: str | None = None


@dataclass(frozen=True)
class DeviceCapacity:
    """What was measured of one storage device (or of every device of one model).

    ``key`` is a node id, a PCI bus address or a model name (see
    :func:`apply_capacities` for how it is matched); ``read`` is the figure
    used, ``others`` the other measurements kept for the record. ``line`` is
    the entry's line in the file it came from.
    """

    key: str
    read: ReadMeasurement
    model: str | None = None
    block_device: str | None = None
    path: str | None = None
    others: tuple[ReadMeasurement, ...] = ()
    line: int | None = None

    @property
    def read_bytes_per_s(self) -> float:
        return self.read.read_bytes_per_s

    @property
    def read_iops(self) -> float | None:
        return self.read.read_iops

    def measurements(self) -> tuple[ReadMeasurement, ...]:
        """The figure used, then the others."""
        return (self.read, *self.others)


@dataclass(frozen=True)
class LinkCapacity:
    """A measured link rate, in bytes/s per direction.

    Either ``src`` and ``dst`` (node ids or PCI bus addresses; for a
    ``peer-to-peer`` class the two GPUs) or ``link_class`` alone: a
    ``host-to-device`` / ``device-to-host`` figure for one GPU (``device``)
    or, without ``device``, for every GPU; an ``inter-socket`` figure for
    every socket-to-socket link. ``transfer_bytes`` is the size of each copy.
    """

    bytes_per_s: float
    src: str | None = None
    dst: str | None = None
    link_class: str | None = None
    device: str | None = None
    transfer_bytes: int | None = None
    tool: str | None = None
    date: str | None = None
    host: str | None = None
    note: str | None = None
    line: int | None = None

    @property
    def label(self) -> str:
        if self.link_class is None:
            return f"{self.src} → {self.dst}"
        if self.src is not None:
            return f"{self.link_class} {self.src} → {self.dst}"
        return f"{self.link_class} {self.device}" if self.device else f"{self.link_class} (all)"


@dataclass(frozen=True)
class MemoryCapacity:
    """DRAM bandwidth of one NUMA node (``numa_node=None``: every node without its own entry).

    ``bytes_per_s`` follows ``convention``: ``"stream-copy"`` (the STREAM
    benchmark's, which counts the bytes read plus the bytes written of a
    copy) unless the file says otherwise. ``method`` names how it was
    measured (``numpy-copy``), ``threads`` how many threads copied.
    """

    numa_node: int | None
    bytes_per_s: float
    method: str | None = None
    convention: str | None = None
    array_bytes: int | None = None
    repeats: int | None = None
    threads: int | None = None
    date: str | None = None
    host: str | None = None
    note: str | None = None
    line: int | None = None


@dataclass(frozen=True)
class PcieEfficiency:
    """Measured share of a PCIe link's encoded rate that carries payload (0 < value ≤ 1)."""

    value: float
    derived_from: str | None = None
    note: str | None = None
    line: int | None = None


@dataclass(frozen=True)
class Capacities:
    """A whole capacities file. ``notes`` says what was not measured and why."""

    devices: tuple[DeviceCapacity, ...] = ()
    links: tuple[LinkCapacity, ...] = ()
    memory: tuple[MemoryCapacity, ...] = ()
    pcie_efficiency: PcieEfficiency | None = None
    host: str | None = None
    date: str | None = None
    tool: str | None = None
    notes: tuple[str, ...] = ()
    source: str | None = None

    def device(self, key: str) -> DeviceCapacity | None:
        """The entry whose key is exactly ``key``."""
        return next((d for d in self.devices if d.key == key), None)

    def is_empty(self) -> bool:
        return not (self.devices or self.links or self.memory or self.pcie_efficiency)


# ---------------------------------------------------------------------------
# parsing


_PLAIN_FLOAT = re.compile(r"^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$")


class _CapsReader(_Reader):
    document = "a capacities file"
    schema = SCHEMA

    # YAML 1.1 reads "1e9" and "5e5" (no dot, no exponent sign) as strings;
    # measured figures are often written that way, so take them as numbers
    def _plain_number(self, node: YamlNode) -> float | None:
        if isinstance(node, ScalarNode) and node.tag == "tag:yaml.org,2002:str" and node.style is None \
                and _PLAIN_FLOAT.match(node.value):
            return float(node.value)
        return None

    def number(self, node: YamlNode, what: str, positive: bool = True, hi: float = math.inf) -> float:
        v = self._plain_number(node)
        if v is None:
            return super().number(node, what, positive, hi)
        if not math.isfinite(v) or (positive and v <= 0) or v > hi:
            self.fail(node, what, str(node.value))
        return v

    def quantity(self, node: YamlNode, what: str, pattern: re.Pattern[str], bits: bool) -> float:
        v = self._plain_number(node)
        if v is None:
            return super().quantity(node, what, pattern, bits)
        if not math.isfinite(v) or v <= 0:
            self.fail(node, what, str(node.value))
        return v

    def date(self, node: YamlNode, what: str) -> str:
        # YAML reads an unquoted ISO time as a datetime; keep it as text
        v = self.scalar(node, what)
        if isinstance(v, (_dt.date, _dt.datetime)):
            return v.isoformat()
        return self.text(node, what)


def parse_capacities(text: str, source: str = "<capacities>") -> Capacities:
    """Parse the text of a capacities file; ``source`` names it in messages.

    Raises :class:`~planner.errors.ParseError` (with the line) on anything
    that is not a valid ``moment.capacities`` version 1 document.
    """
    r = _CapsReader(text, source)
    root = r.compose()
    top = r.mapping(root, f"a capacities file (a YAML mapping starting 'schema: {SCHEMA}')")
    schema_node = r.require(top, "schema", root, f"a capacities file ('schema: {SCHEMA}')")
    schema = r.text(schema_node, f"schema: {SCHEMA}")
    if schema != SCHEMA:
        r.fail(schema_node, f"schema: {SCHEMA}", schema)
    version_node = r.require(top, "version", root, "a capacities file")
    v = r.scalar(version_node, f"version {VERSION} (a number) of the {SCHEMA} schema")
    if isinstance(v, bool) or v != VERSION:
        r.fail(version_node, f"version {VERSION} (a number) of the {SCHEMA} schema",
               str(version_node.value))
    r.keys(top, _TOP_KEYS, "a capacities file")

    def opt(m: dict[str, tuple[ScalarNode, YamlNode]], key: str) -> YamlNode | None:
        node = m[key][1] if key in m else None
        return None if node is None or r.is_null(node) else node

    host = r.text(n, "a host name") if (n := opt(top, "host")) is not None else None
    date = r.date(n, "a date (ISO 8601)") if (n := opt(top, "date")) is not None else None
    tool = r.text(n, "the tool that wrote the file") if (n := opt(top, "tool")) is not None else None
    notes: list[str] = []
    if (n := opt(top, "notes")) is not None:
        notes = [r.text(x, "a note (text)") for x in r.sequence(n, "a list of notes")]

    devices: list[DeviceCapacity] = []
    if (n := opt(top, "devices")) is not None:
        dm = r.mapping(n, "devices (a mapping from a device id, bus address or model to its figures)")
        for key, (knode, value) in dm.items():
            devices.append(_device(r, key.strip(), knode, value))
    links: list[LinkCapacity] = []
    if (n := opt(top, "links")) is not None:
        links = [_link(r, e) for e in r.sequence(n, "a list of links")]
    memory: list[MemoryCapacity] = []
    if (n := opt(top, "memory")) is not None:
        mm = r.mapping(n, "memory (a mapping from a NUMA node number, or 'all', to its figures)")
        for key, (knode, value) in mm.items():
            memory.append(_memory(r, key, knode, value))
    eff = _efficiency(r, n) if (n := opt(top, "pcie_efficiency")) is not None else None
    return Capacities(tuple(devices), tuple(links), tuple(memory), eff, host, date, tool,
                      tuple(notes), source)


def _fields(r: _CapsReader, m: dict[str, tuple[ScalarNode, YamlNode]],
            spec: dict[str, Callable[[YamlNode, str], Any]], whats: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, convert in spec.items():
        if key in m and not r.is_null(m[key][1]):
            out[key] = convert(m[key][1], whats[key])
    return out


def _positive_int(r: _CapsReader, hi: int) -> Callable[[YamlNode, str], int]:
    def convert(node: YamlNode, what: str) -> int:
        return r.integer(node, f"{what} (a whole number, 1 to {hi})", 1, hi)
    return convert


def _whole_size(r: _CapsReader) -> Callable[[YamlNode, str], int]:
    def convert(node: YamlNode, what: str) -> int:
        v = r.size(node, what)
        if not float(v).is_integer():
            r.fail(node, f"{what}: a whole number of bytes", str(node.value))
        return int(v)
    return convert


_MEASUREMENT_WHAT = {
    "read_bytes_per_s": "a read rate", "read_iops": "reads per second (a number)",
    "block_bytes": "a read size", "queue_depth": "a queue depth", "tool": "a tool name",
    "mode": "a mode", "file_bytes": "a file size", "seconds": "a duration in seconds (a number)",
    "jobs": "a description of the jobs (text)", "date": "a date (ISO 8601)",
    "host": "a host name", "note": "a note (text)",
}


def _measurement(r: _CapsReader, node: YamlNode, m: dict[str, tuple[ScalarNode, YamlNode]],
                 what: str) -> ReadMeasurement:
    f = _fields(r, m, {
        "read_bytes_per_s": r.bandwidth, "read_iops": r.number, "block_bytes": _whole_size(r),
        "queue_depth": _positive_int(r, 1 << 20), "tool": r.text,
        "mode": lambda n, w: r.choice(n, w, MODES), "file_bytes": _whole_size(r),
        "seconds": r.number, "jobs": r.text, "date": r.date, "host": r.text, "note": r.text,
    }, _MEASUREMENT_WHAT)
    if "read_bytes_per_s" not in f:
        if "read_iops" in f and "block_bytes" in f:
            f["read_bytes_per_s"] = f["read_iops"] * f["block_bytes"]
        else:
            r.fail(node, f"'read_bytes_per_s:' (or 'read_iops:' with 'block_bytes:') in {what}")
    return ReadMeasurement(**f)


def _device(r: _CapsReader, key: str, knode: YamlNode, node: YamlNode) -> DeviceCapacity:
    if not key:
        r.fail(knode, "a device id, bus address or model name as the key", "an empty key")
    what = f"the figures of device {key!r}"
    m = r.mapping(node, f"{what} (a mapping with 'read_bytes_per_s:' or 'read_iops:')")
    r.keys(m, _DEVICE_KEYS, what)
    read = _measurement(r, node, m, what)
    f = _fields(r, m, {"model": r.text, "block_device": r.text, "path": r.text},
                {"model": "a device model (text)", "block_device": "a block device name",
                 "path": "a path (text)"})
    others: list[ReadMeasurement] = []
    if "other_measurements" in m and not r.is_null(m["other_measurements"][1]):
        for e in r.sequence(m["other_measurements"][1], "a list of other measurements"):
            em = r.mapping(e, "a measurement (a mapping with 'read_bytes_per_s:' or 'read_iops:')")
            r.keys(em, _MEASUREMENT_KEYS, "a measurement")
            others.append(_measurement(r, e, em, "a measurement"))
    return DeviceCapacity(key, read, others=tuple(others), line=r.line(knode), **f)


def _link(r: _CapsReader, node: YamlNode) -> LinkCapacity:
    m = r.mapping(node, "a link (a mapping with 'src:' and 'dst:', or 'class:', and 'bytes_per_s:')")
    r.keys(m, _LINK_KEYS, "a link")
    f = _fields(r, m, {
        "bytes_per_s": r.bandwidth, "src": r.text, "dst": r.text,
        "class": lambda n, w: r.choice(n, w, LINK_CLASSES), "device": r.text,
        "transfer_bytes": _whole_size(r), "tool": r.text, "date": r.date, "host": r.text,
        "note": r.text,
    }, {"bytes_per_s": "a link bandwidth", "src": "a node id or bus address",
        "dst": "a node id or bus address", "class": "a link class", "device": "a device id or bus address",
        "transfer_bytes": "a transfer size", "tool": "a tool name", "date": "a date (ISO 8601)",
        "host": "a host name", "note": "a note (text)"})
    if "bytes_per_s" not in f:
        r.fail(node, "a 'bytes_per_s:' key in a link")
    cls = f.pop("class", None)
    ends = ("src" in f) + ("dst" in f)
    if ends == 1:
        r.fail(node, "both 'src:' and 'dst:' in a link (or neither, with 'class:')")
    if cls is None and ends == 0:
        r.fail(node, "'src:' and 'dst:', or 'class:', in a link")
    if cls == "peer-to-peer" and ends == 0:
        r.fail(node, "'src:' and 'dst:' (the two GPUs) in a peer-to-peer link")
    if cls in ("host-to-device", "device-to-host", "inter-socket") and ends:
        r.fail(m["src"][0], f"no 'src:'/'dst:' in a {cls} link (name the GPU with 'device:')",
               "src")
    if "device" in f and cls not in ("host-to-device", "device-to-host"):
        r.fail(m["device"][0], "'device:' only in a host-to-device or device-to-host link", "device")
    if f.get("src") is not None and f.get("src") == f.get("dst"):
        r.fail(m["dst"][1], "two different ends of a link", f["dst"])
    return LinkCapacity(link_class=cls, line=r.line(node), **f)


def _memory(r: _CapsReader, key: str, knode: YamlNode, node: YamlNode) -> MemoryCapacity:
    if key.strip().lower() == "all":
        numa: int | None = None
    elif key.strip().isascii() and key.strip().isdigit() and len(key.strip()) <= 4:
        numa = int(key)
    else:
        r.fail(knode, "a NUMA node number (0, 1, ...) or 'all'", key)
    what = f"the memory figures of NUMA node {key}"
    m = r.mapping(node, f"{what} (a mapping with 'bytes_per_s:')")
    r.keys(m, _MEMORY_KEYS, what)
    f = _fields(r, m, {
        "bytes_per_s": r.bandwidth, "method": r.text, "convention": r.text,
        "array_bytes": _whole_size(r), "repeats": _positive_int(r, 1 << 20),
        "threads": _positive_int(r, 1 << 20), "date": r.date, "host": r.text, "note": r.text,
    }, {"bytes_per_s": "a memory bandwidth", "method": "a method (text)",
        "convention": "a convention (text)", "array_bytes": "an array size",
        "repeats": "a number of repeats", "threads": "a number of threads",
        "date": "a date (ISO 8601)", "host": "a host name", "note": "a note (text)"})
    if "bytes_per_s" not in f:
        r.fail(node, f"a 'bytes_per_s:' key in {what}")
    return MemoryCapacity(numa, line=r.line(knode), **f)


def _efficiency(r: _CapsReader, node: YamlNode) -> PcieEfficiency:
    what = "a PCIe protocol efficiency in (0, 1]"
    if isinstance(node, MappingNode):
        m = r.mapping(node, f"{what} (a number, or a mapping with 'value:')")
        r.keys(m, _EFFICIENCY_KEYS, "pcie_efficiency")
        value_node = r.require(m, "value", node, "pcie_efficiency")
        value = r.number(value_node, what, hi=1.0)
        f = _fields(r, m, {"derived_from": r.text, "note": r.text},
                    {"derived_from": "what it was derived from (text)", "note": "a note (text)"})
        return PcieEfficiency(value, line=r.line(value_node), **f)
    return PcieEfficiency(r.number(node, what, hi=1.0), line=r.line(node))


def load_capacities(path: str | os.PathLike[str]) -> Capacities:
    """The capacities file at ``path`` (YAML or JSON).

    >>> load_capacities("/nonexistent/caps.yaml")
    Traceback (most recent call last):
    ...
    planner.errors.ParseError: /nonexistent/caps.yaml: expected a text file, found 'no such file'
    """
    return parse_capacities(read_text(path), str(path))


# ---------------------------------------------------------------------------
# writing


def _clean(value: Any) -> Any:
    """Floats that are whole numbers written as integers; everything else as is."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    return value


def _measurement_dict(mm: ReadMeasurement) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in _MEASUREMENT_KEYS:
        v = getattr(mm, key)
        if v is not None:
            out[key] = _clean(round(v, 1) if key in ("read_bytes_per_s", "read_iops") else v)
    return out


def to_dict(caps: Capacities) -> dict[str, Any]:
    """``caps`` as plain data in the file's layout (what :func:`dump_capacities` writes)."""
    out: dict[str, Any] = {"schema": SCHEMA, "version": VERSION}
    for key in ("host", "date", "tool"):
        if getattr(caps, key) is not None:
            out[key] = getattr(caps, key)
    if caps.notes:
        out["notes"] = list(caps.notes)
    if caps.devices:
        devices: dict[str, Any] = {}
        for d in caps.devices:
            entry: dict[str, Any] = {}
            for key in ("model", "block_device", "path"):
                if getattr(d, key) is not None:
                    entry[key] = getattr(d, key)
            entry.update(_measurement_dict(d.read))
            if d.others:
                entry["other_measurements"] = [_measurement_dict(o) for o in d.others]
            devices[d.key] = entry
        out["devices"] = devices
    if caps.links:
        links = []
        for lk in caps.links:
            e: dict[str, Any] = {}
            for key, attr in (("class", "link_class"), ("src", "src"), ("dst", "dst"),
                              ("device", "device"), ("bytes_per_s", "bytes_per_s"),
                              ("transfer_bytes", "transfer_bytes"), ("tool", "tool"),
                              ("date", "date"), ("host", "host"), ("note", "note")):
                v = getattr(lk, attr)
                if v is not None:
                    e[key] = _clean(round(v, 1) if key == "bytes_per_s" else v)
            links.append(e)
        out["links"] = links
    if caps.memory:
        memory: dict[Any, Any] = {}
        for mem in caps.memory:
            e = {}
            for key in _MEMORY_KEYS:
                v = getattr(mem, key)
                if v is not None:
                    e[key] = _clean(round(v, 1) if key == "bytes_per_s" else v)
            memory["all" if mem.numa_node is None else mem.numa_node] = e
        out["memory"] = memory
    if caps.pcie_efficiency is not None:
        pe = caps.pcie_efficiency
        e = {"value": pe.value}
        if pe.derived_from is not None:
            e["derived_from"] = pe.derived_from
        if pe.note is not None:
            e["note"] = pe.note
        out["pcie_efficiency"] = e
    return out


def dump_capacities(caps: Capacities, fmt: str = "yaml") -> str:
    """The text of a capacities file, ``fmt`` ``"yaml"`` or ``"json"``.

    >>> caps = Capacities(memory=(MemoryCapacity(0, 2.5e10, method="numpy-copy"),), host="box")
    >>> print(dump_capacities(caps), end="")
    # Measured capacities (schema moment.capacities v1, see docs/capacities.md)
    schema: moment.capacities
    version: 1
    host: box
    memory:
      0:
        bytes_per_s: 25000000000
        method: numpy-copy
    >>> parse_capacities(dump_capacities(caps, "json")).memory[0].bytes_per_s
    25000000000.0
    """
    data = to_dict(caps)
    if fmt == "json":
        # JSON keys are strings; the reader takes "0" as NUMA node 0
        if "memory" in data:
            data["memory"] = {str(k): v for k, v in data["memory"].items()}
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    if fmt != "yaml":
        raise ValueError(f"unknown format {fmt!r} (yaml or json)")
    head = f"# Measured capacities (schema {SCHEMA} v{VERSION}, see docs/capacities.md)\n"
    return head + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)


def save_capacities(caps: Capacities, path: str | os.PathLike[str]) -> Path:
    """Write ``caps`` to ``path`` atomically (JSON for ``*.json``, YAML otherwise).

    The text goes to a temporary file in the same directory, which then
    replaces ``path``: a reader never sees half a file. Raises
    :class:`~planner.errors.PlannerError` when the directory is missing or
    not writable.
    """
    target = Path(path)
    fmt = "json" if target.suffix.lower() == ".json" else "yaml"
    text = dump_capacities(caps, fmt)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise PlannerError(f"cannot write {target}: no directory {directory}")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise PlannerError(f"cannot write {target}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise PlannerError(f"cannot write {target}: {exc.strerror or exc}") from None
    return target


# ---------------------------------------------------------------------------
# applying to a topology


@dataclass(frozen=True)
class Replacement:
    """One figure of a topology that a measurement replaced.

    ``element`` is a node id or ``"src→dst"``; ``field`` the attribute
    (``bytes_per_s`` of a link, ``read_bytes_per_s`` of a device); ``old``
    and ``old_source`` the figure before and where it came from (a link's
    ``bandwidth_source``, ``"spec"``/``"none"`` for a device); ``entry`` the
    capacities entry it came from (``devices[0000:01:00.0]``, ``memory[0]``,
    ``links[2]``, ``pcie_efficiency``).
    """

    element: str
    field: str
    old: float | None
    new: float
    old_source: str
    entry: str
    tool: str | None = None


class AppliedCapacities(NamedTuple):
    """What :func:`apply_capacities` returns: the new topology, what changed, what matched nothing."""

    topology: Topology
    replaced: tuple[Replacement, ...]
    unused: tuple[str, ...]


def _norm_model(s: str) -> str:
    return " ".join(s.split()).casefold()


def _resolve(topo: Topology, ref: str) -> Node | None:
    """A node from its id or a PCI bus address (``0000:3b:00.0``, ``3b:00.0``, ``pci:...``)."""
    if ref in topo:
        return topo.node(ref)
    addr = ref[4:] if ref.startswith("pci:") else ref
    try:
        addr = normalize_address(addr)
    except TopologyError:
        return None
    return topo.find(addr)


def _edge(lk: Link) -> str:
    return f"{lk.src}→{lk.dst}"


def apply_capacities(topo: Topology, caps: Capacities) -> Topology:
    """A copy of ``topo`` whose figures are the measured ones where ``caps`` has them.

    What is replaced and how is described under :func:`apply_capacities_report`,
    which also returns the list of replaced figures and of entries that
    matched nothing; here both are only summed up in the topology's
    ``notes``, and :func:`measured_figures` lists the measured figures of
    the result.

    >>> from planner.topology.spec import load_machine
    >>> caps = Capacities(memory=(MemoryCapacity(None, 4e10),))
    >>> topo = apply_capacities(load_machine("moment-b"), caps)
    >>> measured_figures(topo)
    [('socket0→mem0', 'bytes_per_s', 'measured'), ('socket1→mem1', 'bytes_per_s', 'measured')]
    """
    return apply_capacities_report(topo, caps).topology


def apply_capacities_report(topo: Topology, caps: Capacities) -> AppliedCapacities:
    """:func:`apply_capacities`, also returning what it replaced and what matched nothing.

    - ``pcie_efficiency`` recomputes every PCIe link whose capacity came from
      the generation × width table (``bandwidth_source="pcie"``) with the
      measured efficiency (the link keeps ``"pcie"`` as its source and gets
      ``attrs["efficiency_source"] = "measured"``);
    - a ``links:`` entry between two adjacent nodes replaces that link's
      ``bytes_per_s``; a ``host-to-device`` / ``device-to-host`` entry
      replaces the GPU's own link (the link to its parent: a copy between
      host memory and one GPU is bounded by the slowest link on its path,
      and charging that to the GPU's own link is the conservative reading);
      without ``device:`` every GPU without a figure of its own gets it; a
      ``peer-to-peer`` entry replaces a direct NVLink link; ``inter-socket``
      every socket-to-socket link. The model has one capacity per link for
      both directions, so when both directions are measured the lower one
      is used (``attrs["measured_directions"]`` keeps both);
    - a ``memory:`` entry replaces the socket-to-DRAM link of its NUMA node;
    - a ``devices:`` entry gives the device node ``attrs`` ``read_bytes_per_s``,
      ``read_iops``, ``read_block_bytes`` and ``read_measurement`` (how it
      was measured). Its key is matched as a node id, then as a PCI bus
      address, then as a model name (case and spacing ignored) against the
      ``model`` attribute or name of every device node; an id or address
      entry wins over a model entry for the same node.

    Every replaced link gets ``bandwidth_source="measured"`` and
    ``attrs["table_bytes_per_s"]`` (the figure it had). The topology's
    ``notes`` say how many figures are measured and which entries matched
    nothing; the returned :class:`AppliedCapacities` lists both in full.

    >>> from planner.topology.model import Link, Node, NodeKind, Topology
    >>> t = Topology("toy")
    >>> for n in (Node("socket0", NodeKind.SOCKET, numa_node=0), Node("mem0", NodeKind.MEMORY, numa_node=0),
    ...           Node("pci:0000:01:00.0", NodeKind.NVME, "P5510", bus_address="0000:01:00.0")):
    ...     _ = t.add_node(n)
    >>> _ = t.add_link(Link("socket0", "mem0", LinkKind.MEMORY, 1e11, bandwidth_source="default"))
    >>> _ = t.add_link(Link.pcie("socket0", "pci:0000:01:00.0", gen=4, lanes=4))
    >>> caps = Capacities(memory=(MemoryCapacity(0, 4e10),), pcie_efficiency=PcieEfficiency(0.9),
    ...     devices=(DeviceCapacity("0000:01:00.0", ReadMeasurement(3e9, 732421.875, 4096)),))
    >>> new, replaced, unused = apply_capacities_report(t, caps)
    >>> lk = new.link_between("socket0", "mem0")
    >>> lk.bytes_per_s, lk.bandwidth_source
    (40000000000.0, 'measured')
    >>> round(new.link_between("socket0", "pci:0000:01:00.0").bytes_per_s / 1e9, 2)
    7.09
    >>> new.node("pci:0000:01:00.0").attrs["read_bytes_per_s"]
    3000000000.0
    >>> [(r.element, r.field) for r in replaced]
    [('socket0→pci:0000:01:00.0', 'bytes_per_s'), ('socket0→mem0', 'bytes_per_s'), ('pci:0000:01:00.0', 'read_bytes_per_s')]
    """
    new = topo.copy()
    replaced: list[Replacement] = []
    unused: list[str] = []
    src_name = caps.source or "capacities"

    # -- PCIe efficiency: table links recomputed ---------------------------
    if caps.pcie_efficiency is not None:
        eff = caps.pcie_efficiency.value
        for lk in new.links(LinkKind.PCIE):
            if lk.bandwidth_source != "pcie" or not lk.pcie_gen or not lk.lanes:
                continue
            try:
                bw = pcie_bytes_per_s(lk.pcie_gen, lk.lanes, eff)
            except TopologyError:
                continue
            new.replace_link(replace(lk, bytes_per_s=bw, attrs={
                **lk.attrs, "efficiency": eff, "efficiency_source": "measured"}))
            replaced.append(Replacement(_edge(lk), "bytes_per_s", lk.bytes_per_s, bw, "pcie",
                                        "pcie_efficiency"))

    # -- links: collect per topology link, per direction -------------------
    # key: (link src, link dst) → list of (direction "down"/"up"/"both", figure, entry label, tool)
    found: dict[tuple[str, str], list[tuple[str, float, str, str | None]]] = {}
    class_wide: list[tuple[int, LinkCapacity]] = []

    def add(lk: Link, direction: str, value: float, label: str, tool: str | None) -> None:
        found.setdefault(lk.key, []).append((direction, value, label, tool))

    for i, lc in enumerate(caps.links):
        label = f"links[{i}]"
        if lc.link_class in ("host-to-device", "device-to-host"):
            if lc.device is None:
                class_wide.append((i, lc))
                continue
            dev = _resolve(new, lc.device)
            parent = new.parent(dev.id) if dev is not None else None
            if dev is None or parent is None:
                unused.append(f"{label} ({lc.label}): no device {lc.device!r} with a parent link "
                              "in the topology")
                continue
            lk = new.link_between(parent.id, dev.id)
            assert lk is not None
            down = lc.link_class == "host-to-device"
            add(lk, "down" if (lk.dst == dev.id) == down else "up", lc.bytes_per_s, label, lc.tool)
        elif lc.link_class == "inter-socket":
            links = new.links(LinkKind.INTER_SOCKET)
            if not links:
                unused.append(f"{label} ({lc.label}): the topology has no inter-socket link")
            for lk in links:
                add(lk, "both", lc.bytes_per_s, label, lc.tool)
        else:
            assert lc.src is not None and lc.dst is not None
            a, b = _resolve(new, lc.src), _resolve(new, lc.dst)
            lk = new.link_between(a.id, b.id) if a is not None and b is not None else None
            if lk is None or (lc.link_class == "peer-to-peer" and lk.kind != LinkKind.NVLINK):
                why = ("no such node" if a is None or b is None else
                       "no direct NVLink link joins them (PCIe peer traffic crosses several links)"
                       if lc.link_class == "peer-to-peer" else "no link joins them")
                unused.append(f"{label} ({lc.label}): {why}")
                continue
            add(lk, "down" if (a.id, b.id) == lk.key else "up", lc.bytes_per_s, label, lc.tool)
    for i, lc in class_wide:
        gpus = [g for g in new.nodes(NodeKind.GPU) if new.parent(g.id) is not None]
        hit = 0
        for g in gpus:
            parent = new.parent(g.id)
            assert parent is not None
            lk = new.link_between(parent.id, g.id)
            assert lk is not None
            direction = "down" if lc.link_class == "host-to-device" else "up"
            if any(d == direction and not lab.startswith("class:") for d, _, lab, _ in found.get(lk.key, [])):
                continue  # this GPU has its own figure
            add(lk, direction, lc.bytes_per_s, f"class:links[{i}]", lc.tool)
            hit += 1
        if not hit:
            unused.append(f"links[{i}] ({lc.label}): no GPU in the topology without its own figure")

    for key, figures in found.items():
        lk = new.link_between(*key)
        assert lk is not None
        per_dir: dict[str, float] = {}
        for direction, value, _, _ in figures:
            for d in (("down", "up") if direction == "both" else (direction,)):
                per_dir[d] = min(value, per_dir.get(d, math.inf))
        value = min(per_dir.values())
        labels = sorted({lab.removeprefix("class:") for _, _, lab, _ in figures})
        tools = sorted({t for _, _, _, t in figures if t})
        attrs: dict[str, Any] = {**lk.attrs, "table_bytes_per_s": lk.bytes_per_s,
                                 "table_source": lk.bandwidth_source}
        if len(per_dir) == 2 and per_dir["down"] != per_dir["up"]:
            attrs["measured_directions"] = {f"{lk.src}→{lk.dst}": per_dir["down"],
                                            f"{lk.dst}→{lk.src}": per_dir["up"]}
        new.replace_link(replace(lk, bytes_per_s=value, bandwidth_source="measured", attrs=attrs))
        replaced.append(Replacement(_edge(lk), "bytes_per_s", lk.bytes_per_s, value,
                                    lk.bandwidth_source, ", ".join(labels),
                                    ", ".join(tools) or None))

    # -- memory ---------------------------------------------------------------
    by_node = {m.numa_node: m for m in caps.memory}
    used_mem: set[int | None] = set()
    for mem in new.nodes(NodeKind.MEMORY):
        numa = mem.numa_node
        if numa is None and mem.id.startswith("mem") and mem.id[3:].isdigit():
            numa = int(mem.id[3:])
        mc = by_node.get(numa) if numa is not None else None
        mc = mc or by_node.get(None)
        parent = new.parent(mem.id)
        lk = new.link_between(parent.id, mem.id) if parent is not None else None
        if mc is None or lk is None:
            continue
        used_mem.add(mc.numa_node)
        new.replace_link(replace(lk, bytes_per_s=mc.bytes_per_s, bandwidth_source="measured",
                                 attrs={**lk.attrs, "table_bytes_per_s": lk.bytes_per_s,
                                        "table_source": lk.bandwidth_source,
                                        "measured_convention": mc.convention or "stream-copy"}))
        entry = "memory[all]" if mc.numa_node is None else f"memory[{mc.numa_node}]"
        replaced.append(Replacement(_edge(lk), "bytes_per_s", lk.bytes_per_s, mc.bytes_per_s,
                                    lk.bandwidth_source, entry, mc.method))
    for mc in caps.memory:
        if mc.numa_node not in used_mem:
            where = "all" if mc.numa_node is None else str(mc.numa_node)
            unused.append(f"memory[{where}]: no memory node of NUMA node {where} in the topology")

    # -- devices: model entries first, ids and addresses override -----------
    targets: dict[str, DeviceCapacity] = {}
    specific: set[str] = set()
    device_nodes = [n for n in new.nodes() if n.kind in DEVICE_KINDS]
    for dc in caps.devices:
        node = _resolve(new, dc.key)
        if node is not None:
            targets[node.id] = dc
            specific.add(node.id)
            continue
        want = _norm_model(dc.key)
        hits = [n for n in device_nodes
                if want in (_norm_model(str(n.attrs.get("model", ""))), _norm_model(n.name))]
        if not hits:
            unused.append(f"devices[{dc.key}]: no node with that id, bus address or model")
        for n in hits:
            if n.id not in specific:
                targets[n.id] = dc
    for node_id, dc in targets.items():
        node = new.node(node_id)
        rd = dc.read
        how = {k: v for k, v in _measurement_dict(rd).items()
               if k not in ("read_bytes_per_s", "read_iops", "block_bytes")}
        how["entry"] = dc.key
        extra: dict[str, Any] = {"read_bytes_per_s": rd.read_bytes_per_s, "read_source": "measured",
                                 "read_measurement": how}
        if rd.read_iops is not None:
            extra["read_iops"] = rd.read_iops
        if rd.block_bytes is not None:
            extra["read_block_bytes"] = rd.block_bytes
        old = node.attrs.get("read_bytes_per_s")
        new.replace_node(node.with_attrs(**extra))
        replaced.append(Replacement(node_id, "read_bytes_per_s",
                                    float(old) if isinstance(old, (int, float)) else None,
                                    rd.read_bytes_per_s, "spec" if old is not None else "none",
                                    f"devices[{dc.key}]", rd.tool))

    if replaced:
        n_links = sum(1 for r in replaced if r.field == "bytes_per_s")
        n_dev = len(replaced) - n_links
        new.notes.append(f"{src_name}: {n_links} link figure(s) and {n_dev} device figure(s) "
                         "are measured (bandwidth_source 'measured' / attrs 'read_source'); "
                         "the others are from tables or specs")
    for u in unused:
        new.notes.append(f"{src_name}: not applied: {u}")
    return AppliedCapacities(new, tuple(replaced), tuple(unused))


def find_device(caps: Capacities, key_or_model: str) -> DeviceCapacity | None:
    """The entry for a node id, bus address or model name (model compared ignoring case and spacing).

    >>> caps = Capacities(devices=(DeviceCapacity("Intel P5510 3.84 TB", ReadMeasurement(3e9)),))
    >>> find_device(caps, "intel  p5510 3.84 tb").read_bytes_per_s
    3000000000.0
    """
    exact = caps.device(key_or_model)
    if exact is not None:
        return exact
    want = _norm_model(key_or_model)
    for d in caps.devices:
        if _norm_model(d.key) == want or (d.model and _norm_model(d.model) == want):
            return d
    return None


def apply_to_inventory(items: Sequence[Any], caps: Capacities) -> list[Any]:
    """Device models or inventory items with the measured figures of ``caps``.

    Works on anything with a model name: a ``devices:`` entry is looked up
    (:func:`find_device`) by the item's ``model``, ``title`` or ``name``.
    An item with ``read_bytes_per_s`` / ``read_iops`` fields (a
    ``planner.inventory.DeviceModel``) gets them replaced (``read_iops`` only
    for a measurement at 4 KiB) and ``source`` set to say so; an item
    keeping figures in ``attrs`` (a spec's ``InventoryItem``) gets
    ``attrs["read_bytes_per_s"]`` and ``attrs["random_read_iops"]``, listed
    in ``attrs["measured_fields"]`` and dropped from ``attrs["inferred_fields"]``.
    Items without an entry are returned as they are.

    >>> from planner.inventory import device_model
    >>> caps = Capacities(devices=(DeviceCapacity("P5510", ReadMeasurement(2.5e9, 610351.5625, 4096)),))
    >>> m = apply_to_inventory([device_model("p5510")], caps)[0]
    >>> m.read_bytes_per_s, m.read_iops, m.source
    (2500000000.0, 610351.5625, 'measured (capacities)')
    """
    out = []
    for item in items:
        dc = None
        for attr in ("model", "title", "name"):
            name = getattr(item, attr, None)
            if isinstance(name, str) and name and (dc := find_device(caps, name)) is not None:
                break
        if dc is None:
            out.append(item)
            continue
        rd = dc.read
        at_4k = rd.read_iops is not None and rd.block_bytes == 4096
        fields = getattr(item, "__dataclass_fields__", {})
        if "read_bytes_per_s" in fields:
            changes: dict[str, Any] = {"read_bytes_per_s": rd.read_bytes_per_s}
            if at_4k and "read_iops" in fields:
                changes["read_iops"] = rd.read_iops
            if "source" in fields:
                changes["source"] = f"measured ({rd.tool or caps.source or 'capacities'})"
            out.append(replace(item, **changes))
            continue
        attrs = dict(item.attrs)
        measured = ["read_bytes_per_s"]
        attrs["read_bytes_per_s"] = rd.read_bytes_per_s
        if at_4k:
            attrs["random_read_iops"] = rd.read_iops
            measured.append("random_read_iops")
        attrs["measured_fields"] = measured
        if "inferred_fields" in attrs:
            attrs["inferred_fields"] = [f for f in attrs["inferred_fields"] if f not in measured]
        out.append(replace(item, attrs=attrs))
    return out


def measured_figures(topo: Topology) -> list[tuple[str, str, str]]:
    """Every figure of ``topo`` that a measurement set: ``(element, field, how)`` triples.

    ``element`` is a node id or ``"src→dst"``; ``how`` is ``"measured"``, or
    ``"measured efficiency"`` for a PCIe link recomputed with a measured
    protocol efficiency. The counterpart of
    :func:`planner.topology.spec.inferred_figures`, for a plan report.
    """
    out: list[tuple[str, str, str]] = []
    for lk in topo.links():
        if lk.bandwidth_source == "measured":
            out.append((_edge(lk), "bytes_per_s", "measured"))
        elif lk.attrs.get("efficiency_source") == "measured":
            out.append((_edge(lk), "bytes_per_s", "measured efficiency"))
    for n in topo.nodes():
        if n.attrs.get("read_source") == "measured":
            out.append((n.id, "read_bytes_per_s", "measured"))
    return out

