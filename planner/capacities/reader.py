"""Reading a capacities file: YAML (or JSON) with line numbers in every error."""

from __future__ import annotations

import datetime as _dt
import math
import os
import re
from collections.abc import Callable
from typing import Any

from yaml.nodes import MappingNode, ScalarNode
from yaml.nodes import Node as YamlNode

from momentbase.jsontypes import JsonObject
from planner.capacities.model import (
    _DEVICE_KEYS,
    _EFFICIENCY_KEYS,
    _LINK_KEYS,
    _MEASUREMENT_KEYS,
    _MEMORY_KEYS,
    _TOP_KEYS,
    LINK_CLASSES,
    MODES,
    PAGE_CACHE,
    SCHEMA,
    VERSION,
    Capacities,
    DeviceCapacity,
    LinkCapacity,
    MemoryCapacity,
    PcieEfficiency,
    ReadMeasurement,
)

# The machine-spec reader keeps YAML line numbers and parses bandwidths and
# sizes the same way; capacities files should accept exactly what specs do.
from planner.topology.spec.yamlread import _Reader
from planner.topology.textio import read_text

__all__ = ["load_capacities", "parse_capacities"]


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
            spec: dict[str, Callable[[YamlNode, str], Any]], whats: dict[str, str]) -> JsonObject:
    out: JsonObject = {}
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
    "mode": "a mode", "page_cache": "cold or warm", "file_bytes": "a file size",
    "seconds": "a duration in seconds (a number)",
    "jobs": "a description of the jobs (text)", "date": "a date (ISO 8601)",
    "host": "a host name", "note": "a note (text)",
}


def _measurement(r: _CapsReader, node: YamlNode, m: dict[str, tuple[ScalarNode, YamlNode]],
                 what: str) -> ReadMeasurement:
    f = _fields(r, m, {
        "read_bytes_per_s": r.bandwidth, "read_iops": r.number, "block_bytes": _whole_size(r),
        "queue_depth": _positive_int(r, 1 << 20), "tool": r.text,
        "mode": lambda n, w: r.choice(n, w, MODES), "page_cache": lambda n, w: r.choice(n, w, PAGE_CACHE),
        "file_bytes": _whole_size(r),
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
