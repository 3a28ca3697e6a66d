"""Layouts: which slot each device to place goes into, up to symmetry.

A *layout* assigns the devices of an :class:`~planner.inventory.Inventory`
to candidate slots of a :class:`~planner.topology.model.Topology`. Devices
of one model are interchangeable, so a layout is a map slot → model.

Fit rules (:func:`slot_fit`)
----------------------------
A slot takes a device of a model when all of these hold:

1. the slot is in the PCIe tree: a slot whose ``attrs["placement"]`` is
   ``"unknown"`` (a DMI slot without a bus address) is never used;
2. its form factor (:func:`slot_form_factor`) is one of the model's
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
>>> from planner.topology.spec import load_machine
>>> search = enumerate_layouts(load_machine("moment-b"), inventory_from_counts(4, 8))
>>> search.feasible_count == sum(d.multiplicity for d in search.distinct)
True
>>> search.raw_count >= search.feasible_count >= len(search.distinct)
True
"""

from __future__ import annotations

import itertools
import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from planner.errors import PlannerError
from planner.inventory import (  # slot_form_factor: re-exported, it lives with the device models
    DeviceModel,
    Inventory,
    device_attrs,
    slot_form_factor,
    with_virtual_slots,
)
from planner.topology.model import DEVICE_KINDS, Link, LinkKind, Node, NodeKind, Topology
from planner.topology.pcie import DEFAULT_EFFICIENCY, GT_PER_S, pcie_bytes_per_s

__all__ = [
    "Fit",
    "Layout",
    "LayoutSearch",
    "SlotMapEntry",
    "classic_layouts",
    "current_layout",
    "enumerate_layouts",
    "place",
    "slot_fit",
    "slot_fits",
    "slot_form_factor",
    "slot_map",
]

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


# ---------------------------------------------------------------------------
# fit


@dataclass(frozen=True)
class Fit:
    """Whether a slot takes a model: ``ok``, and why not (``reason``) or what was assumed."""

    ok: bool
    reason: str = ""
    assumed_double_width: bool = False
    assumed_form_factor: bool = False

    def __bool__(self) -> bool:
        return self.ok


def _length_class(slot: Node) -> str:
    ln = str(slot.attrs.get("length") or "").strip().lower()
    return ln if ln in ("long", "short", "other") else ("unknown" if ln in ("", "unknown") else
                                                         "other")


def slot_fit(slot: Node, model: DeviceModel) -> Fit:
    """Whether ``slot`` takes a device of ``model``, by the rules of the module docstring.

    >>> from planner.inventory import device_model
    >>> bay = Node("b", NodeKind.SLOT, attrs={"form_factor": "u.2", "width_lanes": 4})
    >>> slot_fit(bay, device_model("a100-40gb-pcie")).reason
    'a u.2 slot; a100-40gb-pcie fits cem'
    >>> cem = Node("c", NodeKind.SLOT, attrs={"form_factor": "cem", "width_lanes": 16,
    ...                                       "length": "Long"})
    >>> slot_fit(cem, device_model("a100-40gb-pcie")).assumed_double_width
    True
    """
    if slot.kind != NodeKind.SLOT:
        return Fit(False, f"{slot.id} is a {slot.kind.value}, not a slot")
    a = slot.attrs
    if a.get("placement") == "unknown":
        return Fit(False, "placement unknown: the slot is not in the PCIe tree")
    width = a.get("width_lanes")
    if a.get("virtual"):
        if a.get("virtual_kind") != model.kind:
            return Fit(False, f"the position of a {a.get('virtual_kind')} takes a "
                              f"{a.get('virtual_kind')}, not a {model.kind}")
        if isinstance(width, int) and width < model.lanes:
            return Fit(False, f"x{width}; {model.name} needs x{model.lanes}")
        return Fit(True)
    ff = slot_form_factor(slot)
    if ff is not None and ff not in model.form_factors:
        return Fit(False, f"a {ff} slot; {model.name} fits {' or '.join(model.form_factors)}")
    if not isinstance(width, int) or isinstance(width, bool):
        return Fit(False, "electrical width unknown")
    if width < model.lanes:
        return Fit(False, f"x{width}; {model.name} needs x{model.lanes}")
    assumed = False
    if model.double_width:
        dw = a.get("double_width")
        if dw is False:
            return Fit(False, f"single width; {model.name} needs a double-width slot")
        if dw is not True:
            if ff in ("cem", None) and width >= 16 and _length_class(slot) in ("long", "unknown"):
                assumed = True
            else:
                return Fit(False, f"double width unknown and not a x16 long CEM slot; "
                                  f"{model.name} needs a double-width slot")
    return Fit(True, assumed_double_width=assumed, assumed_form_factor=ff is None)


def slot_fits(slot: Node, model: DeviceModel) -> bool:
    """``slot_fit(slot, model).ok``."""
    return slot_fit(slot, model).ok


# ---------------------------------------------------------------------------
# results


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


# ---------------------------------------------------------------------------
# the machine as the search sees it


def _esc(text: str) -> str:
    return text.replace("\\", "\\\\").replace("[", "\\(").replace("]", "\\)")


def _fmt(v: Any) -> str:
    if v is None:
        return "?"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _link_label(lk: Link | None) -> str:
    if lk is None:
        return "-"
    return f"{lk.kind.value}:{_fmt(lk.pcie_gen)}x{_fmt(lk.lanes)}@{_fmt(lk.bytes_per_s)}"


def _multinomial(n: int, ks: Iterable[int]) -> int:
    out, left = 1, n
    for k in ks:
        out *= math.comb(left, k)
        left -= k
    return out


def _count_vectors(size: int, fitting: list[int], remaining: list[int], n_models: int):
    """Every per-model count tuple for one slot class: Σ ≤ size, only fitting models."""
    limits = [min(size, remaining[m]) for m in fitting]

    def rec(i: int, left: int, acc: list[int]):
        if i == len(fitting):
            vec = [0] * n_models
            for m, k in zip(fitting, acc, strict=True):
                vec[m] = k
            yield tuple(vec)
            return
        for k in range(min(limits[i], left) + 1):
            acc.append(k)
            yield from rec(i + 1, left - k, acc)
            acc.pop()

    yield from rec(0, size, [])


class _Machine:
    """A topology and an inventory, prepared for the search (tree, slot classes, labels)."""

    def __init__(self, topo: Topology, inventory: Inventory,
                 ignore_kinds: Iterable[str] = (), equivalence: str = "automorphism") -> None:
        if not isinstance(inventory, Inventory):
            raise PlannerError(f"an Inventory is needed, got {type(inventory).__name__}")
        if equivalence not in EQUIVALENCES:
            raise PlannerError(f"unknown equivalence {equivalence!r} (known: "
                               f"{', '.join(EQUIVALENCES)})")
        self.equivalence = equivalence
        self.flow = equivalence == "flow"
        self.topo = with_virtual_slots(topo)
        self.inventory = inventory
        self.models = list(inventory.models)
        self.counts = [n for _, n in inventory.items]
        self.model_index = {m.name: i for i, m in enumerate(self.models)}
        self.kinds = tuple(sorted(inventory.kinds().items()))
        self.notes: list[str] = []
        if self.topo is not topo:
            self.notes.append(self.topo.notes[-1])
        t = self.topo
        self.movable = {d for d, _ in inventory.installed}
        for d in self.movable:
            if d not in t:
                raise PlannerError(f"inventory: installed device {d!r} is not in topology "
                                   f"{topo.name!r}")

        # -- the tree, without the devices that move ------------------------
        nodes = [n for n in t.nodes() if n.id not in self.movable]
        self.parent: dict[str, str | None] = {}
        for n in nodes:
            p = t.parent(n.id)
            self.parent[n.id] = p.id if p is not None and p.id not in self.movable else None
        self.children: dict[str, list[str]] = {n.id: [] for n in nodes}
        for lk in t.links():
            if lk.dst in self.parent and self.parent[lk.dst] == lk.src \
                    and lk.kind in (LinkKind.PCIE, LinkKind.MEMORY):
                self.children[lk.src].append(lk.dst)
        self.roots = [n.id for n in t.roots() if n.id not in self.movable]
        self.order: list[str] = []
        seen: set[str] = set()
        stack = list(reversed(self.roots))
        while stack:
            nid = stack.pop()
            if nid in seen:
                continue
            seen.add(nid)
            self.order.append(nid)
            stack.extend(reversed(self.children[nid]))
        self.floating = [n.id for n in nodes if n.id not in seen]
        self.index = {nid: i for i, nid in enumerate(self.order + self.floating)}

        # -- links off the tree ------------------------------------------------
        root_set = set(self.roots)
        self.root_edges: list[tuple[str, str, str]] = []
        self.other_edges: list[str] = []
        distinguished = set(self.floating)
        dropped = 0
        for lk in t.links():
            if lk.src in self.movable or lk.dst in self.movable:
                if lk.kind == LinkKind.NVLINK:
                    dropped += 1
                continue
            if self.parent.get(lk.dst) == lk.src and lk.kind in (LinkKind.PCIE, LinkKind.MEMORY):
                continue
            if lk.src in root_set and lk.dst in root_set:
                self.root_edges.append((lk.src, lk.dst, _link_label(lk)))
                continue
            distinguished.update(lk.key)
            a, b = sorted(lk.key)
            self.other_edges.append(f"{a}-{b}:{_link_label(lk)}")
        self.other_edges.sort()
        if dropped:
            self.notes.append(f"{dropped} NVLink link(s) of devices that move are not carried "
                              "over to the new slots")
        if distinguished:
            self.notes.append(f"{len(distinguished)} node(s) on NVLink or other off-tree links "
                              "are told apart by id: no symmetry is used across them")

        # -- candidate slots ---------------------------------------------------
        self.candidates: list[str] = []
        busy: list[str] = []
        vacated = {p.id for d in self.movable if (p := t.parent(d)) is not None}
        for nid in self.order:
            n = t.node(nid)
            if n.kind != NodeKind.SLOT or self.parent[nid] is None or self.children[nid]:
                continue  # not in the tree, or a device that stays is in it
            if n.attrs.get("in_use") is True and nid not in vacated:
                busy.append(n.label)
                continue
            self.candidates.append(nid)
        if busy:
            self.notes.append(f"{len(busy)} slot(s) marked in use with no device found under "
                              f"them are left alone: {', '.join(busy[:6])}"
                              + (" ..." if len(busy) > 6 else ""))
        cand = set(self.candidates)
        # fixed devices of ignored kinds, and the occupied slots holding only them, are left
        # out of the canonical form (a flow model in which NICs carry nothing)
        self.ignore_kinds = tuple(sorted(set(ignore_kinds)))
        bad = [k for k in self.ignore_kinds if k not in ("nic", "other", "gpu", "nvme")]
        if bad:
            raise PlannerError(f"ignore_kinds: {', '.join(map(repr, bad))} is not a device kind "
                               "(nic, other, gpu, nvme)")
        if self.ignore_kinds:
            gone: set[str] = set()
            for nid in reversed(self.order):
                n = t.node(nid)
                kids = self.children[nid]
                if nid in distinguished or nid in cand:
                    continue
                if n.kind in DEVICE_KINDS and n.kind.value in self.ignore_kinds and not kids \
                        or n.kind == NodeKind.SLOT and kids and all(c in gone for c in kids):
                    gone.add(nid)
            for nid in self.children:
                self.children[nid] = [c for c in self.children[nid] if c not in gone]
            self.order = [nid for nid in self.order if nid not in gone]
            if gone:
                self.notes.append(f"{len(gone)} node(s) ({', '.join(self.ignore_kinds)} devices "
                                  "and the slots holding them) left out of the symmetry test")
        self.fits: dict[str, list[Fit]] = {
            s: [slot_fit(t.node(s), m) for m in self.models] for s in self.candidates}

        # -- labels ----------------------------------------------------------------
        self.label: dict[str, str] = {}
        for nid in self.order + self.floating:
            self.label[nid] = self._label(t.node(nid), nid in distinguished)

        # -- slot classes ----------------------------------------------------------
        groups: dict[tuple[str, str], list[str]] = {}
        for s in self.candidates:
            groups.setdefault((self.parent[s] or "", self.label[s]), []).append(s)
        self.classes: list[list[str]] = list(groups.values())
        self.class_of = {s: ci for ci, members in enumerate(self.classes) for s in members}
        self.class_parent = [self.parent[c[0]] for c in self.classes]
        self.class_label = [self.label[c[0]] for c in self.classes]
        self.class_fit = [[m for m in range(len(self.models)) if self.fits[c[0]][m].ok]
                          for c in self.classes]
        self.classes_here: dict[str, list[int]] = {}
        for ci, p in enumerate(self.class_parent):
            assert p is not None
            self.classes_here.setdefault(p, []).append(ci)
        # the classes in each node's subtree
        self.below: dict[str, tuple[int, ...]] = {}
        for nid in reversed(self.order):
            acc = list(self.classes_here.get(nid, []))
            for c in self.children[nid]:
                if c not in cand:
                    acc.extend(self.below.get(c, ()))
            self.below[nid] = tuple(sorted(acc))
        # which nodes matter on their own in the flow view: roots, memory, the GPUs and SSDs
        # that stay, nodes on off-tree links; the rest only when something below them does
        self.alive = {nid: not self.flow or self.parent[nid] is None
                      or nid in distinguished
                      or t.node(nid).kind in (NodeKind.MEMORY, NodeKind.GPU, NodeKind.NVME)
                      for nid in self.order}
        self.static: dict[str, str] = {}
        for nid in reversed(self.order):
            if not self.below[nid]:
                self.static[nid] = self._assemble(nid, [self.static[c]
                                                        for c in self.children[nid]])
        self.other_code = _esc(";".join(self.other_edges))
        self.floating_code = "".join(sorted(f"{_esc(self.label[f])}[]" for f in self.floating))
        self._memo: dict[tuple, str] = {}
        self._vec_cache: dict[tuple, list] = {}
        self._pairs: dict[tuple, list[tuple[str, str]]] = {}
        self._placed = [f"{_esc('dev|' + m.name)}[]" for m in self.models]
        if self.flow:
            # a device in a slot is, to a flow, one link from the slot's parent: the lower of
            # the slot's link and the device's own; an empty slot is nothing
            usual = usual_efficiency(t)
            self._placed_in: list[list[str]] = []
            for ci, members in enumerate(self.classes):
                first = members[0]
                up = t.link_between(self.parent[first], first)
                codes = []
                for m, model in enumerate(self.models):
                    if m not in self.class_fit[ci]:
                        codes.append("")
                        continue
                    dev = device_link(t, first, model, "dev", usual)
                    caps = (up.bytes_per_s if up is not None else None, dev.bytes_per_s)
                    cap = _fmt(min(caps)) if None not in caps else "/".join(map(_fmt, caps))
                    codes.append(f"{_esc(f'dev|{model.name}|@{cap}')}[]")
                self._placed_in.append(codes)

    # -- labels ------------------------------------------------------------
    def _label(self, n: Node, distinguished: bool) -> str:
        p = self.parent.get(n.id)
        lk = self.topo.link_between(p, n.id) if p is not None else None
        parts = [n.kind.value, _link_label(lk)]
        a = n.attrs
        if n.kind == NodeKind.SLOT and self.flow:
            pass  # only its link matters to a flow
        elif n.kind == NodeKind.SLOT:
            dw = a.get("double_width")
            parts += [f"ff={slot_form_factor(n) or '?'}", f"w={_fmt(a.get('width_lanes'))}",
                      f"g={_fmt(a.get('pcie_gen'))}",
                      f"dw={'?' if dw is None else int(bool(dw))}"]
            if dw is None:
                parts.append(f"len={_length_class(n)}")
            if a.get("virtual"):
                parts.append(f"virtual={a.get('virtual_kind')}")
            if a.get("placement") == "unknown":
                parts.append("placement=unknown")
        elif n.kind == NodeKind.MEMORY:
            parts.append(f"cap={_fmt(a.get('capacity_bytes'))}")
        elif n.kind in (NodeKind.GPU, NodeKind.NVME, NodeKind.NIC, NodeKind.OTHER):
            parts.append(f"fixed={a.get('model') or n.name}")
            if a.get("read_bytes_per_s") is not None:
                parts.append(f"read={_fmt(float(a['read_bytes_per_s']))}")
        if distinguished:
            parts.append(f"#{n.id}")
        return "|".join(parts)

    # -- canonical form -------------------------------------------------------
    def _code(self, nid: str, vec: tuple) -> str:
        below = self.below[nid]
        if not below:
            return self.static[nid]
        key = (nid, tuple(vec[c] for c in below))
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        parts = []
        for c in self.children[nid]:
            if c in self.class_of:
                continue
            parts.append(self._code(c, vec))
        for ci in self.classes_here.get(nid, ()):
            ks = vec[ci]
            if self.flow:
                for m, k in enumerate(ks):
                    if k:
                        parts.extend([self._placed_in[ci][m]] * k)
                continue
            lab = _esc(self.class_label[ci])
            for m, k in enumerate(ks):
                if k:
                    parts.extend([f"{lab}[{self._placed[m]}]"] * k)
            empty = len(self.classes[ci]) - sum(ks)
            if empty:
                parts.extend([f"{lab}[]"] * empty)
        code = self._assemble(nid, parts)
        self._memo[key] = code
        return code

    def _assemble(self, nid: str, parts: list[str]) -> str:
        """A node's code from its children's; ``""`` for a subtree no flow goes through."""
        parts = [p for p in parts if p]
        if not parts and not self.alive[nid]:
            return ""
        parts.sort()
        return f"{_esc(self.label[nid])}[{''.join(parts)}]"

    def canonical(self, vec: tuple) -> str:
        codes = {r: self._code(r, vec) for r in self.roots}
        ordered = sorted(self.roots, key=codes.__getitem__)
        edges = ""
        if self.root_edges:
            if len(set(codes.values())) == len(codes):  # no two sockets alike: one order
                orders: Iterable[Iterable[str]] = (ordered,)
            else:
                groups = [list(g) for _, g in itertools.groupby(ordered, key=codes.__getitem__)]
                n_orders = math.prod(math.factorial(len(g)) for g in groups)
                if n_orders <= _MAX_ROOT_ORDERS:
                    orders = (itertools.chain.from_iterable(c) for c in
                              itertools.product(*(itertools.permutations(g) for g in groups)))
                else:  # too many identical sockets to try: tell them apart by id
                    orders = ()
                    edges = "ids:" + ";".join(sorted(f"{a}-{b}:{lab}"
                                                     for a, b, lab in self.root_edges))
            for order in orders:
                pos = {r: i for i, r in enumerate(order)}
                enc = ";".join(sorted(f"{min(pos[a], pos[b])}-{max(pos[a], pos[b])}:{lab}"
                                      for a, b, lab in self.root_edges))
                if not edges or enc < edges:
                    edges = enc
        body = "".join(codes[r] for r in ordered)
        return f"M[{body}|{_esc(edges)}|{self.floating_code}|{self.other_code}]"

    # -- assignments ------------------------------------------------------------
    def vector(self, assignment: Iterable[tuple[str, str]]) -> tuple:
        """Per-class model counts of an assignment; checks slots, models and fit."""
        vec = [[0] * len(self.models) for _ in self.classes]
        used: set[str] = set()
        for slot, name in assignment:
            if slot not in self.class_of:
                if slot not in self.topo:
                    raise PlannerError(f"layout: no slot {slot!r} in topology {self.topo.name!r}")
                raise PlannerError(f"layout: slot {slot!r} is not a candidate slot (it is in use "
                                   "by a device that stays, or not in the PCIe tree)")
            if slot in used:
                raise PlannerError(f"layout: two devices in slot {slot!r}")
            used.add(slot)
            m = self.model_index.get(name)
            if m is None:
                raise PlannerError(f"layout: model {name!r} is not in the inventory ({self.inventory})")
            fit = self.fits[slot][m]
            if not fit.ok:
                raise PlannerError(f"layout: {name} does not fit slot {slot!r}: {fit.reason}")
            vec[self.class_of[slot]][m] += 1
        totals = [sum(v[m] for v in vec) for m in range(len(self.models))]
        for m, (got, want) in enumerate(zip(totals, self.counts, strict=True)):
            if got != want:
                raise PlannerError(f"layout places {got} × {self.models[m].name}, the inventory "
                                   f"has {want}")
        return tuple(tuple(v) for v in vec)

    def assignment(self, vec: tuple) -> tuple[tuple[str, str], ...]:
        """The representative of a class-count vector: each class filled in tree order."""
        out: list[tuple[str, str]] = []
        cache = self._pairs
        for ci, ks in enumerate(vec):
            if not any(ks):
                continue
            pairs = cache.get((ci, ks))
            if pairs is None:
                slots = iter(self.classes[ci])
                pairs = [(next(slots), self.models[m].name) for m, k in enumerate(ks)
                         for _ in range(k)]
                cache[(ci, ks)] = pairs
            out.extend(pairs)
        out.sort()
        return tuple(out)

    def layout_of(self, vec: tuple, canon: str, mult: int) -> Layout:
        """The representative layout of a class-count vector (no checks: it is feasible)."""
        assignment = self.assignment(vec)
        assumed = tuple(s for s, name in assignment
                        if self.fits[s][self.model_index[name]].assumed_double_width)
        return Layout(assignment, None, canon, mult, self.kinds, assumed)

    def layout(self, assignment: Iterable[tuple[str, str]], label: str | None = None,
               multiplicity: Mapping[str, int] | None = None,
               notes: Iterable[str] = ()) -> Layout:
        assignment = tuple(sorted(assignment))
        vec = self.vector(assignment)
        canon = self.canonical(vec)
        mult = (multiplicity or {}).get(canon, 1)
        assumed = tuple(s for s, name in assignment
                        if self.fits[s][self.model_index[name]].assumed_double_width)
        notes = list(notes)
        unknown_ff = [s for s, name in assignment
                      if self.fits[s][self.model_index[name]].assumed_form_factor
                      and not self.topo.node(s).attrs.get("virtual")]
        if unknown_ff:
            notes.append(f"{len(unknown_ff)} slot(s) of unknown form factor assumed to fit")
        return Layout(assignment, label, canon, mult, self.kinds, assumed, tuple(notes))

    # -- counting -----------------------------------------------------------------
    def _check_models(self) -> None:
        t = self.topo
        if not self.candidates:
            raise PlannerError(f"topology {t.name!r} has no free slot to place {self.inventory} in")
        for m, model in enumerate(self.models):
            fitting = [s for s in self.candidates if self.fits[s][m].ok]
            if len(fitting) >= self.counts[m]:
                continue
            if not fitting:
                raise PlannerError(
                    f"no candidate slot fits {model.name} (it needs {model.describe_needs()}); "
                    f"the candidate slots are: {self._summary(self.candidates)}")
            reasons = Counter(self.fits[s][m].reason for s in self.candidates
                              if not self.fits[s][m].ok)
            why = "; ".join(f"{k} × {r}" for r, k in reasons.most_common(3))
            raise PlannerError(
                f"too few slots for {self.counts[m]} × {model.name}: only {len(fitting)} "
                f"candidate slot(s) fit ({model.describe_needs()}): "
                f"{self._summary(fitting)}" + (f"; the others do not: {why}" if why else ""))

    def _check_together(self) -> None:
        n = len(self.models)
        for r in range(2, n + 1):
            for subset in itertools.combinations(range(n), r):
                need = sum(self.counts[m] for m in subset)
                room = [s for s in self.candidates if any(self.fits[s][m].ok for m in subset)]
                if len(room) < need:
                    names = " and ".join(f"{self.counts[m]} × {self.models[m].name}"
                                         for m in subset)
                    raise PlannerError(f"{names} cannot be placed together: they need {need} "
                                       f"slots and only {len(room)} candidate slots fit any of "
                                       f"them ({self._summary(room)})")
        raise PlannerError(f"the devices {self.inventory} cannot be placed together")

    def _summary(self, slots: list[str]) -> str:
        c = Counter()
        for s in slots:
            n = self.topo.node(s)
            if n.attrs.get("virtual"):
                c[f"{n.attrs.get('virtual_kind')} position x{_fmt(n.attrs.get('width_lanes'))}"] += 1
                continue
            dw = n.attrs.get("double_width")
            desc = f"{slot_form_factor(n) or 'unknown form factor'} x{_fmt(n.attrs.get('width_lanes'))}"
            if dw is True:
                desc += " double-width"
            c[desc] += 1
        return ", ".join(f"{k} × {d}" for d, k in c.most_common()) or "none"

    def raw_count(self) -> int:
        n = len(self.candidates)
        k = sum(self.counts)
        if k > n:
            return 0
        return _multinomial(n, self.counts)

    def _vectors(self, ci: int, rem: tuple[int, ...]) -> list[tuple[tuple[int, ...], int]]:
        """The count tuples of class ``ci`` allowed by ``rem``, with their multinomials."""
        size = len(self.classes[ci])
        key = (ci, tuple(min(r, size) for r in rem))
        hit = self._vec_cache.get(key)
        if hit is None:
            hit = [(ks, _multinomial(size, ks))
                   for ks in _count_vectors(size, self.class_fit[ci], list(key[1]), len(rem))]
            self._vec_cache[key] = hit
        return hit

    def _suffix(self) -> tuple[list[list[int]], list[int]]:
        nc, nm = len(self.classes), len(self.models)
        cap = [[0] * nm for _ in range(nc + 1)]
        tot = [0] * (nc + 1)
        for ci in range(nc - 1, -1, -1):
            size = len(self.classes[ci])
            for m in range(nm):
                cap[ci][m] = cap[ci + 1][m] + (size if m in self.class_fit[ci] else 0)
            tot[ci] = tot[ci + 1] + (size if self.class_fit[ci] else 0)
        return cap, tot

    def _dp(self) -> dict[tuple[int, tuple[int, ...]], tuple[int, int, list]]:
        """Feasible assignments and class-count combinations, by DP over the classes.

        State ``(ci, remaining)``: classes ``ci:`` must take the per-model
        counts ``remaining``. Its value is ``(assignments, combinations,
        branches)``, ``branches`` the ``(counts of class ci, multinomial,
        next state)`` that lead to a full layout. States that cannot be
        completed are absent.
        """
        cap, tot = self._suffix()
        memo: dict[tuple[int, tuple[int, ...]], tuple[int, int, list]] = {}
        nc = len(self.classes)
        done = (nc, (0,) * len(self.models))
        memo[done] = (1, 1, [])
        # iterative depth-first evaluation (machines may have many classes)
        stack = [(0, tuple(self.counts))]
        while stack:
            key = stack[-1]
            if key in memo:
                stack.pop()
                continue
            ci, rem = key
            if ci == nc or any(rem[m] > cap[ci][m] for m in range(len(rem))) \
                    or sum(rem) > tot[ci]:
                memo[key] = (0, 0, [])
                stack.pop()
                continue
            options = [(ks, mult, (ci + 1, tuple(r - k for r, k in zip(rem, ks, strict=True))))
                       for ks, mult in self._vectors(ci, rem)]
            todo = [nxt for _, _, nxt in options if nxt not in memo]
            if todo:
                stack.extend(todo)
                continue
            ways = combos = 0
            branches = []
            for ks, mult, nxt in options:
                w, c, _ = memo[nxt]
                if c:
                    ways += w * mult
                    combos += c
                    branches.append((ks, mult, nxt))
            memo[key] = (ways, combos, branches)
            stack.pop()
        return memo

    def search(self, max_compositions: int) -> tuple[int, dict[str, list], int]:
        """(feasible count, canonical → [vec, multiplicity] in order found, compositions)."""
        self._check_models()
        memo = self._dp()
        start = (0, tuple(self.counts))
        feasible, n_comp, _ = memo[start]
        if feasible == 0:
            self._check_together()
        if n_comp > max_compositions:
            raise PlannerError(
                f"{n_comp} slot-class combinations ({feasible} feasible layouts) are too many to "
                f"compare (limit {max_compositions}); place fewer devices or fix some in place")
        found: dict[str, list] = {}
        nc = len(self.classes)
        vec: list[tuple[int, ...]] = [()] * nc
        canonical = self.canonical

        def rec(state: tuple[int, tuple[int, ...]], mult: int) -> None:
            ci = state[0]
            if ci == nc:
                v = tuple(vec)
                canon = canonical(v)
                hit = found.get(canon)
                if hit is None:
                    found[canon] = [v, mult]
                else:
                    hit[1] += mult
                return
            for ks, m, nxt in memo[state][2]:
                vec[ci] = ks
                rec(nxt, mult * m)

        rec(start, 1)
        return feasible, found, n_comp

    # -- classic layouts ---------------------------------------------------------
    def group_of(self, slot: str) -> str:
        """The switch or socket a slot hangs under (its nearest one)."""
        p = self.parent[slot]
        while p is not None and self.topo.node(p).kind not in (NodeKind.SWITCH, NodeKind.SOCKET):
            p = self.parent[p]
        return p or ""

    def depth(self, nid: str) -> int:
        d, p = 0, self.parent[nid]
        while p is not None:
            d, p = d + 1, self.parent[p]
        return d

    def _best(self, slots: Iterable[str], m: int, free: set[str]) -> str | None:
        model = self.models[m]

        def key(s: str):
            n = self.topo.node(s)
            ff = slot_form_factor(n)
            pref = model.form_factors.index(ff) if ff in model.form_factors else len(
                model.form_factors)
            fit = self.fits[s][m]
            return (pref, fit.assumed_double_width, n.attrs.get("width_lanes") or 0,
                    self.index[s])

        ok = [s for s in slots if s in free and self.fits[s][m].ok]
        return min(ok, key=key) if ok else None

    def classics(self, multiplicity: Mapping[str, int] | None) -> dict[str, Layout | str]:
        t = self.topo
        gpus = [m for m in range(len(self.models)) if self.models[m].kind == "gpu"
                for _ in range(self.counts[m])]
        ssds = [m for m in range(len(self.models)) if self.models[m].kind == "nvme"
                for _ in range(self.counts[m])]
        by_group: dict[str, list[str]] = {}
        for s in self.candidates:
            by_group.setdefault(self.group_of(s), []).append(s)
        switches = [g for g in by_group if g and t.node(g).kind == NodeKind.SWITCH]
        sockets = [g for g in by_group if g and t.node(g).kind == NodeKind.SOCKET]
        switches.sort(key=lambda g: self.index[g])
        sockets.sort(key=lambda g: self.index[g])
        gpu_models = sorted(set(gpus))
        ssd_models = sorted(set(ssds))

        def room(g: str, ms: list[int], free: set[str]) -> int:
            return sum(1 for s in by_group[g] if s in free and any(self.fits[s][m].ok for m in ms))

        def rr(devs: list[int], groups: list[str], free: set[str], out: list) -> list[int]:
            """Round-robin ``devs`` over ``groups``; returns the devices left over."""
            left = list(devs)
            i = 0
            while left and groups:
                progressed = False
                for _ in range(len(groups)):
                    g = groups[i % len(groups)]
                    i += 1
                    s = self._best(by_group[g], left[0], free)
                    if s is not None:
                        free.discard(s)
                        out.append((s, self.models[left.pop(0)].name))
                        progressed = True
                        break
                if not progressed:
                    break
            return left

        def seq(devs: list[int], slots: list[str], free: set[str], out: list) -> list[int]:
            left = []
            for m in devs:
                s = self._best(slots, m, free)
                if s is None:
                    left.append(m)
                else:
                    free.discard(s)
                    out.append((s, self.models[m].name))
            return left

        gpu_switches = [g for g in switches if room(g, gpu_models, set(self.candidates))]
        gpu_sockets = [g for g in sockets if room(g, gpu_models, set(self.candidates))]

        def place_gpus(strategy: str) -> tuple[list, set[str], list[str]] | str:
            free = set(self.candidates)
            out: list = []
            notes: list[str] = []
            if not gpus:
                return out, free, notes
            if strategy == "p2p":
                if not gpu_switches:
                    return ("no PCIe switch has a slot for a GPU: 'GPUs on one switch' "
                            "(P2P-first) does not apply")
                if len(gpu_switches) == 1 and not gpu_sockets:
                    return ("one switch only: 'spread' and 'P2P-first' coincide "
                            "(see the layout with GPUs spread)")
                ranked = sorted(gpu_switches, key=lambda g: (-room(g, gpu_models, free),
                                                             self.depth(g), self.index[g]))
                left = list(gpus)
                for g in ranked:
                    before = len(left)
                    left = seq(left, by_group[g], free, out)
                    if g == ranked[0] and left:
                        notes.append(f"{t.node(g).label} has room for {before - len(left)} of "
                                     f"the {len(gpus)} GPUs; the rest go elsewhere")
                    if not left:
                        break
                left = rr(left, gpu_sockets, free, out)
            else:
                groups = gpu_switches if len(gpu_switches) >= 2 else gpu_switches + gpu_sockets
                if len(groups) < 2 and len(gpu_switches) == 0:
                    notes.append("one root complex with GPU slots and no switch: the GPUs share it")
                left = rr(list(gpus), groups, free, out)
                left = rr(left, [g for g in gpu_sockets if g not in groups], free, out)
            left = seq(left, self.candidates, free, out)
            if left:
                return f"not enough free slots for the {len(gpus)} GPUs"
            return out, free, notes

        def front_rank(s: str) -> int:
            n = t.node(s)
            fb = n.attrs.get("front_bay")
            if fb is True:
                return 0
            if fb is None and slot_form_factor(n) == "u.2":
                return 1
            return 2

        any_front = any(front_rank(s) < 2 and any(self.fits[s][m].ok for m in ssd_models)
                        for s in self.candidates)

        def place_ssds(strategy: str, free: set[str], out: list) -> list[str] | str:
            notes: list[str] = []
            if not ssds:
                return notes
            if strategy == "front":
                if not any_front:
                    return "no front bays (no slot is marked front_bay or is a U.2 bay)"
                ranks = [[x for x in self.candidates if front_rank(x) == r] for r in (0, 1, 2)]
                left = list(ssds)
                for r in ranks:
                    left = seq(left, r, free, out)
                if left:
                    return f"not enough free slots for the {len(ssds)} SSDs"
                return notes
            sw = [g for g in switches if room(g, ssd_models, free)]
            left = list(ssds)
            if not sw:
                socks = [g for g in sockets if room(g, ssd_models, free)]
                if len(socks) < 2:
                    return ("no PCIe switch with a slot for an SSD and at most one root complex "
                            "with one: 'balanced' has nothing to balance across")
                notes.append("no PCIe switch with a slot for an SSD: balanced over the root "
                             "complexes")
                left = rr(left, socks, free, out)
            else:
                n = len(left)
                least = min(room(g, ssd_models, free) for g in sw)
                q = min(n // len(sw), least)
                for _ in range(q):
                    for g in sw:
                        left = seq(left[:1], by_group[g], free, out) + left[1:]
                if q == n // len(sw):
                    for g in sw:
                        if left and room(g, ssd_models, free):
                            left = seq(left[:1], by_group[g], free, out) + left[1:]
                else:
                    notes.append(f"{q} SSD(s) per switch: the least room on a switch")
                own = sorted((s for g in sockets for s in by_group[g] if s in free),
                             key=lambda s: (front_rank(s), self.index[s]))
                left = seq(left, own, free, out)
                left = rr(left, sw, free, out)
            left = seq(left, self.candidates, free, out)
            if left:
                return f"not enough free slots for the {len(ssds)} SSDs"
            return notes

        out: dict[str, Layout | str] = {}
        for key, (ssd_rule, gpu_rule) in {"a": ("front", "spread"), "b": ("front", "p2p"),
                                          "c": ("balanced", "spread"),
                                          "d": ("balanced", "p2p")}.items():
            if not gpus and gpu_rule == "p2p":
                out[key] = f"no GPUs to place: same as ({'a' if key == 'b' else 'c'})"
                continue
            if not ssds and ssd_rule == "balanced":
                out[key] = f"no SSDs to place: same as ({'a' if key == 'c' else 'b'})"
                continue
            g = place_gpus(gpu_rule)
            if isinstance(g, str):
                out[key] = g
                continue
            assign, free, notes = g
            assign = list(assign)
            s = place_ssds(ssd_rule, free, assign)
            if isinstance(s, str):
                out[key] = s
                continue
            out[key] = self.layout(assign, CLASSIC_LABELS[key], multiplicity, notes + s)
        return out

    def current(self, multiplicity: Mapping[str, int] | None) -> Layout | None:
        inv = self.inventory
        if not inv.installed or len(inv.installed) != inv.total:
            return None
        assign = []
        for dev, name in inv.installed:
            p = self.topo.parent(dev)
            if p is None or p.id not in self.class_of:
                return None
            assign.append((p.id, name))
        try:
            return self.layout(assign, "current", multiplicity)
        except PlannerError:
            return None  # where they are now breaks a fit rule


# ---------------------------------------------------------------------------
# public functions


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
    >>> from planner.topology.spec import load_machine
    >>> s = enumerate_layouts(load_machine("moment-a"), inventory_from_counts(4, 8))
    >>> s.raw_count, s.feasible_count
    (1338557220, 8817900)
    """
    start = time.perf_counter()
    mach = _Machine(topo, inventory, ignore_kinds, equivalence)
    feasible, found, n_comp = mach.search(max_compositions)
    mult = {c: v[1] for c, v in found.items()}
    special: dict[str, list[Layout]] = {}
    cur = mach.current(mult)
    if cur is not None:
        special.setdefault(cur.canonical, []).append(cur)
    for lay in mach.classics(mult).values():
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
    >>> from planner.topology.spec import load_machine
    >>> c = classic_layouts(load_machine("moment-b"), inventory_from_counts(4, 8))
    >>> sorted(s for s, m in c["c"].assignment if m == "a100-40gb-pcie")
    ['slot:b-sw0-slot0', 'slot:b-sw0-slot1', 'slot:b-sw1-slot0', 'slot:b-sw1-slot1']
    """
    mach = _machine_like(topo, inventory, search)
    return mach.classics(_multiplicities(mach, search))


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
    return mach.current(_multiplicities(mach, search))


def _tree_index(topo: Topology) -> dict[str, int]:
    """Position of every node in a depth-first walk from the roots, children in link order."""
    kids: dict[str, list[str]] = {}
    for lk in topo.links():
        if lk.kind in (LinkKind.PCIE, LinkKind.MEMORY):
            p = topo.parent(lk.dst)
            if p is not None and p.id == lk.src:
                kids.setdefault(lk.src, []).append(lk.dst)
    index: dict[str, int] = {}
    stack = [r.id for r in reversed(topo.roots())]
    while stack:
        nid = stack.pop()
        if nid in index:
            continue
        index[nid] = len(index)
        stack.extend(reversed(kids.get(nid, [])))
    for n in topo.nodes():
        index.setdefault(n.id, len(index))
    return index


def _device_ids(work: Topology, layout: Layout,
                kinds: Mapping[str, str]) -> list[tuple[str, str, str, str]]:
    """(device id, "GPU 0"/"SSD 0" label, slot, model) in tree order of the slots."""
    index = _tree_index(work)
    n: Counter[str] = Counter()
    out = []
    for slot, name in sorted(layout.assignment, key=lambda sm: index.get(sm[0], 1 << 30)):
        kind = kinds.get(name, "device")
        prefix, word = {"gpu": ("gpu", "GPU"), "nvme": ("ssd", "SSD")}.get(kind, ("dev", "Device"))
        i = n[prefix]
        n[prefix] += 1
        out.append((f"{prefix}{i}", f"{word} {i}", slot, name))
    return out


def _pcie_efficiency(lk: Link) -> float | None:
    """The protocol efficiency a gen × width link was computed with, if it was."""
    if lk.kind != LinkKind.PCIE or lk.bandwidth_source != "pcie" or not lk.pcie_gen \
            or not lk.lanes or not lk.bytes_per_s or lk.pcie_gen not in GT_PER_S:
        return None
    return lk.bytes_per_s / pcie_bytes_per_s(lk.pcie_gen, lk.lanes, 1.0)


def usual_efficiency(topo: Topology) -> float:
    """The protocol efficiency most of a topology's gen × width links were computed with."""
    seen = Counter(round(e, 6) for x in topo.links() if (e := _pcie_efficiency(x)) is not None)
    return seen.most_common(1)[0][0] if seen else DEFAULT_EFFICIENCY


def device_link(topo: Topology, slot_id: str, model: DeviceModel, dev_id: str,
                 usual_efficiency: float) -> Link:
    """The link slot → device a device of ``model`` gets in ``slot_id`` (see :func:`place`)."""
    slot = topo.node(slot_id)
    up = topo.parent(slot_id)
    up_link = topo.link_between(up.id, slot_id) if up is not None else None
    sgen = slot.attrs.get("pcie_gen") or (up_link.pcie_gen if up_link else None)
    swidth = slot.attrs.get("width_lanes") or (up_link.lanes if up_link else None)
    gen = min(sgen, model.pcie_gen) if sgen else model.pcie_gen
    lanes = min(swidth, model.lanes) if swidth else model.lanes
    eff = (_pcie_efficiency(up_link) if up_link is not None else None) or usual_efficiency
    link = Link.pcie(slot_id, dev_id, gen, lanes, eff)
    if up_link is not None and up_link.bytes_per_s is not None \
            and (not sgen or not swidth or up_link.bytes_per_s < (link.bytes_per_s or 0)):
        # an unknown slot, or a slot whose own figure is lower: the link above it decides
        link = Link(slot_id, dev_id, LinkKind.PCIE, up_link.bytes_per_s, gen, lanes,
                    up_link.bandwidth_source)
    return link


def _check_layout(work: Topology, layout: Layout, inventory: Inventory) -> None:
    """Raise :class:`PlannerError` unless ``layout`` places ``inventory`` into candidate slots."""
    moving = {d for d, _ in inventory.installed}
    for d in moving:
        if d not in work:
            raise PlannerError(f"inventory: installed device {d!r} is not in topology "
                               f"{work.name!r}")
    vacated = {p.id for d in moving if (p := work.parent(d)) is not None}
    models = {m.name: m for m in inventory.models}
    used: set[str] = set()
    got: Counter[str] = Counter()
    for slot_id, name in layout.assignment:
        if slot_id not in work:
            raise PlannerError(f"layout: no slot {slot_id!r} in topology {work.name!r}")
        slot = work.node(slot_id)
        held = [c for c in work.children(slot_id) if c.id not in moving]
        if slot.kind != NodeKind.SLOT or work.parent(slot_id) is None or held \
                or (slot.attrs.get("in_use") is True and slot_id not in vacated):
            raise PlannerError(f"layout: slot {slot_id!r} is not a candidate slot (it is in use "
                               "by a device that stays, or not in the PCIe tree)")
        if slot_id in used:
            raise PlannerError(f"layout: two devices in slot {slot_id!r}")
        used.add(slot_id)
        model = models.get(name)
        if model is None:
            raise PlannerError(f"layout: model {name!r} is not in the inventory ({inventory})")
        fit = slot_fit(slot, model)
        if not fit.ok:
            raise PlannerError(f"layout: {name} does not fit slot {slot_id!r}: {fit.reason}")
        got[name] += 1
    for model, want in inventory.items:
        if got[model.name] != want:
            raise PlannerError(f"layout places {got[model.name]} × {model.name}, the inventory "
                               f"has {want}")


def place(topo: Topology, layout: Layout, inventory: Inventory) -> Topology:
    """A new topology with the inventory's devices in the slots ``layout`` gives.

    The movable devices (``inventory.installed``) leave their slots; a
    device node is added under each slot of the layout — ids ``gpu0``,
    ``gpu1``, … and ``ssd0``, … in tree order (``placed:gpu0`` if the id is
    taken), kind ``gpu``/``nvme``, attrs ``model``, ``title``,
    ``read_bytes_per_s``, ``read_iops``, ``memory_bytes`` (when known),
    ``slot`` — linked slot → device at the lower generation and width of
    slot and model, computed with the topology's protocol efficiency and
    capped by the link above the slot. Those slots are marked in use. Fixed
    devices stay. ``topo`` is not changed.

    >>> from planner.inventory import inventory_from_counts
    >>> from planner.topology.spec import load_machine
    >>> topo, inv = load_machine("moment-b"), inventory_from_counts(4, 8)
    >>> placed = place(topo, classic_layouts(topo, inv)["c"], inv)
    >>> placed.counts()["gpu"], placed.counts()["nvme"], placed.parent("gpu0").id
    (4, 8, 'slot:b-sw0-slot0')
    """
    work = with_virtual_slots(topo)
    _check_layout(work, layout, inventory)
    out = work.copy()
    dropped = 0
    for dev, _ in inventory.installed:
        p = out.parent(dev)
        dropped += sum(1 for lk in out.links(LinkKind.NVLINK) if dev in lk.key)
        out.remove_node(dev)
        if p is not None and p.kind == NodeKind.SLOT:
            out.replace_node(p.with_attrs(in_use=False))
    if dropped:
        out.notes.append(f"{dropped} NVLink link(s) of the devices that moved are gone")
    kinds = dict(layout.kinds) or inventory.kinds()
    usual = usual_efficiency(out)
    for dev_id, _, slot_id, name in _device_ids(work, layout, kinds):
        model = inventory.model(name)
        nid = dev_id if dev_id not in out else f"placed:{dev_id}"
        slot = out.node(slot_id)
        link = device_link(out, slot_id, model, nid, usual)
        socket = out.socket_of(slot_id)
        numa = slot.numa_node if slot.numa_node is not None else (
            socket.numa_node if socket is not None else None)
        out.add_node(Node(nid, NodeKind(model.kind), model.title, numa_node=numa,
                          attrs={**device_attrs(model), "slot": slot_id, "placed": True}))
        out.add_link(link)
        out.replace_node(slot.with_attrs(in_use=True))
    label = f" ({layout.label})" if layout.label else ""
    out.notes.append(f"layout{label}: {inventory} placed by the planner")
    return out


def slot_map(topo: Topology, layout: Layout, inventory: Inventory | None = None
             ) -> list[SlotMapEntry]:
    """Where each device goes, as lines a technician can follow, in tree order.

    Devices are numbered as :func:`place` numbers them; each line gives the
    slot's designation, generation and width, the switches above it
    (nearest first) and its socket. The model is named when several models
    of one kind are placed (its title from ``inventory`` when given).

    >>> from planner.inventory import inventory_from_counts
    >>> from planner.topology.spec import load_machine
    >>> topo, inv = load_machine("moment-b"), inventory_from_counts(4, 8)
    >>> slot_map(topo, classic_layouts(topo, inv)["c"])[4].text
    'GPU 2 → Slot 0 (switch 1) (PCIe 4.0 x16), under PCIe switch 1, behind PCIe switch 0, on socket 0'
    """
    from planner.inventory import DEVICE_MODELS

    work = with_virtual_slots(topo)
    kinds = dict(layout.kinds) or (inventory.kinds() if inventory is not None else {})
    for name in {m for _, m in layout.assignment} - set(kinds):
        known = DEVICE_MODELS.get(name)
        kinds[name] = known.kind if known is not None else "device"
    out = []
    for dev_id, word, slot_id, name in _device_ids(work, layout, kinds):
        if slot_id not in work:
            raise PlannerError(f"layout: no slot {slot_id!r} in topology {topo.name!r}")
        slot = work.node(slot_id)
        gen, width = slot.attrs.get("pcie_gen"), slot.attrs.get("width_lanes")
        chain: list[str] = []
        socket = None
        for anc in work.ancestors(slot_id):
            if anc.kind == NodeKind.SWITCH:
                chain.append(anc.label)
            elif anc.kind == NodeKind.SOCKET:
                socket = anc.label
        designation = str(slot.attrs.get("designation") or slot.label)
        link = f"PCIe {gen}.0" if gen else "PCIe"
        link += f" x{width}" if width else ""
        if chain:
            where = f"under {chain[0]}" + "".join(f", behind {c}" for c in chain[1:])
            where += f", on {socket}" if socket else ""
        else:
            where = f"on the root complex of {socket}" if socket else "outside any socket"
        if inventory is not None and name in inventory.kinds():
            title = inventory.model(name).title
        else:
            title = DEVICE_MODELS[name].title if name in DEVICE_MODELS else name
        several = len({m for _, m in layout.assignment if kinds.get(m) == kinds.get(name)}) > 1
        head = f"{word} ({title})" if several else word
        out.append(SlotMapEntry(dev_id, word, name, slot_id, designation, gen, width,
                                tuple(chain), socket, f"{head} → {designation} ({link}), {where}"))
    return out
