"""The layout search's results: layouts, the search's outcome, a slot map's lines."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["CLASSIC_LABELS", "EQUIVALENCES", "MAX_COMPOSITIONS", "Layout", "LayoutSearch",
           "SlotMapEntry"]

#: what makes two layouts the same (see enumerate_layouts)
EQUIVALENCES = ("automorphism", "flow")

#: the most class-count combinations enumerate_layouts will look at
MAX_COMPOSITIONS = 500_000

#: the most orderings of identical sockets tried when their links must be matched
_MAX_ROOT_ORDERS = 720

CLASSIC_LABELS = {
    "a": "(a) SSDs front-board-first, GPUs spread",
    "b": "(b) SSDs front-board-first, GPUs on one switch",
    "c": "(c) SSDs balanced, GPUs spread",
    "d": "(d) SSDs balanced, GPUs on one switch",
}


@dataclass(frozen=True)
class Layout:
    """Devices in slots.

    ``assignment`` pairs slot node ids with model names, sorted; ``kinds``
    maps the model names to ``"gpu"``/``"nvme"``. ``canonical`` is the
    machine's canonical form with these devices (equal for symmetric
    layouts); ``multiplicity`` how many feasible layouts share it.
    ``assumed_double_width`` lists the slots taken by a double-width card
    whose width the topology does not give; ``notes`` explain the rule
    behind a classic layout.
    """

    assignment: tuple[tuple[str, str], ...]
    label: str | None = None
    canonical: str = ""
    multiplicity: int = 1
    kinds: tuple[tuple[str, str], ...] = ()
    assumed_double_width: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def slots_of(self, model: str) -> tuple[str, ...]:
        """The slots holding devices of ``model``, sorted."""
        return tuple(s for s, m in self.assignment if m == model)

    def counts(self) -> dict[str, int]:
        """Model name → number of devices placed."""
        return dict(Counter(m for _, m in self.assignment))


@dataclass(frozen=True)
class LayoutSearch:
    """The outcome of :func:`enumerate_layouts`.

    ``raw_count`` and ``feasible_count`` are exact (Python ints);
    ``distinct`` has one :class:`Layout` per symmetry class, in the order
    found, classic and current layouts labelled. ``candidate_slots`` are
    the slots considered (tree order), ``classes`` the interchangeable slot
    groups, ``compositions`` the number of class-count combinations
    canonicalised, ``ignore_kinds`` the fixed-device kinds left out of the
    symmetry test, ``equivalence`` what made layouts alike, ``elapsed_s``
    the time taken.
    """

    raw_count: int
    feasible_count: int
    distinct: tuple[Layout, ...]
    notes: tuple[str, ...] = ()
    candidate_slots: tuple[str, ...] = ()
    classes: tuple[tuple[str, ...], ...] = ()
    compositions: int = 0
    ignore_kinds: tuple[str, ...] = ()
    equivalence: str = "automorphism"
    elapsed_s: float = field(default=0.0, compare=False)

    def find(self, layout: Layout | str) -> Layout | None:
        """The distinct layout symmetric to ``layout`` (or with that canonical form)."""
        key = layout if isinstance(layout, str) else layout.canonical
        return next((d for d in self.distinct if d.canonical == key), None)


@dataclass(frozen=True)
class SlotMapEntry:
    """One line of a slot map: which device goes where."""

    device_id: str
    device: str
    model: str
    slot_id: str
    designation: str
    pcie_gen: int | None
    width_lanes: int | None
    switches: tuple[str, ...]
    socket: str | None
    text: str
