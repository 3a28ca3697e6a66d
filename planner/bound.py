"""A cheap lower bound on a layout's seconds per iteration, from cuts of the PCIe tree.

:func:`planner.plan.plan` solves layouts in the order of this bound and stops
when no unsolved layout can beat the ones it has (see :class:`_Bounder`).
"""

from __future__ import annotations

import math

from planner.inventory import Inventory, with_virtual_slots
from planner.layout import Layout, device_link, usual_efficiency
from planner.topology.model import LinkKind, NodeKind, Topology
from planner.workload import Demand


class _Bounder:
    """Cheap lower bounds on ``T`` for a layout, without building its topology.

    Every subtree ``X`` of the PCIe tree (and each socket with its memory)
    gives a cut of the max-flow network: what the accelerators inside ``X``
    read must enter through ``X``'s uplink or come from stores inside, so

        T ≥ D_in(X) / (c_down(X) + R_in(X))      and
        T ≥ D_out(X) / (c_up(X) + R_out(X)),

    with ``D`` the demand not served by a replicated accelerator cache, ``R``
    the stores' read rates (a store's read limit, or its link if lower) and
    ``c`` the link capacities (unknown counts as unbounded). Both flow models
    are at least as slow as any cut says (``concurrent`` adds constraints to
    ``maxflow``), so a layout whose bound is above a solved layout's ``T``
    cannot beat it. This is what lets ``plan`` solve a few dozen of the
    thousands of distinct layouts of a two-socket machine and still return
    the exact best ones (within the solver's tolerance).
    """

    def __init__(self, topology: Topology, inventory: Inventory, demand: Demand) -> None:
        work = with_virtual_slots(topology)
        self.work = work
        self.usual = usual_efficiency(work)
        self.models = {m.name: m for m in inventory.models}
        moving = {d for d, _ in inventory.installed}
        keep = 1.0 - demand.accelerator_cache_share
        self.parent: dict[str, str | None] = {}
        self.up: dict[str, float] = {}
        self.down: dict[str, float] = {}
        for n in work.nodes():
            p = work.parent(n.id)
            self.parent[n.id] = p.id if p is not None else None
            if p is not None:
                self.down[n.id] = _cap(work, p.id, n.id)
                self.up[n.id] = _cap(work, n.id, p.id)
        # Roots (sockets): their region is entered over the inter-socket links.
        for lk in work.links(LinkKind.INTER_SOCKET):
            for a, b in ((lk.src, lk.dst), (lk.dst, lk.src)):
                self.down[a] = self.down.get(a, 0.0) + _cap(work, b, a)
                self.up[a] = self.up.get(a, 0.0) + _cap(work, a, b)
        self.base_d: dict[str, float] = {}
        self.base_r: dict[str, float] = {}  # storage devices
        self.base_m: dict[str, float] = {}  # host memory (a tier capped at host_memory_share)
        placed_nvme_rate = any(m.kind == "nvme" and m.read_bytes_per_s for m in inventory.models)
        n_consumers = sum(1 for g in work.nodes(NodeKind.GPU) if g.id not in moving)
        for g in work.nodes(NodeKind.GPU):
            if g.id not in moving:
                self._add(self.base_d, g.id, keep * demand.bytes_per_consumer)
        for d in work.nodes(NodeKind.NVME):
            rate = d.attrs.get("read_bytes_per_s")
            if d.id not in moving and (rate or not placed_nvme_rate):
                up = self.up.get(d.id, math.inf)
                self._add(self.base_r, d.id, min(float(rate) if rate else math.inf, up))
        if demand.host_memory_share > 0:
            for m in work.nodes(NodeKind.MEMORY):
                self._add(self.base_m, m.id, self.up.get(m.id, math.inf))
        self.keep = keep
        self.demand = demand
        n_consumers += sum(c for m, c in inventory.items if m.kind == "gpu")
        #: bytes per iteration the host-memory tier can serve at most (its share of ΣD)
        self.host_cap = demand.host_memory_share * demand.bytes_per_consumer * n_consumers
        self.link_cache: dict[tuple[str, str], float] = {}
        self.usable = not work.links(LinkKind.NVLINK)

    def _add(self, acc: dict[str, float], node: str | None, value: float) -> None:
        while node is not None:
            acc[node] = acc.get(node, 0.0) + value
            node = self.parent.get(node)

    def _device_cap(self, slot: str, model_name: str) -> float:
        key = (slot, model_name)
        if key not in self.link_cache:
            lk = device_link(self.work, slot, self.models[model_name], "bound", self.usual)
            self.link_cache[key] = lk.bytes_per_s if lk.bytes_per_s is not None else math.inf
        return self.link_cache[key]

    def lower_bound(self, layout: Layout) -> float:
        d, r, m = dict(self.base_d), dict(self.base_r), self.base_m
        bound = 0.0
        need = self.keep * self.demand.bytes_per_consumer
        for slot, name in layout.assignment:
            cap = self._device_cap(slot, name)
            model = self.models[name]
            if model.kind == "gpu":
                if need > 0:
                    bound = max(bound, _ratio(need, cap))
                self._add(d, slot, need)
            elif model.kind == "nvme":
                self._add(r, slot, min(model.read_bytes_per_s or math.inf, cap))
        roots = [k for k in set(d) | set(r) | set(m) if self.parent.get(k) is None]
        d_tot = sum(d.get(k, 0.0) for k in roots)
        r_tot = sum(r.get(k, 0.0) for k in roots)
        m_tot = sum(m.get(k, 0.0) for k in roots)
        if d_tot <= 0:
            return 0.0
        h = self.host_cap
        bound = max(bound, _ratio(d_tot, r_tot + m_tot), _ratio(d_tot - h, r_tot))
        for node in set(d) | set(r) | set(m):
            din, rin, min_ = d.get(node, 0.0), r.get(node, 0.0), m.get(node, 0.0)
            down = self.down.get(node, 0.0)
            if din > 0:
                # the memory tier's cut: either its stores in the region, or its share cap
                bound = max(bound, _ratio(din, down + rin + min_), _ratio(din - h, down + rin))
            dout, rout, mout = d_tot - din, r_tot - rin, m_tot - min_
            if dout > 0 and node in self.up:
                up = self.up[node]
                bound = max(bound, _ratio(dout, up + rout + mout), _ratio(dout - h, up + rout))
        return bound


def _ratio(need: float, rate: float) -> float:
    """Seconds to move ``need`` bytes at ``rate`` bytes/s (0 if nothing is needed)."""
    if need <= 0:
        return 0.0
    return need / rate if rate > 0 else math.inf


def _cap(topo: Topology, a: str, b: str) -> float:
    data = topo.graph.edges.get((a, b))
    if data is None or data.get("bytes_per_s") is None:
        return math.inf
    return float(data["bytes_per_s"])
