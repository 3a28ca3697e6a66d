"""Recommend a slot layout: enumerate, prune by symmetry, solve a flow model per candidate, rank.

``plan(topology, inventory, demand)`` is the whole of ``moment plan`` as a
library call. It knows nothing of graphs: a :class:`Demand` says how many
bytes each accelerator reads per iteration and which share of the reads the
accelerators' own caches and host memory can absorb; the rest comes from the
storage devices.

A non-GNN example: a video pipeline where each GPU decodes 3 GB of frames per
step from NVMe SSDs, with nothing cached, on the paper's Machine B:

>>> from planner.inventory import inventory_from_counts
>>> from planner.topology.spec import load_machine
>>> result = plan(load_machine("moment-b"), inventory_from_counts(gpus=2, ssds=4),
...               Demand(bytes_per_consumer=3e9))
>>> result.best.rank, result.search.distinct_count > 1
(1, True)
>>> result.best.mean_inlet_bytes_per_s >= max(b.mean_inlet_bytes_per_s for b in result.ranked)
True
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from planner.errors import PlannerError
from planner.flow import FlowResult, solve
from planner.inventory import Inventory, with_virtual_slots
from planner.layout import (
    Layout,
    LayoutSearch,
    classic_layouts,
    current_layout,
    device_link,
    enumerate_layouts,
    place,
    slot_map,
    usual_efficiency,
)
from planner.topology.model import Link, LinkKind, NodeKind, Topology
from planner.workload import Consumer, Store, Tier, Workload

MODELS = ("maxflow", "concurrent")

#: relative slack when comparing a solved T with a bound: the solvers return T
#: within 1e-4 of the optimum, so a layout is skipped only when it cannot beat
#: the ``top``-th solved one by more than that
BOUND_TOLERANCE = 2e-4

#: per-direction bandwidth of an NVLink bridge between two PCIe GPUs (A100 PCIe:
#: 12 links × 25 GB/s per direction; NVIDIA's "600 GB/s" counts both directions)
DEFAULT_NVLINK_BRIDGE_BYTES_PER_S = 300e9


@dataclass(frozen=True)
class Demand:
    """What every accelerator reads per iteration, and where it can come from.

    ``bytes_per_consumer`` is per accelerator and per iteration (bytes).
    ``accelerator_cache_share``: share of reads served by a cache replicated
    on every accelerator (its own memory, no interconnect traffic);
    ``host_memory_share``: share served by host memory, each row held once
    across the NUMA nodes; the storage devices serve the rest. Shares are
    upper bounds the flow model may use, from cache sizes × hotness curve.
    """

    bytes_per_consumer: float
    accelerator_cache_share: float = 0.0
    host_memory_share: float = 0.0

    def __post_init__(self) -> None:
        b = self.bytes_per_consumer
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or b <= 0:
            raise PlannerError(f"demand per accelerator must be a positive number of bytes, got {b!r}")
        for name in ("accelerator_cache_share", "host_memory_share"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise PlannerError(f"{name.replace('_', ' ')} must be in [0, 1], got {v!r}")
        if self.accelerator_cache_share + self.host_memory_share > 1.0 + 1e-9:
            raise PlannerError(
                "accelerator cache share + host memory share exceed 1: "
                f"{self.accelerator_cache_share} + {self.host_memory_share}"
            )


def workload_for(placed: Topology, demand: Demand, consumers: Sequence[str] | None = None,
                 stores: Sequence[str] | None = None) -> Workload:
    """The planner workload of a placed machine: every GPU a consumer, every data SSD a store.

    ``consumers``/``stores`` restrict to those node ids (default: all GPUs,
    and all NVMe devices that carry ``read_bytes_per_s``, i.e. data drives
    rather than boot disks — or all NVMe when none does).
    """
    gpus = list(consumers) if consumers is not None else [n.id for n in placed.nodes(NodeKind.GPU)]
    if not gpus:
        raise PlannerError(f"{placed.name}: no GPU to read the data")
    if stores is None:
        nvme = placed.nodes(NodeKind.NVME)
        data = [n for n in nvme if n.attrs.get("read_bytes_per_s")] or nvme
        stores = [n.id for n in data]
    tiers: list[Tier] = []
    if demand.accelerator_cache_share > 0:
        tiers.append(Tier("gpu-cache", [Store(f"cache:{g}", g) for g in gpus],
                          demand.accelerator_cache_share, replicated=True))
    if demand.host_memory_share > 0:
        mems = placed.nodes(NodeKind.MEMORY)
        if not mems:
            raise PlannerError(f"{placed.name}: host memory share given but the machine has no memory node")
        tiers.append(Tier("cpu-memory", [Store(m.id, m.id) for m in mems], demand.host_memory_share))
    if stores:
        ssd_stores = []
        for sid in stores:
            node = placed.node(sid)
            bw = node.attrs.get("read_bytes_per_s")
            ssd_stores.append(Store(sid, sid, float(bw) if bw else None))
        tiers.append(Tier("ssd", ssd_stores, 1.0))
    if not tiers:
        raise PlannerError(
            f"{placed.name}: nothing to read from: no SSD is placed or present, and no GPU or host "
            "cache share is given (--ssds N, --gpu-cache-share, --cpu-cache-share)"
        )
    return Workload([Consumer(g, demand.bytes_per_consumer) for g in gpus], tiers, name=placed.name)


@dataclass(frozen=True)
class RankedLayout:
    """One solved candidate with its flow result; ``rank`` 1 is the best (smallest T).

    Ranks count solved layouts only. Those up to ``plan``'s ``top`` are the
    global ranks (no unsolved layout can beat them); further ones, such as a
    poor classic layout, are only "worse than ``top``" when layouts were
    pruned.
    """

    rank: int
    layout: Layout
    placed: Topology
    result: FlowResult
    labels: tuple[str, ...] = ()

    @property
    def seconds_per_iteration(self) -> float:
        return self.result.seconds_per_iteration

    @property
    def mean_inlet_bytes_per_s(self) -> float:
        v = list(self.result.inlet_bytes_per_s.values())
        return sum(v) / len(v)

    @property
    def min_inlet_bytes_per_s(self) -> float:
        return min(self.result.inlet_bytes_per_s.values())


@dataclass(frozen=True)
class SearchCounts:
    raw_count: int
    feasible_count: int
    distinct_count: int


@dataclass(frozen=True)
class PlanResult:
    """Everything ``moment plan`` reports.

    ``ranked`` holds every distinct layout, best first; ``baselines`` maps
    the classic layouts ``(a)``–``(d)`` and ``current`` to their ranked
    entry, or to the reason they do not apply on this machine.
    """

    machine: str
    model: str
    inventory: Inventory
    demand: Demand
    search: SearchCounts
    ranked: tuple[RankedLayout, ...]
    baselines: dict[str, RankedLayout | str]
    seconds: dict[str, float]
    notes: tuple[str, ...] = field(default_factory=tuple)
    solved_count: int = 0

    @property
    def best(self) -> RankedLayout:
        return self.ranked[0]

    def gain_over(self, name: str) -> float | None:
        """Best mean inlet bandwidth / the baseline's (``None`` if the baseline does not apply)."""
        b = self.baselines.get(name)
        if not isinstance(b, RankedLayout):
            return None
        return self.best.mean_inlet_bytes_per_s / b.mean_inlet_bytes_per_s

    def slot_map(self, entry: RankedLayout | None = None) -> list[str]:
        e = entry or self.best
        return slot_map(e.placed, e.layout)


def add_nvlinks(placed: Topology, pairs: Sequence[tuple[int, int]],
                bytes_per_s: float = DEFAULT_NVLINK_BRIDGE_BYTES_PER_S) -> Topology:
    """A what-if: NVLink bridges between placed GPUs, named by index (``gpu0``, ``gpu1``, ...)."""
    out = placed.copy()
    gpus = [n.id for n in out.nodes(NodeKind.GPU)]
    for a, b in pairs:
        for i in (a, b):
            if not 0 <= i < len(gpus):
                raise PlannerError(f"NVLink pair {a}-{b}: there is no GPU {i} (GPUs are 0..{len(gpus) - 1})")
        if a == b:
            raise PlannerError(f"NVLink pair {a}-{b}: a GPU cannot be bridged to itself")
        if out.link_between(gpus[a], gpus[b]) is None:
            out.add_link(Link(gpus[a], gpus[b], LinkKind.NVLINK, bytes_per_s, bandwidth_source="what-if",
                              attrs={"what_if": True}))
    return out


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


def plan(
    topology: Topology,
    inventory: Inventory,
    demand: Demand,
    *,
    model: str = "maxflow",
    top: int = 5,
    exhaustive: bool = False,
    nvlink_pairs: Sequence[tuple[int, int]] = (),
    nvlink_bytes_per_s: float = DEFAULT_NVLINK_BRIDGE_BYTES_PER_S,
    unknown_link_bytes_per_s: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> PlanResult:
    """Rank the distinct layouts of ``inventory`` on ``topology`` by predicted time per iteration.

    Layouts are solved in order of a cut lower bound on ``T`` (see
    :class:`_Bounder`) until ``top`` are solved and no unsolved layout can
    beat the ``top``-th; ``exhaustive=True`` solves every distinct layout.
    The classic layouts and the current one are always solved.
    ``progress(done, total)`` is called after each solve.
    """
    if model not in MODELS:
        raise PlannerError(f"unknown flow model {model!r}; choose one of {', '.join(MODELS)}")
    if top < 1:
        raise PlannerError(f"top must be at least 1, got {top}")
    unknown = [lk for lk in topology.links() if lk.bytes_per_s is None]
    if unknown and unknown_link_bytes_per_s is None:
        lk = unknown[0]
        raise PlannerError(
            f"{topology.name}: {len(unknown)} link(s) have no known bandwidth (e.g. {lk.src} → {lk.dst}); "
            "give measured figures (moment profile, --capacities) or a fuller capture (lspci -vvv), "
            "or assume a figure for them (--unknown-link-gbps, unknown_link_bytes_per_s=)"
        )
    solve_options = {"unknown_link_bytes_per_s": unknown_link_bytes_per_s} if unknown else {}
    t0 = time.perf_counter()
    search: LayoutSearch = enumerate_layouts(topology, inventory)
    t1 = time.perf_counter()
    if not search.distinct:
        raise PlannerError(f"{topology.name}: no feasible layout for {inventory}")

    def evaluate(layout: Layout, tidy: bool = False) -> tuple[Topology, FlowResult]:
        # Ranking needs T and the binding links only; the tie-break LP that makes the flows
        # tidy (equal traffic on identical SSDs) costs as much again, so only the winner gets it.
        placed = place(topology, layout, inventory)
        if nvlink_pairs:
            placed = add_nvlinks(placed, nvlink_pairs, nvlink_bytes_per_s)
        return placed, solve(placed, workload_for(placed, demand), model, tie_break=tidy,
                             **solve_options)

    bounder = _Bounder(topology, inventory, demand)
    prune = not exhaustive and not nvlink_pairs and bounder.usable
    order = list(search.distinct)
    bounds = {lay.canonical: bounder.lower_bound(lay) for lay in order} if prune else {}
    if prune:
        order.sort(key=lambda lay: (bounds[lay.canonical], lay.canonical))
    t2 = time.perf_counter()

    solved: list[tuple[Layout, Topology, FlowResult]] = []
    best_ts: list[float] = []
    for i, layout in enumerate(order):
        if prune and len(best_ts) >= top:
            kth = sorted(best_ts)[top - 1]
            # maxflow's bisection returns T within rel_tol above the optimum
            if kth <= bounds[layout.canonical] * (1.0 + BOUND_TOLERANCE):
                break
        placed, result = evaluate(layout)
        solved.append((layout, placed, result))
        best_ts.append(result.seconds_per_iteration)
        if progress:
            progress(i + 1, len(order))
    t3 = time.perf_counter()

    # Baselines: classic layouts and the current one, by their symmetry class.
    wanted: dict[str, Layout | str] = dict(classic_layouts(topology, inventory, search))
    cur = current_layout(topology, inventory, search)
    if cur is not None:
        wanted["current"] = cur
    by_canonical = {lay.canonical: idx for idx, (lay, _, _) in enumerate(solved)}
    for lay in wanted.values():
        if isinstance(lay, Layout) and lay.canonical not in by_canonical:
            rep = search.find(lay) or lay
            placed, result = evaluate(rep)
            solved.append((rep, placed, result))
            by_canonical[rep.canonical] = len(solved) - 1
    solved.sort(key=lambda x: (x[2].seconds_per_iteration, x[0].canonical))
    best_layout = solved[0][0]
    solved[0] = (best_layout, *evaluate(best_layout, tidy=True))
    index = {lay.canonical: i for i, (lay, _, _) in enumerate(solved)}
    labels: dict[int, list[str]] = {}
    for name, lay in wanted.items():
        if isinstance(lay, Layout):
            labels.setdefault(index[lay.canonical], []).append(name)
    ranked = tuple(
        RankedLayout(rank=i + 1, layout=lay, placed=placed, result=res, labels=tuple(labels.get(i, ())))
        for i, (lay, placed, res) in enumerate(solved)
    )
    baselines: dict[str, RankedLayout | str] = {
        name: (ranked[index[lay.canonical]] if isinstance(lay, Layout) else lay)
        for name, lay in wanted.items()
    }
    notes = list(search.notes)
    if prune and len(solved) < len(search.distinct):
        notes.append(
            f"{len(search.distinct) - len(solved)} of {len(search.distinct)} distinct layouts were not "
            f"solved: a cut bound shows none of them beats rank {top}"
        )
    t4 = time.perf_counter()
    return PlanResult(
        machine=topology.name,
        model=model,
        inventory=inventory,
        demand=demand,
        search=SearchCounts(search.raw_count, search.feasible_count, len(search.distinct)),
        ranked=ranked,
        baselines=baselines,
        seconds={"enumerate": t1 - t0, "bound": t2 - t1, "solve": t3 - t2, "baselines": t4 - t3,
                 "total": t4 - t0},
        notes=tuple(notes),
        solved_count=len(solved),
    )


def layout_summary(placed: Topology) -> str:
    """Where the devices went, by switch or socket: ``"socket 0: 1 GPU · switch 1: 2 GPU 2 SSD"``."""
    groups: dict[str, list[str]] = {}
    order: list[str] = []
    for n in [*placed.nodes(NodeKind.GPU), *placed.nodes(NodeKind.NVME)]:
        if "model" not in n.attrs:
            continue  # a fixed device, not placed by the plan
        owner = next((a for a in placed.ancestors(n.id)
                      if a.kind in (NodeKind.SWITCH, NodeKind.SOCKET)), None)
        key = owner.label if owner else "?"
        if key not in groups:
            order.append(key)
        groups.setdefault(key, []).append("GPU" if n.kind == NodeKind.GPU else "SSD")
    parts = []
    for key in sorted(order, key=_owner_sort_key):
        kinds = groups[key]
        text = " ".join(f"{kinds.count(k)} {k}" for k in ("GPU", "SSD") if kinds.count(k))
        parts.append(f"{key}: {text}")
    return " · ".join(parts)


def _owner_sort_key(label: str) -> tuple[int, str]:
    return (0 if label.startswith("socket") else 1, label)


def measured_inventory(inventory: Inventory, caps) -> tuple[Inventory, list[str]]:
    """``inventory`` with the read figures that ``caps`` (a :class:`~planner.capacities.Capacities`)
    measured for its device models, and a sentence per figure applied or left unused.

    A plan places device *models* into slots, so a measurement reaches it only
    through the model it was taken of (matched by name, title or the model the
    capacities file records, see :func:`planner.capacities.find_device`). A
    measured device that matches no model to place is named, with the fix.
    """
    from dataclasses import replace as _replace

    from planner.capacities import Capacities, apply_to_inventory, find_device

    models = [m for m, _ in inventory.items]
    new = apply_to_inventory(models, caps)
    notes = []
    for old, m in zip(models, new, strict=True):
        if m is not old and old.read_bytes_per_s:
            notes.append(f"{old.name}: {m.read_bytes_per_s / 1e9:.2f} GB/s measured ({m.source}) instead of "
                         f"{old.read_bytes_per_s / 1e9:.2f} GB/s from its datasheet")
    for d in caps.devices:
        one = Capacities(devices=(d,))
        if not any(find_device(one, name) for m in models for name in (m.name, m.title) if name):
            notes.append(f"measured device {d.key} ({d.model or 'model unknown'}) is none of the devices to "
                         f"place ({', '.join(m.name for m in models)}): its {d.read_bytes_per_s / 1e9:.2f} GB/s "
                         "is not used; add `model: <one of those>` to its entry in the capacities file")
    items = tuple((m, n) for m, (_, n) in zip(new, inventory.items, strict=True))
    return _replace(inventory, items=items), notes


def choose_inventory(
    topology: Topology,
    *,
    spec: str | None = None,
    gpus: int | None = None,
    ssds: int | None = None,
    gpu_model: str | None = None,
    ssd_model: str | None = None,
) -> tuple[Topology, Inventory]:
    """The devices to place, and the topology to place them in.

    The devices come from a machine spec's inventory or from the GPUs and
    SSDs now in the machine's slots, with counts and models overridden
    where given (the what-ifs of ``moment plan``). Devices now in slots
    always leave them (the plan may put the devices anywhere); with a smaller
    count than installed, the extra devices are taken out of the machine.
    """
    from planner.inventory import device_model, inventory_from_spec, inventory_from_topology

    movable: Inventory | None = None
    try:
        movable = inventory_from_topology(topology)
    except PlannerError:
        movable = None
    base = None
    if spec is not None:
        try:
            base = inventory_from_spec(spec)
        except PlannerError:
            base = None
    base = base or movable
    overridden = any(v is not None for v in (gpus, ssds, gpu_model, ssd_model))
    if base is None and gpus is None and ssds is None:
        raise PlannerError(
            f"{topology.name}: nothing says which devices to place; give --gpus N and/or --ssds N"
        )
    if base is not None and not overridden:
        return topology, base
    counts = {"gpu": 0, "nvme": 0}
    models: dict[str, object] = {"gpu": "a100-40gb-pcie", "nvme": "p5510"}
    if base is not None:
        for model, n in base.items:
            counts[model.kind] = counts.get(model.kind, 0) + n
            models[model.kind] = model
    if gpus is not None:
        counts["gpu"] = gpus
    if ssds is not None:
        counts["nvme"] = ssds
    if gpu_model is not None:
        models["gpu"] = device_model(gpu_model)
    if ssd_model is not None:
        models["nvme"] = device_model(ssd_model)
    for kind, n in counts.items():
        if n < 0:
            raise PlannerError(f"the number of {'GPUs' if kind == 'gpu' else 'SSDs'} cannot be negative, got {n}")
    if counts["gpu"] == 0 and counts["nvme"] == 0:
        raise PlannerError("nothing to place: 0 GPUs and 0 SSDs")
    items = []
    chosen: dict[str, str] = {}
    for kind, n in counts.items():
        model = device_model(models[kind])
        if model.kind != kind:
            raise PlannerError(f"{model.name} is a {model.kind} model, not a {kind} model")
        chosen[kind] = model.name
        if n > 0:
            items.append((model, n))
    # Installed devices take the chosen model; those beyond the count leave the machine.
    topo = topology
    installed: list[tuple[str, str]] = []
    notes = list(base.notes) if base else []
    if movable is not None:
        kept = {"gpu": 0, "nvme": 0}
        removed = []
        for dev, _ in movable.installed:
            kind = topology.node(dev).kind.value
            if kept.get(kind, 0) < counts.get(kind, 0):
                kept[kind] += 1
                installed.append((dev, chosen[kind]))
            else:
                removed.append(dev)
        if removed:
            topo = topology.copy()
            for dev in removed:
                slot = topo.parent(dev)
                topo.remove_node(dev)
                if slot is not None and slot.kind == NodeKind.SLOT:
                    topo.replace_node(slot.with_attrs(in_use=False))
            notes.append(f"what-if: {len(removed)} installed device(s) taken out: {', '.join(removed)}")
    return topo, Inventory(
        tuple(items),
        fixed=movable.fixed if movable else (),
        installed=tuple(installed),
        notes=tuple(notes),
    )
