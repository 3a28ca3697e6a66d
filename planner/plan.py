"""Recommend a slot layout: enumerate, prune by symmetry, solve a flow model per candidate, rank.

``plan(topology, inventory, demand)`` is the whole of ``moment plan`` as a
library call. It knows nothing of graphs: a :class:`Demand` says how many
bytes each accelerator reads per iteration and which share of the reads the
accelerators' own caches and host memory can absorb; the rest comes from the
storage devices.

A non-GNN example: a video pipeline where each GPU decodes 3 GB of frames per
step from NVMe SSDs, with nothing cached, on the paper's Machine B:

>>> from planner.inventory import inventory_from_counts
>>> from planner.topology.spec.load import load_machine
>>> result = plan(load_machine("moment-b"), inventory_from_counts(gpus=2, ssds=4),
...               Demand(bytes_per_consumer=3e9))
>>> result.best.rank, result.search.distinct_count > 1
(1, True)
>>> result.best.mean_inlet_bytes_per_s >= max(b.mean_inlet_bytes_per_s for b in result.ranked)
True
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from planner.bound import _Bounder
from planner.errors import PlannerError
from planner.flow import FLOW_MODELS, FlowResult, solve
from planner.inventory import Inventory
from planner.layout import (
    Layout,
    LayoutSearch,
    classic_layouts,
    current_layout,
    enumerate_layouts,
    place,
    slot_map,
)
from planner.topology.model import Link, LinkKind, NodeKind, Topology
from planner.workload import Consumer, Demand, Store, Tier, Workload

#: relative slack when comparing a solved T with a bound: the solvers return T
#: within 1e-4 of the optimum, so a layout is skipped only when it cannot beat
#: the ``top``-th solved one by more than that
BOUND_TOLERANCE = 2e-4

#: per-direction bandwidth of an NVLink bridge between two PCIe GPUs (A100 PCIe:
#: 12 links × 25 GB/s per direction; NVIDIA's "600 GB/s" counts both directions)
DEFAULT_NVLINK_BRIDGE_BYTES_PER_S = 300e9


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
            "cache share is given (`ssds=N`, `accelerator_cache_share`, `host_memory_share`)"
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
    tidy_best: bool = True,
) -> PlanResult:
    """Rank the distinct layouts of ``inventory`` on ``topology`` by predicted time per iteration.

    Layouts are solved in order of a cut lower bound on ``T`` (see
    :class:`_Bounder`) until ``top`` are solved and no unsolved layout can
    beat the ``top``-th; ``exhaustive=True`` solves every distinct layout.
    The classic layouts and the current one are always solved.
    ``progress(done, total)`` is called after each solve.

    ``tidy_best=True`` solves the best layout again with the flow model's tie-break (a
    linear program: early tiers, short paths, balanced stores), so that its flows and
    ``store_bytes`` are the placement's traffic targets. ``False`` keeps the flows the
    ranking solve found: the same ``T``, bottleneck, saturated stores and per-consumer
    inlet rates, with no LP solved under ``model="maxflow"`` (and scipy.optimize never
    imported); for a caller that shows only those.
    """
    solve_options = _check_plan_args(topology, model, top, unknown_link_bytes_per_s)
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
    bounds = {lay.canonical: bounder.lower_bound(lay) for lay in order} if prune else None
    if bounds is not None:
        order.sort(key=lambda lay: (bounds[lay.canonical], lay.canonical))
    t2 = time.perf_counter()
    solved = _solve_in_order(order, bounds, top, evaluate, progress)
    t3 = time.perf_counter()
    # Baselines: classic layouts and the current one, by their symmetry class.
    wanted: dict[str, Layout | str] = dict(classic_layouts(topology, inventory, search))
    cur = current_layout(topology, inventory, search)
    if cur is not None:
        wanted["current"] = cur
    ranked, baselines = _rank(solved, wanted, search, evaluate, tidy_best)
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


def _check_plan_args(topology: Topology, model: str, top: int,
                     unknown_link_bytes_per_s: float | None) -> dict[str, float]:
    """The options every solve gets; raises on a bad model, ``top`` or unknown links."""
    FLOW_MODELS.check(model)
    if top < 1:
        raise PlannerError(f"top must be at least 1, got {top}")
    unknown = [lk for lk in topology.links() if lk.bytes_per_s is None]
    if unknown and unknown_link_bytes_per_s is None:
        lk = unknown[0]
        raise PlannerError(
            f"{topology.name}: {len(unknown)} link(s) have no known bandwidth (e.g. {lk.src} → {lk.dst}); "
            "give measured figures (`capacities`) or a fuller capture (lspci -vvv), "
            "or assume a figure for them (`unknown_link_bytes_per_s`)"
        )
    return {"unknown_link_bytes_per_s": unknown_link_bytes_per_s} if unknown else {}


_Evaluate = Callable[..., tuple[Topology, FlowResult]]
_Solved = list[tuple[Layout, Topology, FlowResult]]


def _solve_in_order(order: list[Layout], bounds: dict[str, float] | None, top: int,
                    evaluate: _Evaluate, progress: Callable[[int, int], None] | None) -> _Solved:
    """Solve layouts in ``order`` until (with ``bounds``) no unsolved one can beat the ``top``-th."""
    solved: _Solved = []
    best_ts: list[float] = []
    for i, layout in enumerate(order):
        if bounds is not None and len(best_ts) >= top:
            kth = sorted(best_ts)[top - 1]
            # maxflow's bisection returns T within rel_tol above the optimum
            if kth <= bounds[layout.canonical] * (1.0 + BOUND_TOLERANCE):
                break
        placed, result = evaluate(layout)
        solved.append((layout, placed, result))
        best_ts.append(result.seconds_per_iteration)
        if progress:
            progress(i + 1, len(order))
    return solved


def _rank(solved: _Solved, wanted: dict[str, Layout | str], search: LayoutSearch,
          evaluate: _Evaluate, tidy_best: bool = True,
          ) -> tuple[tuple[RankedLayout, ...], dict[str, RankedLayout | str]]:
    """The baselines solved too, all ranked by ``T`` (the best solved again, tidy), and the baselines."""
    by_canonical = {lay.canonical: idx for idx, (lay, _, _) in enumerate(solved)}
    for lay in wanted.values():
        if isinstance(lay, Layout) and lay.canonical not in by_canonical:
            rep = search.find(lay) or lay
            placed, result = evaluate(rep)
            solved.append((rep, placed, result))
            by_canonical[rep.canonical] = len(solved) - 1
    solved.sort(key=lambda x: (x[2].seconds_per_iteration, x[0].canonical))
    best_layout = solved[0][0]
    if tidy_best:
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
    return ranked, baselines


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
    from planner.inventory import device_model

    movable, base = _base_inventory(topology, spec)
    overridden = any(v is not None for v in (gpus, ssds, gpu_model, ssd_model))
    if base is None and gpus is None and ssds is None:
        raise PlannerError(
            f"{topology.name}: nothing says which devices to place; give `gpus=N` and/or `ssds=N`"
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
    notes = list(base.notes) if base else []
    topo, installed = _installed_as_chosen(topology, movable, counts, chosen, notes)
    return topo, Inventory(
        tuple(items),
        fixed=movable.fixed if movable else (),
        installed=tuple(installed),
        notes=tuple(notes),
    )


def _base_inventory(topology: Topology, spec: str | None) -> tuple[Inventory | None, Inventory | None]:
    """(the devices now in the machine's slots, the inventory to start from): either may be None."""
    from planner.inventory import inventory_from_spec, inventory_from_topology

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
    return movable, base or movable


def _installed_as_chosen(topology: Topology, movable: Inventory | None, counts: dict[str, int],
                         chosen: dict[str, str], notes: list[str]) -> tuple[Topology, list[tuple[str, str]]]:
    """Installed devices take the chosen model; those beyond the count leave the machine."""
    topo = topology
    installed: list[tuple[str, str]] = []
    if movable is None:
        return topo, installed
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
    return topo, installed
