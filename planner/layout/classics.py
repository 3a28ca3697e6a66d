"""The paper's classic layouts (a)–(d) and the current one, by rule on any machine.

The rules are in :mod:`planner.layout`'s docstring: GPUs are placed first
(:meth:`_Rules.place_gpus`), SSDs in what is left (:meth:`_Rules.place_ssds`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from planner.errors import PlannerError
from planner.inventory import slot_form_factor
from planner.layout.machine import _Machine
from planner.layout.types import CLASSIC_LABELS, Layout
from planner.topology.model import NodeKind

__all__ = ["classic_layouts_of", "current_layout_of"]

#: layout key -> (SSD rule, GPU rule)
RULES = {"a": ("front", "spread"), "b": ("front", "p2p"),
         "c": ("balanced", "spread"), "d": ("balanced", "p2p")}

_Assigned = list[tuple[str, str]]  # (slot, model name) pairs placed so far


def classic_layouts_of(mach: _Machine, multiplicity: Mapping[str, int] | None) -> dict[str, Layout | str]:
    """Layouts ``"a"``–``"d"`` on a prepared machine, or why a rule does not apply."""
    rules = _Rules(mach)
    out: dict[str, Layout | str] = {}
    for key, (ssd_rule, gpu_rule) in RULES.items():
        if not rules.gpus and gpu_rule == "p2p":
            out[key] = f"no GPUs to place: same as ({'a' if key == 'b' else 'c'})"
            continue
        if not rules.ssds and ssd_rule == "balanced":
            out[key] = f"no SSDs to place: same as ({'a' if key == 'c' else 'b'})"
            continue
        g = rules.place_gpus(gpu_rule)
        if isinstance(g, str):
            out[key] = g
            continue
        assign, free, notes = g
        assign = list(assign)
        s = rules.place_ssds(ssd_rule, free, assign)
        if isinstance(s, str):
            out[key] = s
            continue
        out[key] = mach.layout(assign, CLASSIC_LABELS[key], multiplicity, notes + s)
    return out


def current_layout_of(mach: _Machine, multiplicity: Mapping[str, int] | None) -> Layout | None:
    """Where the inventory's installed devices are now, when all are installed and fit."""
    inv = mach.inventory
    if not inv.installed or len(inv.installed) != inv.total:
        return None
    assign = []
    for dev, name in inv.installed:
        p = mach.topo.parent(dev)
        if p is None or p.id not in mach.class_of:
            return None
        assign.append((p.id, name))
    try:
        return mach.layout(assign, "current", multiplicity)
    except PlannerError:
        return None  # where they are now breaks a fit rule


class _Rules:
    """The candidate slots of a machine grouped by switch and socket, and the placing rules."""

    def __init__(self, mach: _Machine) -> None:
        self.mach = mach
        self.topo = t = mach.topo
        models, counts = mach.models, mach.counts
        self.gpus = [m for m in range(len(models)) if models[m].kind == "gpu" for _ in range(counts[m])]
        self.ssds = [m for m in range(len(models)) if models[m].kind == "nvme" for _ in range(counts[m])]
        self.by_group: dict[str, list[str]] = {}
        for s in mach.candidates:
            self.by_group.setdefault(self.group_of(s), []).append(s)
        groups = sorted((g for g in self.by_group if g), key=lambda g: mach.index[g])
        self.switches = [g for g in groups if t.node(g).kind == NodeKind.SWITCH]
        self.sockets = [g for g in groups if t.node(g).kind == NodeKind.SOCKET]
        self.gpu_models = sorted(set(self.gpus))
        self.ssd_models = sorted(set(self.ssds))
        every = set(mach.candidates)
        self.gpu_switches = [g for g in self.switches if self.room(g, self.gpu_models, every)]
        self.gpu_sockets = [g for g in self.sockets if self.room(g, self.gpu_models, every)]
        self.any_front = any(self.front_rank(s) < 2 and any(mach.fits[s][m].ok for m in self.ssd_models)
                             for s in mach.candidates)

    # -- where slots are -------------------------------------------------------
    def group_of(self, slot: str) -> str:
        """The switch or socket a slot hangs under (its nearest one)."""
        parent = self.mach.parent
        p = parent[slot]
        while p is not None and self.topo.node(p).kind not in (NodeKind.SWITCH, NodeKind.SOCKET):
            p = parent[p]
        return p or ""

    def depth(self, nid: str) -> int:
        d, p = 0, self.mach.parent[nid]
        while p is not None:
            d, p = d + 1, self.mach.parent[p]
        return d

    def room(self, g: str, ms: list[int], free: set[str]) -> int:
        return sum(1 for s in self.by_group[g] if s in free and any(self.mach.fits[s][m].ok for m in ms))

    def front_rank(self, s: str) -> int:
        n = self.topo.node(s)
        fb = n.attrs.get("front_bay")
        if fb is True:
            return 0
        if fb is None and slot_form_factor(n) == "u.2":
            return 1
        return 2

    def best(self, slots: Iterable[str], m: int, free: set[str]) -> str | None:
        """The free slot a device of model ``m`` takes among ``slots`` (module docstring's order)."""
        mach = self.mach
        model = mach.models[m]

        def key(s: str):
            n = self.topo.node(s)
            ff = slot_form_factor(n)
            pref = model.form_factors.index(ff) if ff in model.form_factors else len(
                model.form_factors)
            fit = mach.fits[s][m]
            return (pref, fit.assumed_double_width, n.attrs.get("width_lanes") or 0, mach.index[s])

        ok = [s for s in slots if s in free and mach.fits[s][m].ok]
        return min(ok, key=key) if ok else None

    # -- two ways to hand out slots ----------------------------------------------
    def rr(self, devs: list[int], groups: list[str], free: set[str], out: _Assigned) -> list[int]:
        """Round-robin ``devs`` over ``groups``; returns the devices left over."""
        left = list(devs)
        i = 0
        while left and groups:
            progressed = False
            for _ in range(len(groups)):
                g = groups[i % len(groups)]
                i += 1
                s = self.best(self.by_group[g], left[0], free)
                if s is not None:
                    free.discard(s)
                    out.append((s, self.mach.models[left.pop(0)].name))
                    progressed = True
                    break
            if not progressed:
                break
        return left

    def seq(self, devs: list[int], slots: list[str], free: set[str], out: _Assigned) -> list[int]:
        """Each device into the best free slot of ``slots``; returns the devices left over."""
        left = []
        for m in devs:
            s = self.best(slots, m, free)
            if s is None:
                left.append(m)
            else:
                free.discard(s)
                out.append((s, self.mach.models[m].name))
        return left

    # -- the rules ---------------------------------------------------------------
    def place_gpus(self, strategy: str) -> tuple[_Assigned, set[str], list[str]] | str:
        """GPUs by ``"p2p"`` (on one switch) or ``"spread"``: (placed, free slots, notes) or why not."""
        free = set(self.mach.candidates)
        out: _Assigned = []
        notes: list[str] = []
        gpus, gpu_switches, gpu_sockets = self.gpus, self.gpu_switches, self.gpu_sockets
        if not gpus:
            return out, free, notes
        if strategy == "p2p":
            if not gpu_switches:
                return ("no PCIe switch has a slot for a GPU: 'GPUs on one switch' "
                        "(P2P-first) does not apply")
            if len(gpu_switches) == 1 and not gpu_sockets:
                return ("one switch only: 'spread' and 'P2P-first' coincide "
                        "(see the layout with GPUs spread)")
            ranked = sorted(gpu_switches, key=lambda g: (-self.room(g, self.gpu_models, free),
                                                         self.depth(g), self.mach.index[g]))
            left = list(gpus)
            for g in ranked:
                before = len(left)
                left = self.seq(left, self.by_group[g], free, out)
                if g == ranked[0] and left:
                    notes.append(f"{self.topo.node(g).label} has room for {before - len(left)} of "
                                 f"the {len(gpus)} GPUs; the rest go elsewhere")
                if not left:
                    break
            left = self.rr(left, gpu_sockets, free, out)
        else:
            groups = gpu_switches if len(gpu_switches) >= 2 else gpu_switches + gpu_sockets
            if len(groups) < 2 and len(gpu_switches) == 0:
                notes.append("one root complex with GPU slots and no switch: the GPUs share it")
            left = self.rr(list(gpus), groups, free, out)
            left = self.rr(left, [g for g in gpu_sockets if g not in groups], free, out)
        left = self.seq(left, self.mach.candidates, free, out)
        if left:
            return f"not enough free slots for the {len(gpus)} GPUs"
        return out, free, notes

    def place_ssds(self, strategy: str, free: set[str], out: _Assigned) -> list[str] | str:
        """SSDs by ``"front"`` (front bays first) or ``"balanced"``: notes, or why not."""
        notes: list[str] = []
        if not self.ssds:
            return notes
        if strategy == "front":
            if not self.any_front:
                return "no front bays (no slot is marked front_bay or is a U.2 bay)"
            left = list(self.ssds)
            for r in (0, 1, 2):
                left = self.seq(left, [x for x in self.mach.candidates if self.front_rank(x) == r],
                                free, out)
        else:
            balanced = self._balanced(free, out, notes)
            if isinstance(balanced, str):
                return balanced
            left = balanced
        left = self.seq(left, self.mach.candidates, free, out)
        if left:
            return f"not enough free slots for the {len(self.ssds)} SSDs"
        return notes

    def _balanced(self, free: set[str], out: _Assigned, notes: list[str]) -> list[int] | str:
        """The same number of SSDs on every switch, the rest in the root complexes' own slots."""
        sw = [g for g in self.switches if self.room(g, self.ssd_models, free)]
        left = list(self.ssds)
        if not sw:
            socks = [g for g in self.sockets if self.room(g, self.ssd_models, free)]
            if len(socks) < 2:
                return ("no PCIe switch with a slot for an SSD and at most one root complex "
                        "with one: 'balanced' has nothing to balance across")
            notes.append("no PCIe switch with a slot for an SSD: balanced over the root "
                               "complexes")
            return self.rr(left, socks, free, out)
        n = len(left)
        least = min(self.room(g, self.ssd_models, free) for g in sw)
        q = min(n // len(sw), least)
        for _ in range(q):
            for g in sw:
                left = self.seq(left[:1], self.by_group[g], free, out) + left[1:]
        if q == n // len(sw):
            for g in sw:
                if left and self.room(g, self.ssd_models, free):
                    left = self.seq(left[:1], self.by_group[g], free, out) + left[1:]
        else:
            notes.append(f"{q} SSD(s) per switch: the least room on a switch")
        own = sorted((s for g in self.sockets for s in self.by_group[g] if s in free),
                     key=lambda s: (self.front_rank(s), self.mach.index[s]))
        left = self.seq(left, own, free, out)
        return self.rr(left, sw, free, out)
