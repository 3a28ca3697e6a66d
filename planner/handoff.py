"""The hand-off from planning to placement: the plan file, and the per-store targets it carries.

A plan (:func:`planner.plan.plan`) recommends a layout and predicts, with a
flow model, how many bytes every store (a GPU cache, a host memory, an SSD)
serves each GPU per iteration. Placement (``training.place``, DDAK) needs
exactly that: a target per store, and which socket each store and GPU sits
on. This module owns the typed object that carries it (:class:`PlanTargets`)
and the plan file that holds it between ``moment plan --json`` and
``moment place --plan`` (:func:`plan_file_dict`, :func:`read_plan_file`;
schema ``moment.plan``, version :data:`PLAN_VERSION`).

Why a plan is re-solved before placement (:meth:`PlanHandoff.resolve`): a plan
is made for a demand whose cache shares are what the user said
(``--gpu-cache-share``, ``--cpu-cache-share``; 0 by default). The caches a
placement really has serve another share, known only once the hotness and the
cache sizes are: a plan made with shares of 0 would give the caches a target
of 0 and send every read to the SSDs. So the placement keeps the plan's
layout (its placed topology is in the file) and solves the flow model on it
again with the caches' real shares; a plan made on the fly goes through the
very same steps, so both give the same placement.

>>> from planner.plan import plan
>>> from planner.workload import Demand
>>> from planner.topology.spec.load import load_machine
>>> from planner.inventory import inventory_from_spec
>>> result = plan(load_machine("moment-b"), inventory_from_spec("moment-b"), Demand(1e9), top=1)
>>> h = handoff_from_plan(result)
>>> again = read_plan_file(json.loads(json.dumps(plan_file_dict(h))))
>>> again.targets.stores == h.targets.stores, again.demand == h.demand
(True, True)
>>> t, note = again.resolve(0.2, 0.3)
>>> sorted({s.kind for s in t.stores}), note.startswith("targets re-solved")
(['cpu', 'gpu', 'ssd'], True)
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from momentbase.jsontypes import JsonObject, JsonValue
from planner.errors import PlannerError
from planner.topology.model import LinkKind, NodeKind, Topology
from planner.vocab import HANDOFF_LAYOUTS

if TYPE_CHECKING:
    from planner.capacities.model import Capacities

__all__ = ["PLAN_SCHEMA", "PLAN_VERSION", "PlanFileError", "PlanHandoff", "PlanTargets", "StoreTarget", "plan_now",
           "devices_of", "handoff_from_plan", "nvlink_pairs_of", "plan_document", "plan_file_dict", "read_plan_file",
           "targets_from_flow"]

PLAN_SCHEMA = "moment.plan"
#: the version of what :func:`read_plan_file` reads (``schema``, ``version``, ``handoff``).
#: 2: the recommended layout's placed topology, the demand and the targets ("handoff"); 1 had targets only.
#: The other keys of a plan file are for people and no reader depends on them: the per-layout
#: ``devices`` and ``nvlink`` that files written before 2026-11 carry were dropped without a
#: new version, and such a file still reads (the reader never looked at them).
PLAN_VERSION = 2


class PlanFileError(PlannerError):
    """A plan file that cannot be read (the message names the file and the fix)."""


@dataclass(frozen=True)
class StoreTarget:
    """One store of a plan: ``kind`` ``gpu`` (a GPU cache), ``cpu`` (host memory) or ``ssd``.

    ``node`` is its topology node (the GPU, memory or NVMe device), ``socket``
    the socket that node hangs under (``None`` if unknown), ``target_bytes``
    what the flow model wants it to serve per iteration (all GPUs together),
    ``bytes_by_socket`` how those bytes split by the socket of the GPU that
    reads them (the flow solution's routing; sockets as node ids).
    """

    id: str
    kind: str
    node: str
    socket: str | None
    target_bytes: float
    numa_node: int | None = None
    bytes_by_socket: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class PlanTargets:
    """What a placement needs from a plan: the GPUs (``(node id, socket)``), the stores, NVLink pairs."""

    machine: str
    gpus: tuple[tuple[str, str | None], ...]
    stores: tuple[StoreTarget, ...]
    nvlink_pairs: tuple[tuple[str, str], ...] = ()
    source: str = ""
    #: the flow model's inlet per GPU (bytes/s, all tiers; GPUs served wholly locally left out): what
    #: training's throughput is held against (:mod:`training.throughput`); empty in older plan files
    inlet_bytes_per_s: tuple[tuple[str, float], ...] = ()

    def of_kind(self, kind: str) -> list[StoreTarget]:
        return sorted((s for s in self.stores if s.kind == kind), key=lambda s: natural_key(s.id))

    def nvlink_joins_all_gpus(self) -> bool:
        """Whether every GPU reaches every other over NVLink (directly or through other GPUs)."""
        ids = [g for g, _ in self.gpus]
        if len(ids) < 2:
            return False
        adj: dict[str, set[str]] = {g: set() for g in ids}
        for a, b in self.nvlink_pairs:
            if a in adj and b in adj:
                adj[a].add(b)
                adj[b].add(a)
        seen, todo = {ids[0]}, [ids[0]]
        while todo:
            for nb in adj[todo.pop()] - seen:
                seen.add(nb)
                todo.append(nb)
        return len(seen) == len(ids)


def natural_key(text: str) -> tuple:
    """``ssd10`` after ``ssd9``."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


_KIND_OF_NODE = {NodeKind.GPU: "gpu", NodeKind.MEMORY: "cpu", NodeKind.NVME: "ssd"}


def devices_of(placed: Topology) -> dict[str, JsonObject]:
    """Kind, socket and NUMA node of every GPU, memory and NVMe device of a placed topology."""
    out: dict[str, JsonObject] = {}
    for kind in (NodeKind.GPU, NodeKind.MEMORY, NodeKind.NVME):
        for n in placed.nodes(kind):
            s = placed.socket_of(n.id)
            numa = (s.attrs.get("numa_nodes") or [None])[0] if s is not None else None
            out[n.id] = {"kind": kind.value, "socket": s.id if s is not None else None, "numa_node": numa}
    return out


def nvlink_pairs_of(placed: Topology) -> list[list[str]]:
    """NVLink links between GPUs of a placed topology, each pair once."""
    gpus = {n.id for n in placed.nodes(NodeKind.GPU)}
    pairs = {tuple(sorted((lk.src, lk.dst))) for lk in placed.links(LinkKind.NVLINK)
             if lk.src in gpus and lk.dst in gpus}
    return [list(p) for p in sorted(pairs)]


def targets_from_flow(placed: Topology, result, machine: str = "", source: str = "") -> PlanTargets:
    """The targets of a placed topology's :class:`~planner.flow.FlowResult`.

    Every memory of the machine is a store, with target 0 where the flow gave
    it nothing (a CPU cache may still use it).
    """
    devices = devices_of(placed)
    gpus = tuple((g, devices[g]["socket"]) for g in sorted(result.inlet_bytes_per_s, key=natural_key))
    sock_of = dict(gpus)
    by_store: dict[str, dict[str, float]] = {}
    for (sid, consumer), nbytes in result.flows.items():
        sock = sock_of.get(consumer) or "?"
        d = by_store.setdefault(sid, {})
        d[sock] = d.get(sock, 0.0) + float(nbytes)
    stores = []
    for sid, nbytes in result.store_bytes.items():
        node = sid.split(":", 1)[1] if sid.startswith("cache:") else sid
        dev = devices.get(node)
        if dev is None:
            raise PlannerError(f"store {sid!r} of the flow solution is not a GPU, memory or NVMe device")
        split = tuple(sorted(by_store.get(sid, {}).items()))
        stores.append(StoreTarget(sid, _KIND_OF_NODE[NodeKind(dev["kind"])], node, dev["socket"], float(nbytes),
                            dev["numa_node"], split))
    for node, dev in devices.items():
        if dev["kind"] == NodeKind.MEMORY.value and node not in result.store_bytes:
            stores.append(StoreTarget(node, "cpu", node, dev["socket"], 0.0, dev["numa_node"]))
    pairs = tuple((a, b) for a, b in nvlink_pairs_of(placed))
    inlet = tuple((g, float(result.inlet_bytes_per_s[g])) for g, _ in gpus
                  if math.isfinite(result.inlet_bytes_per_s[g]))
    return PlanTargets(machine or placed.name, gpus, tuple(stores), pairs, source or machine or placed.name, inlet)


@dataclass(frozen=True)
class PlanHandoff:
    """A plan as placement takes it: the recommended layout, the demand and model it was solved for,
    and its targets.

    ``placed`` is the recommended layout's topology (devices in their slots),
    ``demand`` a :class:`planner.plan.Demand`, ``model`` the flow model's name,
    ``unknown_link_bytes_per_s`` what was assumed for links of unknown speed.
    """

    machine: str
    model: str
    demand: Any
    placed: Topology
    targets: PlanTargets
    unknown_link_bytes_per_s: float | None = None
    source: str = ""
    #: which of the plan's layouts this is: ``recommended``, ``current`` or a classic one ``a``-``d``
    layout: str = "recommended"

    def resolve(self, accelerator_cache_share: float, host_memory_share: float) -> tuple[PlanTargets, str | None]:
        """Targets for caches that serve these shares of the reads, on this plan's layout.

        The plan's own targets when its demand had these shares (within 1e-9);
        otherwise the flow model solved again on the same placed topology with
        them, and a sentence that says so (for the user).
        """
        from planner.flow import solve
        from planner.plan import workload_for
        from planner.workload import Demand

        d = self.demand
        same = (abs(d.accelerator_cache_share - accelerator_cache_share) <= 1e-9
                and abs(d.host_memory_share - host_memory_share) <= 1e-9)
        if same:
            return self.targets, None
        if not self.placed.nodes(NodeKind.MEMORY):
            host_memory_share = 0.0
        new = Demand(d.bytes_per_consumer, accelerator_cache_share, host_memory_share)
        options = ({"unknown_link_bytes_per_s": self.unknown_link_bytes_per_s}
                   if self.unknown_link_bytes_per_s else {})
        result = solve(self.placed, workload_for(self.placed, new), self.model, tie_break=True, **options)
        targets = replace(targets_from_flow(self.placed, result, self.machine), source=self.source)
        note = (f"targets re-solved on the plan's layout for the caches given: GPU cache "
                f"{accelerator_cache_share:.1%} and host memory {host_memory_share:.1%} of the reads "
                f"(the plan assumed {d.accelerator_cache_share:.1%} and {d.host_memory_share:.1%})")
        return targets, note



def handoff_from_plan(result, source: str = "", unknown_link_bytes_per_s: float | None = None,
                      layout: str = "recommended") -> PlanHandoff:
    """The hand-off of a :class:`planner.plan.PlanResult` for one of its layouts.

    ``layout``: ``recommended`` (the best one), ``current`` (the machine as it
    is cabled now, from a capture) or a classic layout ``a``-``d``: a user who
    cannot move the devices yet places the data for the layout they have.
    Raises :class:`PlanFileError` when the plan has no such layout, with the reason.
    """
    if layout not in HANDOFF_LAYOUTS:
        raise PlanFileError(f"layout {layout!r}: expected one of {', '.join(HANDOFF_LAYOUTS)}")
    entry, flow = result.best, result.best.result
    if layout != "recommended":
        entry = result.baselines.get(layout)
        if entry is None or isinstance(entry, str):
            why = entry or "the plan has no such layout"
            raise PlanFileError(f"layout {layout!r}: {why}; plan for the recommended layout, or give the "
                                "machine's captures (lspci, dmidecode) so that its current layout is known")
        # a baseline is solved for its time only; its targets come from the same tie-broken
        # solution as the recommended layout's (early tiers, local reads, balanced stores)
        from planner.flow import solve
        from planner.plan import workload_for

        options = {"unknown_link_bytes_per_s": unknown_link_bytes_per_s} if unknown_link_bytes_per_s else {}
        flow = solve(entry.placed, workload_for(entry.placed, result.demand), result.model, tie_break=True,
                     **options)
    targets = targets_from_flow(entry.placed, flow, result.machine, source or result.machine)
    return PlanHandoff(result.machine, result.model, result.demand, entry.placed, targets,
                       unknown_link_bytes_per_s, source or result.machine, layout)


def plan_now(topology: Topology, *, spec: str | None = None, model: str = "maxflow",
             nvlink_pairs: Sequence[tuple[int, int]] = (), unknown_link_bytes_per_s: float | None = None,
             capacities: Capacities | None = None, source: str = "") -> PlanHandoff:
    """The hand-off of a plan made now, exactly as ``moment plan`` makes it by default (demand 1 GB per
    GPU, cache shares 0), through the plan file's form: the placement made from it equals the one made
    from ``moment plan --json`` output.

    ``spec``: the machine spec naming the devices (:func:`planner.plan.choose_inventory`);
    ``capacities``: measured figures for the device models (``moment profile``).
    """
    from planner.plan import choose_inventory, measured_inventory, plan
    from planner.workload import Demand

    topo, inventory = choose_inventory(topology, spec=spec)
    if capacities is not None:
        inventory, _ = measured_inventory(inventory, capacities)
    result = plan(topo, inventory, Demand(1e9), model=model, top=1, nvlink_pairs=nvlink_pairs,
                  unknown_link_bytes_per_s=unknown_link_bytes_per_s)
    h = handoff_from_plan(result, unknown_link_bytes_per_s=unknown_link_bytes_per_s)
    return read_plan_file(json.loads(json.dumps(plan_file_dict(h))),
                          source=source or f"a plan of {result.machine} made now")


def _targets_dict(t: PlanTargets) -> JsonObject:
    return {"machine": t.machine, "gpus": [list(g) for g in t.gpus],
            "stores": [{"id": s.id, "kind": s.kind, "node": s.node, "socket": s.socket,
                        "target_bytes": s.target_bytes, "numa_node": s.numa_node,
                        "bytes_by_socket": [list(x) for x in s.bytes_by_socket]} for s in t.stores],
            "nvlink_pairs": [list(p) for p in t.nvlink_pairs],
            "inlet_bytes_per_s": [list(x) for x in t.inlet_bytes_per_s]}


def plan_file_dict(h: PlanHandoff) -> JsonObject:
    """The ``handoff`` part of a plan file, with the schema and version (JSON-able)."""
    from planner.topology.jsonio import to_dict

    d = h.demand
    return {"schema": PLAN_SCHEMA, "version": PLAN_VERSION, "machine": h.machine, "model": h.model,
            "handoff": {"layout": h.layout,
                        "demand": {"bytes_per_consumer": d.bytes_per_consumer,
                                   "accelerator_cache_share": d.accelerator_cache_share,
                                   "host_memory_share": d.host_memory_share},
                        "unknown_link_bytes_per_s": h.unknown_link_bytes_per_s,
                        "targets": _targets_dict(h.targets),
                        "topology": to_dict(h.placed)}}


def _ranked_dict(e) -> JsonObject:
    """One ranked layout of a plan (a :class:`planner.plan.RankedLayout`), JSON-able."""
    from planner.plan import layout_summary

    r = e.result
    return {
        "rank": e.rank,
        "labels": list(e.labels),
        "layout": layout_summary(e.placed),
        "assignment": [list(a) for a in e.layout.assignment],
        "multiplicity": e.layout.multiplicity,
        "seconds_per_iteration": r.seconds_per_iteration,
        "mean_inlet_bytes_per_s": e.mean_inlet_bytes_per_s,
        "inlet_bytes_per_s": r.inlet_bytes_per_s,
        "store_bytes": r.store_bytes,
        "tier_shares": r.tier_shares,
        "bottleneck": [list(b) for b in r.bottleneck],
        "link_utilisation": [[a, b, u] for (a, b), u in sorted(r.link_utilisation.items()) if u > 0],
    }


def plan_document(result, *, top: int, layout: str = "recommended",
                  unknown_link_bytes_per_s: float | None = None,
                  nodes: Mapping[str, JsonValue] | None = None) -> JsonObject:
    """The whole plan file (``moment plan --json``) of a :class:`planner.plan.PlanResult`, JSON-able.

    Parameters
    ----------
    result : planner.plan.PlanResult
        The plan.
    top : int
        How many ranked layouts the ``ranked`` list shows.
    layout : str
        The layout the ``handoff`` is for (:data:`HANDOFF_LAYOUTS`; see :func:`handoff_from_plan`).
    unknown_link_bytes_per_s : float or None
        The capacity the plan gave links of unknown speed, bytes/s (``None``: none given).
    nodes : mapping or None
        The summary of the best layout solved as one node of several, when there is one.

    Returns
    -------
    dict
        For people: the search counts, the best, ranked and baseline layouts, the gains
        and notes. For ``moment place --plan``: ``schema``, ``version`` and ``handoff``
        (:func:`plan_file_dict`, read back by :func:`read_plan_file`).

    Raises
    ------
    PlanFileError
        ``layout`` is not one of the plan's layouts (see :func:`handoff_from_plan`).
    """
    from planner.plan import RankedLayout

    summary = {
        "schema": PLAN_SCHEMA,
        "machine": result.machine,
        "model": result.model,
        "inventory": str(result.inventory),
        "demand": {
            "bytes_per_consumer": result.demand.bytes_per_consumer,
            "accelerator_cache_share": result.demand.accelerator_cache_share,
            "host_memory_share": result.demand.host_memory_share,
        },
        "counts": {"raw": result.search.raw_count, "feasible": result.search.feasible_count,
                   "distinct": result.search.distinct_count, "solved": result.solved_count},
        "seconds": result.seconds,
        "best": _ranked_dict(result.best),
        "slot_map": [m.text for m in result.slot_map()],
        "ranked": [_ranked_dict(e) for e in result.ranked[:top]],
        "baselines": {k: (_ranked_dict(v) if isinstance(v, RankedLayout) else {"not_applicable": v})
                      for k, v in result.baselines.items()},
        "gains": {k: result.gain_over(k) for k in result.baselines},
        "notes": list(result.notes),
    }
    h = handoff_from_plan(result, unknown_link_bytes_per_s=unknown_link_bytes_per_s, layout=layout)
    return {**summary, **plan_file_dict(h), **({"nodes": dict(nodes)} if nodes else {})}


def read_plan_file(data: Mapping[str, JsonValue] | str | Path, source: str | None = None) -> PlanHandoff:
    """A :class:`PlanHandoff` from a plan file's data (a parsed JSON object) or path.

    Raises :class:`PlanFileError` naming ``source`` for anything but a
    version-:data:`PLAN_VERSION` ``moment.plan`` file.
    """
    from planner.topology.jsonio import from_dict
    from planner.workload import Demand

    if isinstance(data, (str, Path)):
        source = source or str(data)
        try:
            data = json.loads(Path(data).read_text())
        except FileNotFoundError:
            raise PlanFileError(f"{source}: no such file; write one with `planner.handoff.plan_document`") from None
        except (OSError, ValueError) as exc:
            raise PlanFileError(
                f"{source}: not readable JSON ({exc}); write it with `planner.handoff.plan_document`"
            ) from None
    source = source or "plan"
    fix = "write it again with `planner.handoff.plan_document`"
    if not isinstance(data, Mapping) or data.get("schema") != PLAN_SCHEMA:
        raise PlanFileError(f"{source}: not a plan (no \"schema\": \"{PLAN_SCHEMA}\"); {fix}")
    if data.get("version") != PLAN_VERSION:
        raise PlanFileError(f"{source}: plan file version {data.get('version')!r}, this Moment reads version "
                            f"{PLAN_VERSION} (the one with the recommended layout's topology); {fix}")
    try:
        h = data["handoff"]
        dd = h["demand"]
        demand = Demand(float(dd["bytes_per_consumer"]), float(dd["accelerator_cache_share"]),
                        float(dd["host_memory_share"]))
        t = h["targets"]
        stores = tuple(StoreTarget(str(s["id"]), str(s["kind"]), str(s["node"]), s["socket"],
                                   float(s["target_bytes"]), s.get("numa_node"),
                                   tuple((str(k), float(v)) for k, v in s.get("bytes_by_socket", ())))
                       for s in t["stores"])
        targets = PlanTargets(str(t["machine"]), tuple((str(g), s) for g, s in t["gpus"]), stores,
                              tuple((str(a), str(b)) for a, b in t.get("nvlink_pairs", ())), source,
                              tuple((str(g), float(v)) for g, v in t.get("inlet_bytes_per_s", ())))
        placed = from_dict(h["topology"], source=f"{source} (handoff.topology)")
        unknown = h.get("unknown_link_bytes_per_s")
        return PlanHandoff(str(data.get("machine", targets.machine)), str(data.get("model", "maxflow")), demand,
                           placed, targets, float(unknown) if unknown else None, source,
                           str(h.get("layout", "recommended")))
    except PlannerError as exc:
        raise PlanFileError(f"{source}: {exc}; {fix}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise PlanFileError(f"{source}: malformed ({type(exc).__name__}: {exc}); {fix}") from None
