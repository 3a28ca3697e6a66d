"""Layouts: which slot each device to place goes into, up to symmetry.

A *layout* assigns the devices of an :class:`~planner.inventory.Inventory`
to candidate slots of a :class:`~planner.topology.model.Topology`. Devices
of one model are interchangeable, so a layout is a map slot → model.

Fit rules (:func:`slot_fit`)
----------------------------
A slot takes a device of a model when all of these hold:

1. the slot is in the PCIe tree: a slot whose ``attrs["placement"]`` is
   ``"unknown"`` (a DMI slot without a bus address) is never used;
2. its form factor (:func:`~planner.inventory.slot_form_factor`) is one of the model's
   ``form_factors`` — a slot of unknown form factor is assumed to fit;
   a *virtual* slot (the position of a device in a topology without slot
   nodes, see :func:`~planner.inventory.with_virtual_slots`) takes only a
   device of the kind that was there;
3. its electrical width ``attrs["width_lanes"]`` is at least the model's
   ``lanes`` (x16 for the GPUs, x4 for NVMe SSDs); an unknown width does
   not fit (except on a virtual slot, where nothing else is known);
4. for a model that needs a double-width opening (a PCIe GPU card): the
   slot's ``double_width`` is true, or — when it is absent or ``None`` — the
   slot is a x16 CEM slot (or of unknown form factor) whose ``length`` is
   ``Long`` or unknown; the layout then lists the slot in
   ``assumed_double_width``.

The generation never excludes a slot: the link runs at the lower one.

Candidate slots are the free slot nodes (no device under them and not
marked in use) and the slots holding a device the inventory moves
(``Inventory.installed``).

Counting and symmetry
---------------------
``raw_count`` counts the ways to put the devices into candidate slots
ignoring fit (one device per slot, devices of a model interchangeable: a
product of binomials); ``feasible_count`` those that respect the fit rules,
counted exactly by dynamic programming over *slot classes*; ``distinct``
keeps one layout per symmetry class.

A slot class is a set of candidate slots under the same parent with the
same label, hence interchangeable. Layouts are enumerated as per-class
counts of each model and deduplicated by a canonical form of the whole
machine: an AHU tree code in which a node's code is its label (kind, the
link above it as kind/gen/width/capacity, the fit-relevant slot
attributes, the model placed in it or the fixed device there) followed by
the sorted codes of its children. Sockets (tree roots) are ordered by code
and the inter-socket links are encoded on that order, trying every order
of identical sockets, so identical switches and identical sockets merge
while a socket that differs (Machine A's socket 1 carries the NICs) does
not. Nodes on other non-tree links (NVLink) are labelled with their id:
nothing is merged across them. Two layouts with the same canonical form
are images of each other under an automorphism of the labelled topology;
each distinct layout's ``multiplicity`` counts the feasible layouts it
stands for (they add up to ``feasible_count``).

``equivalence="flow"`` merges further, layouts that no flow model can tell
apart (empty slots and NICs dropped, a slot and its device folded into one
link): on Machine A 280 classes instead of 2268, on Machine B 332 instead
of 490 — see :func:`enumerate_layouts`.

Classic layouts
---------------
:func:`classic_layouts` builds the paper's four baselines (§2.3) by rule on
any machine. GPUs are placed first, SSDs in what is left.

*GPUs P2P-first*: all GPUs on one switch — the switch with the most free
slots that fit a GPU directly under it; ties go to the one nearest the
root, then to the first in tree order. If it lacks room the rest go to the
next switch in the same ranking, then to the root complexes.

*GPUs spread*: round-robin over the switches with a GPU slot, in tree
order (over the root complexes' GPU slots too when fewer than two switches
have one); when those are full, round-robin over the root complexes.

*SSDs front-board-first*: front bays first (``front_bay`` true, then U.2
bays whose ``front_bay`` is unknown), then any other slot.

*SSDs balanced*: the same number ``q`` on every switch with a free slot for
an SSD, ``q = min(n // switches, the least room on any of them)``; when
room is not what limits ``q``, the ``n mod switches`` left over go one per
switch in tree order; whatever is still left goes to the root complexes'
own slots (front bays first) and then to any slot with room. Without a
switch the SSDs are balanced over the root complexes (round-robin).

Within a switch, a root complex or a group of front bays a device takes
the free slot of its preferred form factor (an SSD a U.2 bay before a x16
CEM slot), then the narrowest, then a known double-width slot before an
assumed one, then the first in tree order.

(a) SSDs front-board-first, GPUs spread; (b) SSDs front-board-first, GPUs
on one switch; (c) SSDs balanced, GPUs spread; (d) SSDs balanced, GPUs on
one switch. Where a rule cannot apply the entry is a string saying why.

On the bundled machines (4 × A100 40GB PCIe, 8 × P5510):

- moment-a: (a) GPUs 2 + 2 on switches 0 and 1, SSDs in the 4 + 4 front
  bays of the two root complexes; (b) 4 GPUs on switch 0 (a tie with
  switch 1, broken by tree order), SSDs in the front bays; (c) GPUs 2 + 2,
  SSDs in the 4 + 4 U.2 slots of the two switches; (d) 4 GPUs on switch 0,
  SSDs 4 + 4 in the switches' U.2 slots — switch 0 then holds its four GPUs
  and four SSDs, the "one SSD per GPU" slot limit of §4.6.
- moment-b: (a) GPUs 0, 1 on switch 0 and 2, 3 on switch 1, SSDs in front
  bays 0–7 of root complex 1 (their traffic crosses QPI, §2.3); (b) 4 GPUs
  on switch 1 (5 slots vs 4 on switch 0), SSDs in the front bays; (c) two
  GPUs and two SSDs on switch 0, two GPUs and two SSDs on switch 1, four
  SSDs in front bays — the paper's layout (c) (Buses 12–13, 17–18); (d) 4
  GPUs on switch 1, one SSD on each switch, six in front bays.

>>> from planner.inventory import inventory_from_counts
>>> from planner.topology.spec.load import load_machine
>>> search = enumerate_layouts(load_machine("moment-b"), inventory_from_counts(4, 8))
>>> search.feasible_count == sum(d.multiplicity for d in search.distinct)
True
>>> search.raw_count >= search.feasible_count >= len(search.distinct)
True
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from planner.inventory import Inventory
from planner.layout.classics import classic_layouts_of, current_layout_of
from planner.layout.fit import Fit, slot_fit, slot_fits
from planner.layout.machine import _Machine
from planner.layout.place import device_link, place, slot_map, usual_efficiency
from planner.layout.types import (
    CLASSIC_LABELS,
    EQUIVALENCES,
    MAX_COMPOSITIONS,
    Layout,
    LayoutSearch,
    SlotMapEntry,
)
from planner.topology.model import Topology

__all__ = [
    "CLASSIC_LABELS",
    "EQUIVALENCES",
    "MAX_COMPOSITIONS",
    "Fit",
    "Layout",
    "LayoutSearch",
    "SlotMapEntry",
    "classic_layouts",
    "current_layout",
    "device_link",
    "enumerate_layouts",
    "place",
    "slot_fit",
    "slot_fits",
    "slot_map",
    "usual_efficiency",
]


def enumerate_layouts(
    topo: Topology,
    inventory: Inventory,
    *,
    max_compositions: int = MAX_COMPOSITIONS,
    ignore_kinds: Iterable[str] = (),
    equivalence: str = "automorphism",
) -> LayoutSearch:
    """Every distinct way to put ``inventory`` into the candidate slots of ``topo``.

    Raises :class:`~planner.errors.PlannerError` naming the constraint when
    the devices cannot be placed (no slot of the right form factor or
    width, too few slots, or counts that cannot fit together), or when
    there are more than ``max_compositions`` class-count combinations.

    ``ignore_kinds`` names kinds of fixed devices (``"nic"``, ``"other"``)
    to leave out of the symmetry test, with the slots that hold only them:
    for a flow model in which they carry no traffic, two sockets that differ
    only by a NIC are then alike. By default every fixed device counts
    (Machine A's socket 1, which carries the NICs, is not socket 0's mirror).

    ``equivalence="flow"`` merges more: layouts that every flow model of
    :mod:`planner.flow` must give the same time, whether or not an
    automorphism maps one onto the other. The canonical form then leaves
    out empty slots, NICs and other leaf devices and any subtree that holds
    no GPU, SSD or memory, and a device in a slot becomes one link from the
    slot's parent at the lower capacity of the slot's link and its own (a
    slot only forwards). An SSD in a U.2 bay and one in a spare GPU slot of
    the same switch are then alike when their links carry the same. The
    default, ``"automorphism"``, is the symmetry of the machine itself.

    >>> from planner.inventory import inventory_from_counts
    >>> from planner.topology.spec.load import load_machine
    >>> s = enumerate_layouts(load_machine("moment-a"), inventory_from_counts(4, 8))
    >>> s.raw_count, s.feasible_count
    (1338557220, 8817900)
    """
    start = time.perf_counter()
    mach = _Machine(topo, inventory, ignore_kinds, equivalence)
    feasible, found, n_comp = mach.search(max_compositions)
    mult = {c: v[1] for c, v in found.items()}
    special: dict[str, list[Layout]] = {}
    cur = current_layout_of(mach, mult)
    if cur is not None:
        special.setdefault(cur.canonical, []).append(cur)
    for lay in classic_layouts_of(mach, mult).values():
        if isinstance(lay, Layout):
            special.setdefault(lay.canonical, []).append(lay)
    distinct = []
    for canon, (vec, m) in found.items():
        hits = special.get(canon, [])
        if hits:
            rep = hits[0]
            label = "; ".join(dict.fromkeys(h.label for h in hits if h.label))
            distinct.append(Layout(rep.assignment, label, canon, m, rep.kinds,
                                   rep.assumed_double_width, rep.notes))
        else:
            distinct.append(mach.layout_of(vec, canon, m))
    return LayoutSearch(
        raw_count=mach.raw_count(), feasible_count=feasible, distinct=tuple(distinct),
        notes=tuple(mach.notes), candidate_slots=tuple(mach.candidates),
        classes=tuple(tuple(c) for c in mach.classes), compositions=n_comp,
        ignore_kinds=mach.ignore_kinds, equivalence=equivalence,
        elapsed_s=time.perf_counter() - start,
    )


def _machine_like(topo: Topology, inventory: Inventory, search: LayoutSearch | None) -> _Machine:
    """A machine prepared as ``search`` was (its canonical forms must match)."""
    if search is None:
        return _Machine(topo, inventory)
    return _Machine(topo, inventory, search.ignore_kinds, search.equivalence)


def _multiplicities(mach: _Machine, search: LayoutSearch | None) -> dict[str, int]:
    if search is not None:
        return {d.canonical: d.multiplicity for d in search.distinct}
    _, found, _ = mach.search(MAX_COMPOSITIONS)
    return {c: v[1] for c, v in found.items()}


def classic_layouts(topo: Topology, inventory: Inventory,
                    search: LayoutSearch | None = None) -> dict[str, Layout | str]:
    """The paper's layouts (a)–(d) on ``topo``, built by the rules of the module docstring.

    Keys ``"a"``–``"d"``; each value is a :class:`Layout` (its
    ``multiplicity`` that of its symmetry class, from ``search`` when given)
    or a string saying why the rule does not apply on this machine.

    >>> from planner.inventory import inventory_from_counts
    >>> from planner.topology.spec.load import load_machine
    >>> c = classic_layouts(load_machine("moment-b"), inventory_from_counts(4, 8))
    >>> sorted(s for s, m in c["c"].assignment if m == "a100-40gb-pcie")
    ['slot:b-sw0-slot0', 'slot:b-sw0-slot1', 'slot:b-sw1-slot0', 'slot:b-sw1-slot1']
    """
    mach = _machine_like(topo, inventory, search)
    return classic_layouts_of(mach, _multiplicities(mach, search))


def current_layout(topo: Topology, inventory: Inventory,
                   search: LayoutSearch | None = None) -> Layout | None:
    """Where the inventory's installed devices are now, labelled ``"current"``.

    ``None`` when the inventory has no installed devices (counts or a spec),
    when it also holds devices not yet installed, or when a device sits in a
    slot the fit rules would not allow.
    """
    if not inventory.installed:
        return None
    mach = _machine_like(topo, inventory, search)
    return current_layout_of(mach, _multiplicities(mach, search))
