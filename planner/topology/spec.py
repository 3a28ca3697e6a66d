"""Machine specs: YAML descriptions of servers that are not at hand.

A machine spec (schema ``moment.machine``, version 1, documented in
``docs/machine-spec.md``) says which slots a server has, where they hang in
its PCIe tree, how wide they are, what is installed in them and which devices
are still to be placed. The planner reads it like any other topology source;
the bundled specs describe the paper's Machines A and B (``moment-a``,
``moment-b``).

Every figure may be written plain (``lanes: 16``: the spec's sources give it)
or with its provenance (``lanes: {value: 16, inferred: true, note: "..."}``);
a whole entry may carry ``inferred: true`` and ``note:`` too. The topology
keeps what was inferred: ``attrs["inferred_fields"]`` lists the attribute
names whose figure was inferred, ``attrs["field_notes"]`` their notes and
``attrs["inferred"]`` marks an entry that is itself inferred.

>>> text = '''
... schema: moment.machine
... version: 1
... name: toy
... defaults: {pcie_gen: 4}
... sockets:
...   - id: 0
...     numa_nodes: [0]
...     ports:
...       - slot: bay{i}
...         count: 2
...         form_factor: u.2
...         lanes: {value: 4, inferred: true, note: "U.2 bays are x4"}
...         front_bay: true
...       - switch: sw0
...         uplink: {lanes: 16}
...         ports:
...           - slot: gpu0
...             form_factor: cem
...             lanes: 16
...             double_width: true
...             device: {kind: gpu, model: A100, id: g0}
... '''
>>> spec = parse_machine_spec(text, "toy.yaml")
>>> topo = spec.topology
>>> topo.counts()["slot"], topo.counts()["switch"], topo.counts()["gpu"]
(3, 1, 1)
>>> topo.parent("dev:g0").id, topo.parent("slot:gpu0").id, topo.parent("switch:sw0").id
('slot:gpu0', 'switch:sw0', 'socket0')
>>> bay = topo.node("slot:bay1")
>>> bay.attrs["width_lanes"], bay.attrs["front_bay"], bay.attrs["inferred_fields"]
(4, True, ['width_lanes'])
>>> round(topo.link_between("switch:sw0", "slot:gpu0").bytes_per_s / 1e9, 1)
25.2
>>> parse_machine_spec("schema: moment.machine\\nversion: 2\\n", "x.yaml")
Traceback (most recent call last):
...
planner.errors.ParseError: x.yaml:2: expected version 1 (a number) of the moment.machine schema, found '2'
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import yaml
from yaml.nodes import MappingNode, ScalarNode, SequenceNode
from yaml.nodes import Node as YamlNode

from planner.errors import ParseError, TopologyError
from planner.topology.bundled import bundled_machines
from planner.topology.model import Link, LinkKind, Node, NodeKind, Topology
from planner.topology.pcie import DEFAULT_EFFICIENCY, GT_PER_S, VALID_WIDTHS, pcie_bytes_per_s
from planner.topology.pcitree import add_memory_and_interconnect, normalize_address
from planner.topology.textio import read_text

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
_NUMBER = r"([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?)"
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
           "ki": 2.0**10, "mi": 2.0**20, "gi": 2.0**30, "ti": 2.0**40}
_BANDWIDTH = re.compile(rf"^\s*{_NUMBER}\s*([kKmMgGtT]i?)?(B/s|b/s|bps)\s*$")
_SIZE = re.compile(rf"^\s*{_NUMBER}\s*([kKmMgGtT]i?)?B\s*$")
_MERGE_TAG = "tag:yaml.org,2002:merge"
_NULL_TAG = "tag:yaml.org,2002:null"


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
    attrs: dict[str, Any] = field(default_factory=dict)
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


def parse_machine_spec(text: str, source: str = "<machine spec>") -> MachineSpec:
    """Parse the text of a machine spec; ``source`` names it in error messages.

    Raises :class:`~planner.errors.ParseError` (naming ``source``, the YAML
    line and what was expected) on anything that is not a valid spec.
    """
    reader = _Reader(text, source)
    root = reader.compose()
    return _Builder(reader).build(root)


def load_machine_spec(path_or_text: str | Path, source: str | None = None) -> Topology:
    """The topology of a machine spec given as a file path or as YAML text.

    A :class:`~pathlib.Path`, or a one-line string naming an existing file or
    ending in ``.yaml``/``.yml``, is read as a file; any other string is the
    spec's text. ``source`` overrides the name used in messages.

    >>> topo = load_machine_spec(bundled_machines()["moment-b"])
    >>> topo.parent("switch:sw1").id
    'switch:sw0'
    """
    return _read_spec(path_or_text, source).topology


def read_machine_spec(name_or_path: str | Path) -> MachineSpec:
    """The whole parsed spec of a bundled machine name or a spec file path."""
    return _read_spec(_resolve(name_or_path), None)


def load_machine(name_or_path: str | Path) -> Topology:
    """The topology of a bundled machine (``"moment-a"``) or of a spec file.

    >>> load_machine("moment-a").counts()["switch"]
    2
    """
    return read_machine_spec(name_or_path).topology


def spec_inventory(name_or_path: str | Path) -> list[InventoryItem]:
    """The devices a spec lists to be placed (its ``inventory:``), empty if none.

    >>> [(i.kind.value, i.count) for i in spec_inventory("moment-a")]
    [('gpu', 4), ('nvme', 8)]
    """
    return list(read_machine_spec(name_or_path).inventory)


def inferred_figures(topo: Topology) -> list[tuple[str, str, str]]:
    """Every inferred figure of a topology built from a spec.

    Returns ``(element, field, note)`` triples: ``element`` is a node id or
    ``"src→dst"`` for a link, ``field`` an attribute name (``"entry"`` when
    the node or link itself is inferred), ``note`` the spec's note or ``""``.

    >>> ("slot:b-sw1-slot0", "width_lanes") in [
    ...     (e, f) for e, f, _ in inferred_figures(load_machine("moment-b"))]
    True
    """
    out: list[tuple[str, str, str]] = []
    items: list[tuple[str, dict[str, Any]]] = [(n.id, dict(n.attrs)) for n in topo.nodes()]
    items += [(f"{lk.src}→{lk.dst}", dict(lk.attrs)) for lk in topo.links()]
    for element, attrs in items:
        if attrs.get("inferred") is True:
            out.append((element, "entry", str(attrs.get("note", ""))))
        notes = attrs.get("field_notes", {})
        for name in attrs.get("inferred_fields", []):
            out.append((element, name, str(notes.get(name, ""))))
    return out


# ---------------------------------------------------------------------------
# files


def _resolve(name_or_path: str | Path) -> Path:
    if isinstance(name_or_path, Path):
        return name_or_path
    bundled = bundled_machines()
    if name_or_path in bundled:
        return bundled[name_or_path]
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or _is_file(path):
        return path
    raise ParseError(
        str(name_or_path), None,
        f"a bundled machine ({', '.join(sorted(bundled)) or 'none installed'}) "
        "or the path of a YAML machine spec",
    )


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # a name too long, or with a NUL byte, is no file
        return False


def _read_spec(path_or_text: str | Path, source: str | None) -> MachineSpec:
    if isinstance(path_or_text, Path) or (
        "\n" not in path_or_text
        and (path_or_text.endswith((".yaml", ".yml")) or _is_file(Path(path_or_text)))
    ):
        path = Path(path_or_text)
        return parse_machine_spec(read_text(path), source or str(path))
    return parse_machine_spec(path_or_text, source or "<machine spec>")


# ---------------------------------------------------------------------------
# YAML with line numbers


@dataclass(frozen=True)
class _Fig:
    """A figure read from the spec, with its provenance and line."""

    value: Any
    inferred: bool = False
    note: str | None = None
    line: int | None = None


def _describe(node: YamlNode) -> str:
    if isinstance(node, ScalarNode):
        return "null" if node.tag == _NULL_TAG else str(node.value)
    if isinstance(node, MappingNode):
        return "a mapping"
    return "a list"


class _Reader:
    """Walks PyYAML's composed node tree, which keeps each node's line."""

    def __init__(self, text: str, source: str) -> None:
        self.yaml_text = text
        self.source = source
        self._merging: set[int] = set()
        self.loader: yaml.SafeLoader | None = None

    # -- whole document ---------------------------------------------------
    #: what the document is and the schema it starts with, for messages (subclasses reading
    #: other YAML formats of the project set their own)
    document = "a machine spec"
    schema = SCHEMA

    def compose(self) -> YamlNode:
        if not isinstance(self.yaml_text, str):
            raise ParseError(self.source, None, f"the text of {self.document} (a str)",
                             type(self.yaml_text).__name__)
        try:
            self.loader = yaml.SafeLoader(self.yaml_text)
            root = self.loader.get_single_node()
        except yaml.YAMLError as exc:
            raise self._yaml_error(exc) from None
        except RecursionError:
            raise ParseError(self.source, None, "YAML nested at most a few hundred levels deep",
                             "deeper nesting") from None
        if root is None:
            raise ParseError(self.source, None,
                             f"{self.document} (a YAML mapping starting 'schema: {self.schema}')",
                             "an empty file")
        return root

    def _yaml_error(self, exc: yaml.YAMLError) -> ParseError:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        if mark is not None:
            line: int | None = mark.line + 1
        elif isinstance(exc, yaml.reader.ReaderError):
            line = self.yaml_text.count("\n", 0, max(exc.position, 0)) + 1
        else:
            line = None
        problem = (getattr(exc, "problem", None) or getattr(exc, "reason", None)
                   or str(exc).splitlines()[0])
        return ParseError(self.source, line, f"valid YAML ({problem})")

    # -- errors -----------------------------------------------------------
    @staticmethod
    def line(node: YamlNode) -> int:
        return node.start_mark.line + 1

    def fail(self, node: YamlNode | int | None, expected: str, found: str | None = None) -> NoReturn:
        line = node if isinstance(node, int) or node is None else self.line(node)
        raise ParseError(self.source, line, expected, found)

    # -- shapes -----------------------------------------------------------
    def mapping(self, node: YamlNode, what: str) -> dict[str, tuple[ScalarNode, YamlNode]]:
        """Keys of a mapping node with (key node, value node); merges (``<<``) applied."""
        if not isinstance(node, MappingNode):
            self.fail(node, what, _describe(node))
        if id(node) in self._merging:
            self.fail(node, f"{what} that does not merge itself", "a recursive merge")
        explicit: dict[str, tuple[ScalarNode, YamlNode]] = {}
        merged: dict[str, tuple[ScalarNode, YamlNode]] = {}
        self._merging.add(id(node))
        try:
            for key, value in node.value:
                if isinstance(key, ScalarNode) and key.tag == _MERGE_TAG:
                    parts = value.value if isinstance(value, SequenceNode) else [value]
                    for part in parts:
                        for k, kv in self.mapping(part, f"a mapping to merge into {what}").items():
                            merged.setdefault(k, kv)
                    continue
                if not isinstance(key, ScalarNode) or key.tag == _NULL_TAG:
                    self.fail(key, f"a key name in {what}", _describe(key))
                name = str(key.value)
                if name in explicit:
                    self.fail(key, f"each key once in {what} ('{name}' is also on line "
                                   f"{self.line(explicit[name][0])})", name)
                explicit[name] = (key, value)
        finally:
            self._merging.discard(id(node))
        return {**merged, **explicit}

    def keys(self, m: dict[str, tuple[ScalarNode, YamlNode]], allowed: Iterable[str],
             what: str) -> None:
        allowed = list(allowed)
        for name, (key, _) in m.items():
            if name not in allowed:
                close = difflib.get_close_matches(name, allowed, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                self.fail(key, f"one of the keys of {what}: {', '.join(allowed)}{hint}", name)

    def require(self, m: dict[str, tuple[ScalarNode, YamlNode]], name: str, node: YamlNode,
                what: str) -> YamlNode:
        if name not in m:
            self.fail(node, f"a '{name}:' key in {what}")
        return m[name][1]

    def sequence(self, node: YamlNode, what: str) -> list[YamlNode]:
        if not isinstance(node, SequenceNode):
            self.fail(node, what, _describe(node))
        return list(node.value)

    @staticmethod
    def is_null(node: YamlNode) -> bool:
        return isinstance(node, ScalarNode) and node.tag == _NULL_TAG

    # -- scalars ----------------------------------------------------------
    def scalar(self, node: YamlNode, what: str) -> Any:
        if not isinstance(node, ScalarNode):
            self.fail(node, what, _describe(node))
        assert self.loader is not None
        try:
            return self.loader.construct_object(node, deep=True)
        except Exception:  # PyYAML's constructors raise assorted errors on odd tags and values
            self.fail(node, what, node.value)

    def integer(self, node: YamlNode, what: str, lo: int, hi: int) -> int:
        v = self.scalar(node, what)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            self.fail(node, what, _describe(node))
        return v

    def number(self, node: YamlNode, what: str, positive: bool = True, hi: float = math.inf) -> float:
        v = self.scalar(node, what)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or (positive and v <= 0) or v > hi:
            self.fail(node, what, _describe(node))
        return float(v)

    def boolean(self, node: YamlNode, what: str) -> bool:
        v = self.scalar(node, what)
        if not isinstance(v, bool):
            self.fail(node, what, _describe(node))
        return v

    def text(self, node: YamlNode, what: str) -> str:
        """A string; numbers are taken as written (``designation: 1`` is ``"1"``)."""
        v = self.scalar(node, what)
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            self.fail(node, what, _describe(node))
        s = str(node.value).strip()
        if not s:
            self.fail(node, what, "an empty string")
        return s

    def ident(self, node: YamlNode, what: str) -> str:
        s = self.text(node, what)
        if not _ID.match(s.replace("{i}", "0").replace("{n}", "1")):
            self.fail(node, f"{what} (letters, digits, '_', '.', '-', '/')", s)
        return s

    def choice(self, node: YamlNode, what: str, options: Iterable[str]) -> str:
        options = list(options)
        s = self.text(node, f"{what}: one of {', '.join(options)}").lower()
        if s not in options:
            self.fail(node, f"{what}: one of {', '.join(options)}", str(node.value))
        return s

    def quantity(self, node: YamlNode, what: str, pattern: re.Pattern[str], bits: bool) -> float:
        """A bandwidth (``6 GiB/s``, ``100 Gb/s``) or size (``3.84 TB``); a bare number is bytes."""
        v = self.scalar(node, what)
        if isinstance(v, bool) or v is None:
            self.fail(node, what, _describe(node))
        if isinstance(v, (int, float)):
            amount = float(v)
        else:
            m = pattern.match(str(v))
            if not m:
                self.fail(node, what, str(node.value))
            try:
                amount = float(m.group(1)) * _PREFIX[(m.group(2) or "").lower()]
            except (ValueError, OverflowError):
                self.fail(node, what, str(node.value))
            if bits and m.group(3) in ("b/s", "bps"):
                amount /= 8.0
        if not math.isfinite(amount) or amount <= 0:
            self.fail(node, what, str(node.value))
        return amount

    def bandwidth(self, node: YamlNode, what: str) -> float:
        return self.quantity(node, f"{what} (bytes/s, like '6 GiB/s', '20 GB/s', '100 Gb/s')",
                             _BANDWIDTH, bits=True)

    def size(self, node: YamlNode, what: str) -> int | float:
        v = self.quantity(node, f"{what} (bytes, like '3.84 TB' or '40 GiB')", _SIZE, bits=False)
        return int(v) if v.is_integer() else v

    # -- figures with provenance -----------------------------------------
    def figure(self, node: YamlNode, what: str, convert: Callable[[YamlNode, str], Any]) -> _Fig:
        """A figure written plain or as ``{value: ..., inferred: ..., note: ...}``."""
        if isinstance(node, MappingNode):
            m = self.mapping(node, f"{what} written with its provenance")
            self.keys(m, ("value", "inferred", "note"), f"{what} written with its provenance")
            value = convert(self.require(m, "value", node, f"{what} written with its provenance"),
                            what)
            inferred = self.boolean(m["inferred"][1], "inferred: true or false") \
                if "inferred" in m else False
            note = self.text(m["note"][1], "a note (text)") if "note" in m else None
            return _Fig(value, inferred, note, self.line(m["value"][1]))
        return _Fig(convert(node, what), False, None, self.line(node))


# ---------------------------------------------------------------------------
# building the topology


class _Prov:
    """Provenance gathered for one node or link: which attributes were inferred, and notes."""

    def __init__(self) -> None:
        self.inferred: list[str] = []
        self.notes: dict[str, str] = {}

    def add(self, attr: str, fig: _Fig | None) -> None:
        if fig is None:
            return
        if fig.inferred and attr not in self.inferred:
            self.inferred.append(attr)
        if fig.note:
            self.notes[attr] = fig.note if attr not in self.notes else \
                f"{self.notes[attr]}; {fig.note}"

    def attrs(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.inferred:
            out["inferred_fields"] = sorted(self.inferred)
        if self.notes:
            out["field_notes"] = dict(sorted(self.notes.items()))
        return out


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

_MAX_GEN = max(GT_PER_S)


def _expand(template: str, index: int) -> str:
    return template.replace("{i}", str(index)).replace("{n}", str(index + 1))


class _Builder:
    def __init__(self, reader: _Reader) -> None:
        self.r = reader
        self.topo = Topology()
        self.ids: dict[str, int] = {}  # spec ids of switches, slots, devices -> line
        self.devices: dict[str, str] = {}  # spec device id -> node id
        self.default_gen: _Fig | None = None
        self.efficiency = _Fig(DEFAULT_EFFICIENCY)
        self.socket_numa: dict[str, int | None] = {}

    # -- helpers ----------------------------------------------------------
    def _claim(self, spec_id: str, node: YamlNode) -> None:
        if spec_id in self.ids:
            self.r.fail(node, f"a unique id ('{spec_id}' is already used on line "
                              f"{self.ids[spec_id]})", spec_id)
        self.ids[spec_id] = self.r.line(node)

    def _add_node(self, node: Node, where: YamlNode) -> None:
        try:
            self.topo.add_node(node)
        except TopologyError as exc:
            self.r.fail(where, "an entry that fits the machine", str(exc))

    def _add_link(self, link: Link, where: YamlNode) -> None:
        try:
            self.topo.add_link(link)
        except TopologyError as exc:
            self.r.fail(where, "a link that fits the machine", str(exc))

    def _opt(self, m: dict[str, tuple[ScalarNode, YamlNode]], key: str) -> YamlNode | None:
        if key not in m or self.r.is_null(m[key][1]):
            return None
        return m[key][1]

    def _fig(self, m: dict[str, tuple[ScalarNode, YamlNode]], key: str, what: str,
             convert: Callable[[YamlNode, str], Any]) -> _Fig | None:
        node = self._opt(m, key)
        return None if node is None else self.r.figure(node, what, convert)

    def _gen(self, node: YamlNode, what: str) -> int:
        return self.r.integer(node, f"{what}: a PCIe generation, 1 to {_MAX_GEN}", 1, _MAX_GEN)

    def _lanes(self, node: YamlNode, what: str) -> int:
        expected = f"{what}: a PCIe width ({', '.join(str(w) for w in VALID_WIDTHS)} lanes)"
        v = self.r.integer(node, expected, 1, max(VALID_WIDTHS))
        if v not in VALID_WIDTHS:
            self.r.fail(node, expected, _describe(node))
        return v

    def _entry_flags(self, m: dict[str, tuple[ScalarNode, YamlNode]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        node = self._opt(m, "inferred")
        if node is not None and self.r.boolean(node, "inferred: true or false"):
            out["inferred"] = True
        node = self._opt(m, "note")
        if node is not None:
            out["note"] = self.r.text(node, "a note (text)")
        return out

    def _pcie_link(self, src: str, dst: str, gen: _Fig, lanes: _Fig, bandwidth: _Fig | None,
                   attrs: dict[str, Any], where: YamlNode) -> Link:
        """A PCIe link of ``gen`` × ``lanes``, or of an explicit ``bandwidth`` when given."""
        prov = _Prov()
        prov.add("pcie_gen", gen)
        prov.add("lanes", lanes)
        if bandwidth is not None:
            prov.add("bytes_per_s", bandwidth)
            bw, src_kind = bandwidth.value, "spec"
        else:
            try:
                bw = pcie_bytes_per_s(gen.value, lanes.value, self.efficiency.value)
            except TopologyError as exc:
                self.r.fail(where, "a PCIe link of a known generation and width", str(exc))
            src_kind = "pcie"
            # a capacity computed from an inferred input is itself inferred
            inputs = [name for name, fig in (("generation", gen), ("width", lanes),
                                             ("protocol efficiency", self.efficiency))
                      if fig.inferred]
            if inputs:
                prov.add("bytes_per_s", _Fig(bw, True, f"computed from an inferred "
                                                       f"{' and '.join(inputs)}"))
        return Link(src, dst, LinkKind.PCIE, bw, gen.value, lanes.value, src_kind,
                    {**prov.attrs(), **attrs})

    # -- document ---------------------------------------------------------
    def build(self, root: YamlNode) -> MachineSpec:
        r = self.r
        top = r.mapping(root, f"a machine spec (a YAML mapping starting 'schema: {SCHEMA}')")
        schema = r.require(top, "schema", root, "a machine spec")
        if r.scalar(schema, f"schema: {SCHEMA}") != SCHEMA:
            r.fail(schema, f"schema: {SCHEMA}", _describe(schema))
        version = r.require(top, "version", root, "a machine spec")
        v = r.scalar(version, f"version {VERSION} of the {SCHEMA} schema")
        if isinstance(v, bool) or not isinstance(v, int) or v != VERSION:
            found = f"the string {v!r}" if isinstance(v, str) else _describe(version)
            r.fail(version, f"version {VERSION} (a number) of the {SCHEMA} schema", found)
        r.keys(top, _TOP_KEYS, "a machine spec")

        name = r.ident(r.require(top, "name", root, "a machine spec"), "a machine name")
        description = ""
        if (node := self._opt(top, "description")) is not None:
            description = r.text(node, "a description (text)")
        sources: list[str] = []
        if (node := self._opt(top, "sources")) is not None:
            sources = [r.text(s, "a source (text)") for s in r.sequence(node, "a list of sources")]
        if (node := self._opt(top, "defaults")) is not None:
            self._defaults(node)

        self.topo = Topology(name, [r.source, *sources])
        sockets_node = r.require(top, "sockets", root, "a machine spec")
        entries = r.sequence(sockets_node, "a list of sockets")
        if not entries:
            r.fail(sockets_node, "at least one socket", "an empty list")
        socket_maps = [self._socket(e) for e in entries]
        self._memory_and_interconnect(socket_maps, self._opt(top, "interconnect"))
        for sock_id, m in socket_maps:
            if (ports := self._opt(m, "ports")) is not None:
                self._ports(ports, sock_id, sock_id, 0)
        if (node := self._opt(top, "nvlink")) is not None:
            for e in r.sequence(node, "a list of NVLink links"):
                self._nvlink(e)
        inventory: list[InventoryItem] = []
        if (node := self._opt(top, "inventory")) is not None:
            inventory = [self._inventory_item(e) for e in r.sequence(node, "a list of devices to place")]

        n_inferred = len(inferred_figures(self.topo))
        if n_inferred:
            self.topo.notes.append(
                f"{n_inferred} figures of machine spec {name!r} are inferred, not given by its "
                "sources (attrs 'inferred_fields' and 'inferred' mark them)")
        if inventory:
            total = sum(i.count for i in inventory)
            self.topo.notes.append(
                f"machine spec {name!r} lists {total} devices to place (its inventory)")
        return MachineSpec(name, description, tuple(sources), self.topo, tuple(inventory),
                           r.source)

    def _defaults(self, node: YamlNode) -> None:
        r = self.r
        m = r.mapping(node, "defaults (a mapping)")
        r.keys(m, _DEFAULT_KEYS, "defaults")
        self.default_gen = self._fig(m, "pcie_gen", "defaults.pcie_gen", self._gen)
        eff = self._fig(m, "protocol_efficiency", "defaults.protocol_efficiency",
                        lambda n, w: r.number(n, f"{w}: a share in (0, 1]", hi=1.0))
        if eff is not None:
            self.efficiency = eff

    # -- sockets, memory, interconnect ----------------------------------
    def _socket(self, entry: YamlNode) -> tuple[str, dict[str, tuple[ScalarNode, YamlNode]]]:
        r = self.r
        m = r.mapping(entry, "a socket (a mapping with 'id:')")
        r.keys(m, _SOCKET_KEYS, "a socket")
        idx = r.integer(r.require(m, "id", entry, "a socket"), "a socket id (0 to 1023)", 0, 1023)
        sock_id = f"socket{idx}"
        if sock_id in self.topo:
            r.fail(m["id"][1], f"a unique socket id (socket {idx} is already defined)", str(idx))
        prov = _Prov()
        attrs: dict[str, Any] = {"source": "spec", "spec_line": r.line(entry)}
        numa_fig = self._fig(m, "numa_nodes", "numa_nodes", self._numa_list)
        numa_nodes: list[int] = numa_fig.value if numa_fig else []
        taken = {n for s in self.topo.nodes(NodeKind.SOCKET) for n in s.attrs.get("numa_nodes", [])}
        if set(numa_nodes) & taken:
            r.fail(m["numa_nodes"][1], "NUMA nodes no other socket has",
                   str(sorted(set(numa_nodes) & taken)))
        if numa_fig:
            attrs["numa_nodes"] = numa_nodes
            prov.add("numa_nodes", numa_fig)
        for key, what, conv in (
            ("cpu_model", "a CPU model", r.text),
            ("threads", "a thread count", lambda n, w: r.integer(n, f"{w} (1 to 65536)", 1, 65536)),
            ("clock_ghz", "a clock in GHz", lambda n, w: r.number(n, w, hi=100.0)),
        ):
            fig = self._fig(m, key, what, conv)
            if fig is not None:
                attrs[key] = fig.value
                prov.add(key, fig)
        numa = numa_nodes[0] if len(numa_nodes) == 1 else None
        self.socket_numa[sock_id] = numa
        self._add_node(Node(sock_id, NodeKind.SOCKET, f"socket {idx}", numa_node=numa,
                            attrs={**attrs, **prov.attrs(), **self._entry_flags(m)}), entry)
        return sock_id, m

    def _numa_list(self, node: YamlNode, what: str) -> list[int]:
        items = self.r.sequence(node, "a list of NUMA node numbers")
        out = [self.r.integer(i, "a NUMA node number (0 to 1023)", 0, 1023) for i in items]
        if len(set(out)) != len(out):
            self.r.fail(node, "distinct NUMA node numbers", str(out))
        return out

    def _memory_and_interconnect(self, sockets: list[tuple[str, dict[str, Any]]],
                                 interconnect: YamlNode | None) -> None:
        r = self.r
        pairs: dict[frozenset[str], int] = {}
        if interconnect is not None:
            for e in r.sequence(interconnect, "a list of inter-socket links"):
                m = r.mapping(e, "an inter-socket link (a mapping with 'sockets:' and 'bandwidth:')")
                r.keys(m, _INTERCONNECT_KEYS, "an inter-socket link")
                ends_node = r.require(m, "sockets", e, "an inter-socket link")
                ends = r.sequence(ends_node, "the two socket ids the link joins, like [0, 1]")
                if len(ends) != 2:
                    r.fail(ends_node, "two socket ids, like [0, 1]", f"{len(ends)} items")
                a, b = (f"socket{r.integer(x, 'a socket id', 0, 1023)}" for x in ends)
                for end, x in ((a, ends[0]), (b, ends[1])):
                    if end not in self.topo:
                        r.fail(x, "the id of a socket defined under 'sockets:'", end[6:])
                if a == b:
                    r.fail(ends_node, "two different sockets", f"[{a[6:]}, {b[6:]}]")
                key = frozenset((a, b))
                if key in pairs:
                    r.fail(ends_node, f"one entry per socket pair (also on line {pairs[key]})",
                           f"[{a[6:]}, {b[6:]}]")
                pairs[key] = r.line(ends_node)
                bw = r.figure(r.require(m, "bandwidth", e, "an inter-socket link"),
                              "an inter-socket bandwidth", r.bandwidth)
                prov = _Prov()
                prov.add("bytes_per_s", bw)
                attrs: dict[str, Any] = {**prov.attrs(), **self._entry_flags(m)}
                for key_name in ("technology", "label"):
                    if (node := self._opt(m, key_name)) is not None:
                        attrs[key_name] = r.text(node, f"a {key_name} (text)")
                self._add_link(Link(a, b, LinkKind.INTER_SOCKET, bw.value,
                                    bandwidth_source="spec", attrs=attrs), e)

        mem: dict[str, tuple[_Fig | None, _Fig | None]] = {}
        for sock_id, m in sockets:
            bw = self._fig(m, "memory_bandwidth", "a memory bandwidth", r.bandwidth)
            cap = self._fig(m, "memory_capacity", "a memory capacity", r.size)
            mem[sock_id] = (bw, cap)
        values = {bw.value if bw else None for bw, _ in mem.values()}
        uniform = values.pop() if len(values) == 1 else None
        add_memory_and_interconnect(self.topo, memory_bytes_per_s=uniform)
        for sock_id, (bw, cap) in mem.items():
            mem_id = "mem" + sock_id[len("socket"):]
            mem_node = self.topo.node(mem_id)
            prov = _Prov()
            attrs = {"source": "spec"}
            if cap is not None:
                attrs["capacity_bytes"] = cap.value
                prov.add("capacity_bytes", cap)
            self.topo.replace_node(mem_node.with_attrs(**attrs, **prov.attrs()))
            if bw is not None:
                lprov = _Prov()
                lprov.add("bytes_per_s", bw)
                self.topo.replace_link(Link(sock_id, mem_id, LinkKind.MEMORY, bw.value,
                                            bandwidth_source="spec", attrs=lprov.attrs()))

    # -- the PCIe tree ----------------------------------------------------
    def _ports(self, node: YamlNode, parent_id: str, socket_id: str, depth: int) -> None:
        r = self.r
        for entry in r.sequence(node, "a list of ports (slots and switches)"):
            m = r.mapping(entry, "a port (a mapping with 'slot: ID' or 'switch: ID')")
            if ("slot" in m) == ("switch" in m):
                r.fail(entry, "a port with exactly one of 'slot: ID' or 'switch: ID'",
                       "both" if "slot" in m else ", ".join(m) or "an empty mapping")
            if "switch" in m:
                self._switch(entry, m, parent_id, socket_id, depth)
            else:
                self._slot(entry, m, parent_id, socket_id)

    def _switch(self, entry: YamlNode, m: dict[str, Any], parent_id: str, socket_id: str,
                depth: int) -> None:
        r = self.r
        r.keys(m, _SWITCH_KEYS, "a switch")
        if depth >= MAX_SWITCH_DEPTH:
            r.fail(entry, f"switches nested at most {MAX_SWITCH_DEPTH} deep")
        spec_id = r.ident(m["switch"][1], "a switch id")
        if "{i}" in spec_id or "{n}" in spec_id:
            r.fail(m["switch"][1], "a switch id without '{i}'/'{n}' (switches have no count)",
                   spec_id)
        self._claim(spec_id, m["switch"][1])
        node_id = f"switch:{spec_id}"
        attrs: dict[str, Any] = {"source": "spec", "spec_id": spec_id, "spec_line": r.line(entry)}
        prov = _Prov()
        if (n := self._opt(m, "model")) is not None:
            fig = r.figure(n, "a switch model", r.text)
            attrs["model"] = fig.value
            prov.add("model", fig)
        name = r.text(n, "a switch name") if (n := self._opt(m, "name")) is not None \
            else f"switch {spec_id}"
        address = self._address(m)

        up_node = r.require(m, "uplink", entry, "a switch")
        um = r.mapping(up_node, "an uplink (a mapping with 'lanes:' and optionally 'gen:')")
        r.keys(um, _UPLINK_KEYS, "an uplink")
        gen = self._fig(um, "gen", "the uplink's gen", self._gen) or self.default_gen
        if gen is None:
            r.fail(up_node, "a 'gen:' in the uplink (or defaults.pcie_gen)")
        lanes = r.figure(r.require(um, "lanes", up_node, "an uplink"), "the uplink's lanes",
                         self._lanes)
        bandwidth = self._fig(um, "bandwidth", "the uplink's bandwidth", r.bandwidth)
        attrs.update(uplink_lanes=lanes.value, uplink_gen=gen.value)
        prov.add("uplink_lanes", lanes)
        prov.add("uplink_gen", gen)
        self._add_node(Node(node_id, NodeKind.SWITCH, name, bus_address=address,
                            numa_node=self.socket_numa.get(socket_id),
                            attrs={**attrs, **prov.attrs(), **self._entry_flags(m)}), entry)
        link_attrs = {**self._entry_flags(um)}
        if (n := self._opt(um, "label")) is not None:
            link_attrs["label"] = r.text(n, "a label (text)")
        self._add_link(self._pcie_link(parent_id, node_id, gen, lanes, bandwidth, link_attrs,
                                       up_node), entry)
        if (ports := self._opt(m, "ports")) is not None:
            self._ports(ports, node_id, socket_id, depth + 1)

    def _address(self, m: dict[str, Any]) -> str | None:
        node = self._opt(m, "bus_address")
        if node is None:
            return None
        text = self.r.text(node, "a PCI address like 0000:85:00.0")
        try:
            return normalize_address(text)
        except TopologyError:
            self.r.fail(node, "a PCI address like 0000:85:00.0", text)

    def _slot(self, entry: YamlNode, m: dict[str, Any], parent_id: str, socket_id: str) -> None:
        r = self.r
        r.keys(m, _SLOT_KEYS, "a slot")
        id_node = m["slot"][1]
        template = r.ident(id_node, "a slot id")
        count = self._fig(m, "count", "a slot count",
                          lambda n, w: r.integer(n, f"{w} (1 to {MAX_COUNT})", 1, MAX_COUNT)) \
            or _Fig(1)
        templated = "{i}" in template or "{n}" in template
        if count.value > 1 and not templated:
            r.fail(id_node, "a slot id containing '{i}' or '{n}' when count > 1", template)
        if count.value > 1 and self._opt(m, "bus_address") is not None:
            r.fail(m["bus_address"][0], "no bus_address on a slot entry with count > 1")
        form = r.figure(r.require(m, "form_factor", entry, "a slot"), "a slot form factor",
                        lambda n, w: r.choice(n, w, FORM_FACTORS))
        lanes = r.figure(r.require(m, "lanes", entry, "a slot"), "the slot's electrical width",
                         self._lanes)
        gen = self._fig(m, "gen", "the slot's gen", self._gen) or self.default_gen
        if gen is None:
            r.fail(entry, "a 'gen:' in the slot (or defaults.pcie_gen)")
        double = self._fig(m, "double_width", "double_width: true or false", r.boolean) \
            or _Fig(False)
        front = self._fig(m, "front_bay", "front_bay: true or false", r.boolean) or _Fig(False)
        bandwidth = self._fig(m, "bandwidth", "the slot's bandwidth", r.bandwidth)
        designation = self._fig(m, "designation", "a slot designation", r.text)
        label = r.text(n, "a label (text)") if (n := self._opt(m, "label")) is not None else None
        address = self._address(m)
        flags = self._entry_flags(m)
        device_node = self._opt(m, "device")

        for i in range(count.value):
            spec_id = _expand(template, i)
            self._claim(spec_id, id_node)
            slot_id = f"slot:{spec_id}"
            prov = _Prov()
            for attr, fig in (("designation", designation), ("form_factor", form),
                              ("width_lanes", lanes), ("pcie_gen", gen),
                              ("double_width", double), ("front_bay", front)):
                prov.add(attr, fig)
            if count.value > 1 or count.inferred or count.note:
                prov.add("count", count)
            attrs: dict[str, Any] = {
                "designation": _expand(designation.value, i) if designation else spec_id,
                "width_lanes": lanes.value, "pcie_gen": gen.value, "form_factor": form.value,
                "double_width": double.value, "front_bay": front.value,
                "in_use": device_node is not None, "source": "spec", "spec_id": spec_id,
                "spec_line": r.line(entry),
            }
            if label:
                attrs["label"] = _expand(label, i)
            if address:
                attrs["bus_address"] = address
            self._add_node(Node(slot_id, NodeKind.SLOT, f"slot {attrs['designation']}",
                                numa_node=self.socket_numa.get(socket_id),
                                attrs={**attrs, **prov.attrs(), **flags}), entry)
            link_attrs = {**({"label": attrs["label"]} if label else {}), **flags}
            self._add_link(self._pcie_link(parent_id, slot_id, gen, lanes, bandwidth, link_attrs,
                                           entry), entry)
            if device_node is not None:
                self._device(device_node, slot_id, spec_id, i, count.value, gen, lanes, double,
                             bandwidth, socket_id)

    def _device_figs(self, m: dict[str, Any]) -> tuple[dict[str, Any], _Prov]:
        """The figures a device (installed or to place) may carry, as node attributes."""
        r = self.r
        attrs: dict[str, Any] = {}
        prov = _Prov()
        for key, attr, what, conv in (
            ("capacity", "capacity_bytes", "a capacity", r.size),
            ("read_bandwidth", "read_bytes_per_s", "a read bandwidth", r.bandwidth),
            ("write_bandwidth", "write_bytes_per_s", "a write bandwidth", r.bandwidth),
            ("random_read_iops", "random_read_iops", "4 KiB random-read IOPS",
             lambda n, w: r.number(n, w)),
        ):
            fig = self._fig(m, key, what, conv)
            if fig is not None:
                attrs[attr] = int(fig.value) if attr == "random_read_iops" and \
                    float(fig.value).is_integer() else fig.value
                prov.add(attr, fig)
        return attrs, prov

    def _device(self, node: YamlNode, slot_id: str, slot_spec_id: str, index: int, count: int,
                slot_gen: _Fig, slot_lanes: _Fig, slot_double: _Fig, slot_bw: _Fig | None,
                socket_id: str) -> None:
        r = self.r
        m = r.mapping(node, "a device (a mapping with 'kind:' and 'model:')")
        r.keys(m, _DEVICE_KEYS, "a device")
        kind_fig = r.figure(r.require(m, "kind", node, "a device"), "a device kind",
                            lambda n, w: r.choice(n, w, DEVICE_KINDS))
        model = r.figure(r.require(m, "model", node, "a device"), "a device model", r.text)
        if (n := self._opt(m, "id")) is not None:
            template = r.ident(n, "a device id")
            if count > 1 and "{i}" not in template and "{n}" not in template:
                r.fail(n, "a device id containing '{i}' or '{n}' in a slot entry with count > 1",
                       template)
            spec_id, id_where = _expand(template, index), n
        else:
            spec_id, id_where = f"{slot_spec_id}-dev", node
        self._claim(spec_id, id_where)
        node_id = f"dev:{spec_id}"
        attrs, prov = self._device_figs(m)
        prov.add("model", model)
        form = self._fig(m, "form_factor", "a device form factor",
                         lambda n, w: r.choice(n, w, FORM_FACTORS))
        if form is not None:
            attrs["form_factor"] = form.value
            prov.add("form_factor", form)
        double = self._fig(m, "double_width", "double_width: true or false", r.boolean)
        if double is not None:
            if double.value and not slot_double.value:
                r.fail(m["double_width"][1], f"a double-width slot for a double-width device "
                       f"(slot '{slot_spec_id}' is single-width)", "double_width: true")
            attrs["double_width"] = double.value
            prov.add("double_width", double)
        gen = self._fig(m, "gen", "the device's gen", self._gen) or slot_gen
        lanes = self._fig(m, "lanes", "the device's link width", self._lanes) or slot_lanes
        if lanes.value > slot_lanes.value:
            r.fail(m["lanes"][1], f"a device no wider than its x{slot_lanes.value} slot "
                   f"'{slot_spec_id}'", f"x{lanes.value}")
        attrs.update(model=model.value, pcie_gen=gen.value, lanes=lanes.value, slot=slot_id,
                     source="spec", spec_id=spec_id, spec_line=r.line(node))
        prov.add("pcie_gen", gen)
        prov.add("lanes", lanes)
        address = self._address(m)
        self._add_node(Node(node_id, DEVICE_KINDS[kind_fig.value], model.value,
                            bus_address=address, numa_node=self.socket_numa.get(socket_id),
                            attrs={**attrs, **prov.attrs(), **self._entry_flags(m)}), node)
        self.devices[spec_id] = node_id
        link_gen = gen if gen.value <= slot_gen.value else slot_gen
        link = self._pcie_link(slot_id, node_id, link_gen, lanes, None, {}, node)
        if slot_bw is not None and (link.bytes_per_s is None or slot_bw.value < link.bytes_per_s):
            link = self._pcie_link(slot_id, node_id, link_gen, lanes, slot_bw, {}, node)
        self._add_link(link, node)

    # -- NVLink and inventory ---------------------------------------------
    def _nvlink(self, entry: YamlNode) -> None:
        r = self.r
        m = r.mapping(entry, "an NVLink link (a mapping with 'devices:' and 'bandwidth:')")
        r.keys(m, _NVLINK_KEYS, "an NVLink link")
        ends_node = r.require(m, "devices", entry, "an NVLink link")
        ends = r.sequence(ends_node, "the ids of the two installed devices it joins")
        if len(ends) != 2:
            r.fail(ends_node, "two device ids", f"{len(ends)} items")
        ids = [r.ident(x, "a device id") for x in ends]
        for spec_id, x in zip(ids, ends, strict=True):
            if spec_id not in self.devices:
                r.fail(x, "the id of a device installed in a slot of this spec", spec_id)
        if ids[0] == ids[1]:
            r.fail(ends_node, "two different devices", f"[{ids[0]}, {ids[1]}]")
        bw = r.figure(r.require(m, "bandwidth", entry, "an NVLink link"),
                      "an NVLink bandwidth per direction", r.bandwidth)
        prov = _Prov()
        prov.add("bytes_per_s", bw)
        attrs: dict[str, Any] = {**prov.attrs(), **self._entry_flags(m)}
        if (n := self._opt(m, "links")) is not None:
            attrs["nvlink_links"] = r.integer(n, "a number of NVLink links (1 to 64)", 1, 64)
        if (n := self._opt(m, "label")) is not None:
            attrs["label"] = r.text(n, "a label (text)")
        self._add_link(Link(self.devices[ids[0]], self.devices[ids[1]], LinkKind.NVLINK, bw.value,
                            bandwidth_source="spec", attrs=attrs), entry)

    def _inventory_item(self, entry: YamlNode) -> InventoryItem:
        r = self.r
        m = r.mapping(entry, "a device to place (a mapping with 'kind:', 'model:', 'count:')")
        r.keys(m, _INVENTORY_KEYS, "a device to place")
        kind = r.figure(r.require(m, "kind", entry, "a device to place"), "a device kind",
                        lambda n, w: r.choice(n, w, DEVICE_KINDS))
        model = r.figure(r.require(m, "model", entry, "a device to place"), "a device model",
                         r.text)
        count = r.figure(r.require(m, "count", entry, "a device to place"), "a device count",
                         lambda n, w: r.integer(n, f"{w} (1 to {MAX_INVENTORY_COUNT})", 1,
                                                MAX_INVENTORY_COUNT))
        attrs, prov = self._device_figs(m)
        prov.add("model", model)
        prov.add("count", count)
        form = self._fig(m, "form_factor", "a device form factor",
                         lambda n, w: r.choice(n, w, FORM_FACTORS))
        prov.add("form_factor", form)
        fits_fig = self._fig(m, "fits", "the slot form factors the device fits",
                             lambda n, w: tuple(r.choice(x, "a slot form factor", FORM_FACTORS)
                                                for x in r.sequence(n, w)))
        if fits_fig is not None and not fits_fig.value:
            r.fail(m["fits"][1], "at least one slot form factor", "an empty list")
        prov.add("fits", fits_fig)
        fits = fits_fig.value if fits_fig else ((form.value,) if form else FORM_FACTORS)
        double = self._fig(m, "double_width", "double_width: true or false", r.boolean)
        prov.add("double_width", double)
        gen = self._fig(m, "gen", "the device's gen", self._gen)
        prov.add("pcie_gen", gen)
        lanes = self._fig(m, "lanes", "the device's link width", self._lanes)
        prov.add("lanes", lanes)
        flags = self._entry_flags(m)
        return InventoryItem(
            kind=DEVICE_KINDS[kind.value], model=model.value, count=count.value,
            form_factor=form.value if form else None, fits=tuple(fits),
            double_width=bool(double.value) if double else False,
            pcie_gen=gen.value if gen else None, lanes=lanes.value if lanes else None,
            attrs={**attrs, **prov.attrs(), **flags}, line=r.line(entry),
        )
