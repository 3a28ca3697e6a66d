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

What a spec may hold is :mod:`planner.topology.spec.schema`'s; the builder
that reads it into a topology is :mod:`planner.topology.spec.build`'s, on the
YAML reader with line numbers of :mod:`planner.topology.spec.yamlread`.
"""

from __future__ import annotations

from pathlib import Path

from planner.errors import ParseError
from planner.topology.model import Topology
from planner.topology.spec.build import (
    _Builder,
)
from planner.topology.spec.bundled import bundled_machines
from planner.topology.spec.schema import (
    InventoryItem,
    MachineSpec,
)
from planner.topology.spec.yamlread import (
    _Reader,
)
from planner.topology.textio import read_text


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


