"""The machine as the layout search sees it: tree, slot classes, canonical form, counting.

See :mod:`planner.layout` for the counting and symmetry this implements.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from planner.errors import PlannerError
from planner.inventory import Inventory, slot_form_factor, with_virtual_slots
from planner.layout.fit import Fit, _length_class, slot_fit
from planner.layout.place import device_link, usual_efficiency
from planner.layout.types import EQUIVALENCES, Layout
from planner.topology.model import DEVICE_KINDS, Link, LinkKind, Node, NodeKind, Topology

#: the most orderings of identical sockets tried when their links must be matched
_MAX_ROOT_ORDERS = 720


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
        self.movable = {d for d, _ in inventory.installed}
        for d in self.movable:
            if d not in self.topo:
                raise PlannerError(f"inventory: installed device {d!r} is not in topology "
                                   f"{topo.name!r}")
        self._tree()
        distinguished = self._off_tree_links()
        self._candidate_slots()
        self._leave_out(ignore_kinds, distinguished)
        self._slot_classes(distinguished)
        self._codes(distinguished)

    def _tree(self) -> None:
        """Parents, children, roots and tree order, without the devices that move."""
        t = self.topo
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

    def _off_tree_links(self) -> set[str]:
        """Inter-socket links and the others (NVLink): the nodes on the latter are told apart."""
        t = self.topo
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
        return distinguished

    def _candidate_slots(self) -> None:
        """Free slots, and slots vacated by devices that move, in tree order."""
        t = self.topo
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

    def _leave_out(self, ignore_kinds: Iterable[str], distinguished: set[str]) -> None:
        """Drop fixed devices of ``ignore_kinds`` (and slots holding only them) from the tree."""
        t = self.topo
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

    def _slot_classes(self, distinguished: set[str]) -> None:
        """Fits, labels, interchangeable slot classes and the classes below each node."""
        t = self.topo
        cand = set(self.candidates)
        self.fits: dict[str, list[Fit]] = {
            s: [slot_fit(t.node(s), m) for m in self.models] for s in self.candidates}

        self.label: dict[str, str] = {}
        for nid in self.order + self.floating:
            self.label[nid] = self._label(t.node(nid), nid in distinguished)

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

    def _codes(self, distinguished: set[str]) -> None:
        """The codes that do not depend on the layout, and the memo tables of the search."""
        t = self.topo
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
