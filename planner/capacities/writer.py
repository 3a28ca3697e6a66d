"""Writing a capacities file (YAML or JSON), atomically."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

import yaml

from momentbase.jsontypes import JsonObject
from planner.capacities.model import (
    _MEASUREMENT_KEYS,
    _MEMORY_KEYS,
    SCHEMA,
    VERSION,
    Capacities,
    ReadMeasurement,
)
from planner.errors import PlannerError

__all__ = ["dump_capacities", "save_capacities", "to_dict"]


def _clean(value: object) -> object:
    """Floats that are whole numbers written as integers; everything else as is."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    return value


def _measurement_dict(mm: ReadMeasurement) -> JsonObject:
    out: JsonObject = {}
    for key in _MEASUREMENT_KEYS:
        v = getattr(mm, key)
        if v is not None:
            out[key] = _clean(round(v, 1) if key in ("read_bytes_per_s", "read_iops") else v)
    return out


def to_dict(caps: Capacities) -> JsonObject:
    """``caps`` as plain data in the file's layout (what :func:`dump_capacities` writes)."""
    out: JsonObject = {"schema": SCHEMA, "version": VERSION}
    for key in ("host", "date", "tool"):
        if getattr(caps, key) is not None:
            out[key] = getattr(caps, key)
    if caps.notes:
        out["notes"] = list(caps.notes)
    if caps.devices:
        devices: JsonObject = {}
        for d in caps.devices:
            entry: JsonObject = {}
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
            e: JsonObject = {}
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
        memory: dict[str | int, JsonObject] = {}
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

    >>> from planner.capacities import MemoryCapacity, parse_capacities
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
