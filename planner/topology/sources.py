"""Capture sources by name: what a machine's captured files can be, in one table.

As hwloc's discovery components do (a name, a phase, a priority), each
source declares itself: which phase of building a topology it serves and,
within the ``tree`` phase, its priority. :data:`CAPTURE_SOURCES` holds them;
:func:`planner.topology.discover.topology_from_files` merges what is given by
phase and priority, and the command line makes one option per file a source
reads (``--lspci``, ``--lspci-vvv``, ...) from the same table.

Phases, in the order they run (:data:`PHASES`):

``tree``
    Builds the PCI tree. Of the tree sources given, the one of highest
    ``priority`` builds it; the others lend their NVLink links, matched by
    bus address.
``slots``
    Adds what only it knows to the tree (``dmidecode``: slot designations,
    form factors, empty slots); refuses to run without one.
``links``
    Adds links and device details (``nvidia-smi topo -m``); may build a
    coarse topology when no tree source was given.

A source's entry is its reader, ``read(topo, given, name) -> Topology``:
``topo`` the topology so far (``None`` for a ``tree`` source, and for a later
source when nothing came before), ``given`` its files by keyword (a path, or
a list of paths for a file of ``many``), ``name`` the machine's name if given.
This module imports nothing heavy (the command line builds its options from it).

>>> CAPTURE_SOURCES.names()
('lspci', 'dmidecode', 'nvidia_smi', 'hwloc', 'nccl')
>>> [f.keyword for f in CAPTURE_SOURCES.caps("lspci")["files"]]
['lspci', 'lspci_vvv']
>>> file_keywords()
('lspci', 'lspci_vvv', 'dmidecode', 'nvidia_smi', 'hwloc', 'nccl_topo')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from momentbase.registry import Registry
from planner.errors import PlannerError

__all__ = ["CAPTURE_SOURCES", "PHASES", "CaptureFile", "file_keywords", "register_source", "source_of"]

#: the phases of building a topology from captures, in the order they run
PHASES = ("tree", "slots", "links")


@dataclass(frozen=True)
class CaptureFile:
    """One file a capture source reads: its keyword (``topology_from_files(keyword=...)``, the
    command line's ``--keyword`` with ``-`` for ``_``), the option's help, and whether several
    files may be given (``many``: the keyword then takes a list)."""

    keyword: str
    help: str
    many: bool = False

    @property
    def flag(self) -> str:
        """The command-line option: ``--lspci-vvv`` for ``lspci_vvv``."""
        return "--" + self.keyword.replace("_", "-")


# Any: each capture source's reader has its own signature
CAPTURE_SOURCES: Registry[Callable[..., Any]] = Registry("capture source", PlannerError)


# Any: each capture source's reader has its own signature
def register_source(name: str, reader: Callable[..., Any] | str, *, phase: str, files: tuple[CaptureFile, ...],
                    priority: int = 0) -> None:
    """Register a capture source: its ``reader``, the ``phase`` it serves, its ``priority`` there, its ``files``.

    Raises
    ------
    PlannerError
        ``phase`` is unknown, or a file keyword belongs to another source.
    """
    if phase not in PHASES:
        raise PlannerError(f"capture source {name!r}: phase {phase!r} is not one of {', '.join(PHASES)}")
    taken = {f.keyword: n for n in CAPTURE_SOURCES for f in CAPTURE_SOURCES.caps(n)["files"]}
    clash = next((f.keyword for f in files if f.keyword in taken), None)
    if clash is not None:
        raise PlannerError(f"capture source {name!r}: file keyword {clash!r} is {taken[clash]!r}'s already")
    CAPTURE_SOURCES.register(name, reader, phase=phase, priority=priority, files=tuple(files))


def file_keywords() -> tuple[str, ...]:
    """Every file keyword of every source, in the order the sources were registered."""
    return tuple(f.keyword for n in CAPTURE_SOURCES for f in CAPTURE_SOURCES.caps(n)["files"])


def source_of(keyword: str) -> str:
    """The name of the source that reads files given as ``keyword``.

    Raises
    ------
    PlannerError
        No source reads files given as ``keyword``.
    """
    for n in CAPTURE_SOURCES:
        if any(f.keyword == keyword for f in CAPTURE_SOURCES.caps(n)["files"]):
            return n
    raise PlannerError(f"unknown capture file {keyword!r} (known: {', '.join(file_keywords())})")


register_source("lspci", "planner.topology.discover:read_lspci", phase="tree", priority=30, files=(
    CaptureFile("lspci", "output of `lspci -tv` (or `lspci -t`)"),
    CaptureFile("lspci_vvv", "output of `lspci -vvv` / `-vvnn`, whole or per device (several files allowed)",
                many=True)))
register_source("dmidecode", "planner.topology.discover:read_dmidecode", phase="slots", files=(
    CaptureFile("dmidecode", "output of `dmidecode` or `dmidecode -t 9`"),))
register_source("nvidia_smi", "planner.topology.discover:read_nvidia_smi", phase="links", files=(
    CaptureFile("nvidia_smi", "output of `nvidia-smi topo -m`"),))
register_source("hwloc", "planner.topology.discover:read_hwloc", phase="tree", priority=20, files=(
    CaptureFile("hwloc", "hwloc XML (`lstopo --of xml`)"),))
register_source("nccl", "planner.topology.discover:read_nccl", phase="tree", priority=10, files=(
    CaptureFile("nccl_topo", "NCCL topology XML (NCCL_TOPO_FILE format)"),))
