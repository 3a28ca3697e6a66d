"""Flow models: how long the reads of one iteration take on a topology.

Given a :class:`~planner.topology.model.Topology` and a
:class:`~planner.workload.Workload`, each model finds the least time ``T``
(seconds per iteration) in which every consumer can receive its
``demand_bytes`` from the stores, no directed link carrying more than its
capacity × ``T`` and no store reading more than its own limit × ``T``.

Two models:

``maxflow`` (:func:`solve_maxflow`, the paper's §3.2)
    A virtual source feeds one node per sharded tier (capacity
    ``max_share × ΣD``), which feeds its stores (capacity the store's read
    limit × ``T``); the stores feed the interconnect, whose directed edges
    carry ``c(e) × T``; every consumer drains ``D_g`` into a virtual sink.
    A replicated tier feeds each consumer straight from its own store, at
    most ``max_share × D_g``. ``T`` is the least time for which the maximum
    flow reaches ``ΣD``: the paper's "time-bisection Ford–Fulkerson". This
    model lets each consumer take its bytes from whichever stores suit it.

``concurrent`` (:func:`solve_concurrent`, ours, stricter)
    Every row sits in one store of its tier and every consumer reads the
    same distribution: store ``s`` holds a share ``x_s`` of all accesses and
    consumer ``g`` draws ``x_s × D_g`` from it. A linear program over ``T``,
    the shares and one flow per consumer (a multi-commodity flow) minimises
    ``T``. It has every constraint of ``maxflow`` and more, so its ``T`` is
    never smaller.

What carries traffic: sockets, switches and slots forward anything; so does
a node of kind ``other`` with two or more neighbours (an NVSwitch fabric, a
bridge); a GPU forwards onto its NVLink links (``nvlink_relay=True``, as in
the paper's graph: a GPU can pass on what it fetched to an NVLink peer) but
never over PCIe; SSDs, NICs, memory nodes and GPUs otherwise only send what
they store. Every link kind (pcie, memory, inter-socket, nvlink) constrains
the flow.

Ties (several flows reaching the same ``T``) are broken the same way in
both models (``tie_break=True``, a second small LP at the optimal ``T``):
earlier tiers first (list tiers fastest first), then the least traffic
weighted by 1/capacity (local reads, no detours), then stores of a tier
loaded in proportion to what each can deliver; identical stores hanging
identically off the same node (SSDs under one switch) always get equal
traffic. The reported ``store_bytes`` are the traffic targets of the data
placement (DDAK). ``tie_break=False`` skips that LP: ``T`` and the
bottleneck are the same, the flows are whatever the solver found first. It
is several times faster, which suits ranking many candidate layouts; solve
the chosen one again with the tie-break for its targets.

Accuracy: ``T`` is exact to about 1e-9 (relative); a link or store carrying
a share ``q`` of all bytes has its traffic right to about ``1e-9/q``.

>>> from planner.topology.model import Link, Node, NodeKind, Topology
>>> from planner.workload import Consumer, Store, Tier, Workload
>>> topo = Topology("toy")
>>> for n in (Node("socket0", NodeKind.SOCKET), Node("gpu0", NodeKind.GPU),
...           Node("ssd0", NodeKind.NVME)):
...     _ = topo.add_node(n)
>>> _ = topo.add_link(Link.pcie("socket0", "gpu0", gen=4, lanes=16))
>>> _ = topo.add_link(Link.pcie("socket0", "ssd0", gen=4, lanes=4))
>>> w = Workload([Consumer("gpu0", 6e9)],
...              [Tier("ssd", [Store("ssd0", "ssd0", read_bytes_per_s=6e9)], 1.0)])
>>> r = solve(topo, w, model="concurrent")
>>> round(r.seconds_per_iteration, 3)  # the SSD's own 6 GB/s, not its 6.3 GB/s link
1.0
>>> r.saturated_stores, r.bottleneck
(['ssd0'], [])
>>> round(r.link_utilisation["ssd0", "socket0"], 2)
0.95
"""

from __future__ import annotations

import math
import warnings
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from scipy import sparse
from scipy.optimize import OptimizeWarning, linprog
from scipy.sparse.csgraph import maximum_flow

from planner.errors import PlannerError
from planner.topology.model import LinkKind, NodeKind, Topology
from planner.workload import Store, Tier, Workload

__all__ = ["MODELS", "FlowResult", "solve", "solve_concurrent", "solve_maxflow"]

MODELS = ("maxflow", "concurrent")

#: node kinds that forward any traffic between their links
_FORWARDING = frozenset({NodeKind.SOCKET, NodeKind.SWITCH, NodeKind.SLOT})

#: the integer max-flow works on capacities scaled so that ΣD = 2**29; larger
#: capacities are clipped to 2**30 (such an edge is never in a cut below ΣD)
_MF_SCALE = float(2**29)
_MF_CAP = 2**30

#: slack on T when the tie-breaking LP recomputes the flows at the optimum; a
#: link carrying a share q of the demand may then be off by slack/q of its capacity
_T_SLACK = 1e-9

#: weights of the tie-break's terms: the tier preference has weight ~1 per
#: share; traffic (summed over links, each divided by what the link can carry
#: in T) comes next; balance between a tier's stores only settles what is
#: otherwise a tie, yet stays well above HiGHS's optimality tolerance (1e-7)
_TRAFFIC_WEIGHT = 1e-2
_BALANCE_WEIGHT = 1e-5

#: share of the price of T (the duals, scaled, sum to 1) from which a
#: capacity constraint counts as binding
_DUAL_SHARE = 1e-6

#: HiGHS's feasibility tolerances (default 1e-7) are absolute; a link that
#: carries 0.1% of the demand would otherwise be off by 1e-4 of its capacity.
_SIMPLEX_OPTIONS = {
    "presolve": False,  # costs more than it saves on LPs this small
    "primal_feasibility_tolerance": 1e-10,
    "dual_feasibility_tolerance": 1e-10,
    "time_limit": 10.0,  # a safety net: these LPs take milliseconds
}
#: tight feasibility tolerances can make the interior-point method loop for
#: ever, so only its optimality tolerance is tightened, and its iterations
#: are capped (it needs 10–30); should it fail, the simplex takes over
_IPM_OPTIONS = {
    "run_crossover": "off",
    "presolve": False,  # presolve can leave duals on one of two symmetric links only
    "ipm_optimality_tolerance": 1e-10,
    "maxiter": 400,
    "time_limit": 10.0,
}

#: values below this (in units of ΣD) are reported as 0
_ZERO = 1e-10


@dataclass(frozen=True)
class FlowResult:
    """The answer of a flow model; bytes are per iteration.

    ``seconds_per_iteration`` is ``T``; ``inlet_bytes_per_s[g] = D_g / T``
    (infinite when ``T`` is 0: everything served locally). ``store_bytes``
    maps every store id to the bytes it serves (together ``ΣD``): the traffic
    targets of the data placement. ``tier_shares`` is the share of all
    accesses each tier serves. ``link_bytes`` has every directed edge
    ``(src, dst)`` of the topology (zero when unused); ``link_utilisation``
    is ``bytes / (capacity × T)`` for each edge whose capacity is known (or
    assumed). ``bottleneck`` lists the directed links that bind at the
    optimum (the min cut in ``maxflow``, the capacity constraints with a
    positive dual in ``concurrent``), by utilisation (highest first) then
    name; ``saturated_stores`` the stores whose own read limit binds.
    ``flows[(store_id, consumer_node_id)]`` is what each store sends each
    consumer (pairs with nothing are left out).
    """

    model: str
    seconds_per_iteration: float
    inlet_bytes_per_s: dict[str, float]
    store_bytes: dict[str, float]
    tier_shares: dict[str, float]
    link_bytes: dict[tuple[str, str], float]
    link_utilisation: dict[tuple[str, str], float]
    bottleneck: list[tuple[str, str]]
    flows: dict[tuple[str, str], float]
    saturated_stores: list[str] = field(default_factory=list)
    total_demand_bytes: float = 0.0

    @property
    def throughput_bytes_per_s(self) -> float:
        """All consumers together: ``ΣD / T``."""
        if self.seconds_per_iteration <= 0:
            return math.inf
        return self.total_demand_bytes / self.seconds_per_iteration


def solve(topo: Topology, workload: Workload, model: str = "maxflow", **options) -> FlowResult:
    """Solve ``workload`` on ``topo`` with the flow model named ``model``.

    ``options`` go to :func:`solve_maxflow` or :func:`solve_concurrent`.

    >>> solve(None, None, model="fastest")
    Traceback (most recent call last):
        ...
    planner.errors.PlannerError: unknown flow model 'fastest' (known: maxflow, concurrent)
    """
    if model == "maxflow":
        return solve_maxflow(topo, workload, **options)
    if model == "concurrent":
        return solve_concurrent(topo, workload, **options)
    raise PlannerError(f"unknown flow model {model!r} (known: {', '.join(MODELS)})")


# ---------------------------------------------------------------------------
# The network both models share
# ---------------------------------------------------------------------------


class _Net:
    """The topology as a flow network for one workload.

    Compiled nodes: one per topology node that is not a mere pass-through
    (``main``: receives traffic, forwards it when the node forwards,
    consumes it when it is a consumer), one ``out`` node per node hosting
    sharded stores (sends what they store over the links the node does not
    forward onto), and one ``supply`` node per sharded store. A chain of
    pass-through nodes (a slot, a socket with one device) becomes one edge
    per direction whose capacity is the least of its links'. Edges that can
    carry nothing (no store upstream, no consumer downstream, capacity 0)
    are dropped.

    Quantities are normalised: bytes by ``ΣD``, bytes/s by ``ref`` (what the
    consumers' inlets can take together), so that times are in units of
    ``tau = ΣD / ref`` seconds and every number the solvers see is near 1.
    """

    def __init__(
        self,
        topo: Topology,
        workload: Workload,
        unknown_link_bytes_per_s: float | None,
        nvlink_relay: bool,
    ) -> None:
        if not isinstance(topo, Topology):
            raise PlannerError(f"expected a Topology, got {type(topo).__name__}")
        if not isinstance(workload, Workload):
            raise PlannerError(f"expected a Workload, got {type(workload).__name__}")
        default = unknown_link_bytes_per_s
        if default is not None and not (
            isinstance(default, (int, float)) and not isinstance(default, bool)
            and math.isfinite(default) and default > 0
        ):
            raise PlannerError(f"unknown_link_bytes_per_s must be a positive number, got {default!r}")
        g = topo.graph
        self.topo = topo
        self.workload = workload
        self.tname = tname = topo.name or "unnamed"
        for c in workload.consumers:
            if c.node_id not in g:
                raise PlannerError(f"consumer {c.node_id!r} is not a node of topology {tname!r}")
        for t in workload.tiers:
            for s in t.stores:
                if s.node_id not in g:
                    raise PlannerError(
                        f"store {s.id!r} of tier {t.name!r} sits on node {s.node_id!r}, "
                        f"which is not in topology {tname!r}"
                    )
        self.consumers = list(workload.consumers)
        self.total = workload.total_demand_bytes
        self.d = [c.demand_bytes / self.total for c in self.consumers]
        cons_nodes = {c.node_id for c in self.consumers}

        # replicated tiers: each consumer reads its own store
        self.rep_tiers: list[Tier] = [t for t in workload.tiers if t.replicated]
        self.rep_store: list[list[Store]] = []
        for t in self.rep_tiers:
            by_node = {s.node_id: s for s in t.stores}
            missing = [c.node_id for c in self.consumers if c.node_id not in by_node]
            if missing:
                raise PlannerError(
                    f"replicated tier {t.name!r} has no store on consumer(s) {', '.join(missing)}; "
                    "each consumer reads a replicated tier from a store on its own node"
                )
            self.rep_store.append([by_node[c.node_id] for c in self.consumers])

        # sharded stores, tier by tier
        self.sh_tiers: list[Tier] = [t for t in workload.tiers if not t.replicated]
        self.sh_stores: list[Store] = [s for t in self.sh_tiers for s in t.stores]
        self.sh_tier_of: list[int] = [k for k, t in enumerate(self.sh_tiers) for _ in t.stores]
        hosts = list(dict.fromkeys(s.node_id for s in self.sh_stores))
        host_set = set(hosts)

        # capacities of the topology's directed edges (None: unknown)
        self.link_caps: dict[tuple[str, str], float] = {}
        raw: dict[tuple[str, str], float | None] = {}
        for u, v, data in g.edges(data=True):
            cap = data.get("bytes_per_s")
            if cap is not None:
                cap = float(cap)
                if math.isnan(cap) or cap < 0:
                    raise PlannerError(f"link {u} → {v} in topology {tname!r} has capacity {cap}")
            raw[u, v] = cap
            if cap is not None or default is not None:
                self.link_caps[u, v] = float(default) if cap is None else cap

        # which nodes forward, which are pass-through
        kinds = {n: data["node"].kind for n, data in g.nodes(data=True)}
        self.kinds = kinds
        nbrs = {n: list(dict.fromkeys([*g.successors(n), *g.predecessors(n)])) for n in g.nodes}
        self.nbrs = nbrs
        forwards = {
            n: k in _FORWARDING or (k == NodeKind.OTHER and len(nbrs[n]) >= 2) for n, k in kinds.items()
        }
        passthrough = {
            n for n in g.nodes
            if forwards[n] and len(nbrs[n]) == 2 and n not in host_set and n not in cons_nodes
        }

        names: list[str] = []

        def add(label: str) -> int:
            names.append(label)
            return len(names) - 1

        self.main = {n: add(n) for n in g.nodes if n not in passthrough}
        out = {n: add(f"{n}#out") for n in hosts}
        self.supply = [add(f"store:{s.id}") for s in self.sh_stores]
        self.cmain = [self.main[c.node_id] for c in self.consumers]
        self.names = names
        self.n_nodes = len(names)

        # edges: (tail, head, topology links along it, endpoints in the topology)
        tails: list[int] = []
        heads: list[int] = []
        chains: list[tuple[tuple[str, str], ...]] = []
        ends: list[tuple[str, str] | None] = []
        for s, sup in zip(self.sh_stores, self.supply, strict=True):
            tails.append(sup)
            heads.append(out[s.node_id])
            chains.append(())
            ends.append(None)
        for n in hosts:
            tails.append(out[n])
            heads.append(self.main[n])
            chains.append(())
            ends.append(None)
        for a in self.main:
            for n1 in nbrs[a]:
                if (a, n1) not in raw:
                    continue  # only an incoming edge
                kind = g.edges[a, n1].get("kind")
                if forwards[a] or (nvlink_relay and kinds[a] == NodeKind.GPU and kind == LinkKind.NVLINK):
                    tail = self.main[a]
                elif a in out:
                    tail = out[a]
                else:
                    continue
                chain = [(a, n1)]
                prev, cur = a, n1
                while cur in passthrough:
                    nxt = nbrs[cur][0] if nbrs[cur][1] == prev else nbrs[cur][1]
                    if (cur, nxt) not in raw:
                        chain = []
                        break
                    chain.append((cur, nxt))
                    prev, cur = cur, nxt
                    if len(chain) > len(nbrs):
                        chain = []  # a loop of pass-through nodes
                        break
                if not chain or cur == a:
                    continue
                tails.append(tail)
                heads.append(self.main[cur])
                chains.append(tuple(chain))
                ends.append((a, cur))

        # prune, then resolve capacities of what is left, then prune again
        keep = self._relevant(tails, heads, [True] * len(tails))
        caps: list[float] = []
        for i, chain in enumerate(chains):
            if not chain:
                caps.append(math.inf)
                continue
            cap = math.inf
            for lk in chain:
                c = raw[lk]
                if c is None:
                    if default is None:
                        if keep[i]:
                            kind = g.edges[lk].get("kind")
                            raise PlannerError(
                                f"link {lk[0]} → {lk[1]} ({kind}) in topology {tname!r} has no "
                                "known bandwidth; give the topology a figure for it or pass "
                                "unknown_link_bytes_per_s= to assume one"
                            )
                        c = 0.0
                    else:
                        c = float(default)
                cap = min(cap, c)
            caps.append(cap)
        keep = self._relevant(tails, heads, [k and c > 0 for k, c in zip(keep, caps, strict=True)])
        sel = [i for i, k in enumerate(keep) if k]
        self.tail = [tails[i] for i in sel]
        self.head = [heads[i] for i in sel]
        self.chain = [chains[i] for i in sel]
        self.ends = [ends[i] for i in sel]
        self.cap = [caps[i] for i in sel]  # bytes/s; inf for internal edges
        n_edges = len(sel)
        self.is_link = np.array([bool(ch) for ch in self.chain], dtype=bool)
        self.out_adj: list[list[int]] = [[] for _ in range(self.n_nodes)]
        self.in_adj: list[list[int]] = [[] for _ in range(self.n_nodes)]
        for i in range(n_edges):
            self.out_adj[self.tail[i]].append(i)
            self.in_adj[self.head[i]].append(i)

        # per consumer: the edges its flow may use. Across a bridge of the
        # topology (most links: PCIe is a tree) only the direction towards
        # the consumer is any use to it.
        self._adj = self._contracted()
        bridges = self._bridges()
        self.edges_of: list[np.ndarray] = []
        self.reach: list[list[bool]] = []
        for m in self.cmain:
            back = self._reach_back(m)
            dist = self._hops(names[m])
            use = []
            for i in range(n_edges):
                if self.head[i] not in back:
                    continue
                e = self.ends[i]
                if (
                    e is not None
                    and self._undirected(self.chain[i]) in bridges
                    and dist.get(e[1], math.inf) >= dist.get(e[0], math.inf)
                ):
                    continue
                use.append(i)
            self.edges_of.append(np.array(use, dtype=np.int64))
            self.reach.append([sup in back for sup in self.supply])

        # what each sharded store can deliver on its own: its read limit, or
        # the links leaving its node (weights for balancing a tier's stores)
        self.rate: list[float] = []
        for st in self.sh_stores:
            links_out = sum(self.link_caps.get((st.node_id, v), 0.0) for v in nbrs[st.node_id])
            r = min(st.read_bytes_per_s or math.inf, links_out or math.inf)
            self.rate.append(r if math.isfinite(r) and r > 0 else 1.0)
        if not all(self.rate):  # pragma: no cover - rates are positive
            self.rate = [1.0] * len(self.sh_stores)

        # normalisation
        inlet = sum(self.cap[i] for i in range(n_edges) if self.is_link[i] and self.head[i] in self.cmain)
        if not (inlet > 0 and math.isfinite(inlet)):
            inlet = self.total  # nothing crosses a link: T is about local reads only
        self.ref = inlet
        self.tau = self.total / inlet
        self.c = np.array([c / inlet if self.is_link[i] else math.inf for i, c in enumerate(self.cap)])
        self.tail_arr = np.array(self.tail, dtype=np.int64)
        self.head_arr = np.array(self.head, dtype=np.int64)

    # -- graph helpers ---------------------------------------------------
    def _relevant(self, tails: list[int], heads: list[int], ok: list[bool]) -> list[bool]:
        """Edges that some store can feed and that lead to some consumer."""
        fwd_adj: list[list[int]] = [[] for _ in range(self.n_nodes)]
        bwd_adj: list[list[int]] = [[] for _ in range(self.n_nodes)]
        for a, b, o in zip(tails, heads, ok, strict=True):
            if o:
                fwd_adj[a].append(b)
                bwd_adj[b].append(a)
        fwd = _reach(self.supply, fwd_adj)
        bwd = _reach(self.cmain, bwd_adj)
        return [o and a in fwd and b in bwd for a, b, o in zip(tails, heads, ok, strict=True)]

    def _reach_back(self, node: int) -> set[int]:
        seen = {node}
        todo = [node]
        while todo:
            x = todo.pop()
            for i in self.in_adj[x]:
                y = self.tail[i]
                if y not in seen:
                    seen.add(y)
                    todo.append(y)
        return seen

    @staticmethod
    def _undirected(chain: tuple[tuple[str, str], ...]) -> frozenset:
        return frozenset(frozenset(lk) for lk in chain)

    def _contracted(self) -> dict[str, list[tuple[str, frozenset]]]:
        """The topology with pass-through chains as single undirected edges."""
        adj: dict[str, list[tuple[str, frozenset]]] = {}
        seen: set[frozenset] = set()
        for i, e in enumerate(self.ends):
            if e is None:
                continue
            key = self._undirected(self.chain[i])
            if key in seen:
                continue
            seen.add(key)
            adj.setdefault(e[0], []).append((e[1], key))
            adj.setdefault(e[1], []).append((e[0], key))
        return adj

    def _hops(self, start: str) -> dict[str, int]:
        adj = self._adj
        dist = {start: 0}
        todo = deque([start])
        while todo:
            x = todo.popleft()
            for y, _ in adj.get(x, ()):
                if y not in dist:
                    dist[y] = dist[x] + 1
                    todo.append(y)
        return dist

    def _bridges(self) -> set[frozenset]:
        """Undirected chains whose removal disconnects the topology (Tarjan, iterative)."""
        adj = self._adj
        disc: dict[str, int] = {}
        low: dict[str, int] = {}
        out: set[frozenset] = set()
        counter = 0
        for root in adj:
            if root in disc:
                continue
            disc[root] = low[root] = counter
            counter += 1
            stack = [(root, None, iter(adj[root]))]
            while stack:
                node, via, it = stack[-1]
                advanced = False
                for nb, key in it:
                    if key == via:
                        continue
                    if nb in disc:
                        low[node] = min(low[node], disc[nb])
                    else:
                        disc[nb] = low[nb] = counter
                        counter += 1
                        stack.append((nb, key, iter(adj[nb])))
                        advanced = True
                        break
                if advanced:
                    continue
                stack.pop()
                if stack:
                    parent = stack[-1][0]
                    low[parent] = min(low[parent], low[node])
                    if low[node] > disc[parent]:
                        out.add(via)
        return out

    def time_lower_bound(self) -> float:
        """A quick lower bound on the normalised T (0 if none), to scale the LPs.

        Each consumer must take what its replicated tiers cannot hold through
        its inlet links, and what they do hold at their read limits.
        """
        inlet = [0.0] * len(self.consumers)
        where = {m: gi for gi, m in enumerate(self.cmain)}
        for i, h in enumerate(self.head):
            if self.is_link[i] and h in where:
                inlet[where[h]] += float(self.c[i])
        best = 0.0
        for gi in range(len(self.consumers)):
            local_share = sum(t.max_share for t in self.rep_tiers)
            local_rate = sum(
                (s[gi].read_bytes_per_s or math.inf) / self.ref for s in self.rep_store
            )
            if inlet[gi] > 0:
                best = max(best, self.d[gi] * max(0.0, 1.0 - local_share) / inlet[gi])
            if math.isfinite(local_rate) and inlet[gi] + local_rate > 0:
                best = max(best, self.d[gi] / (inlet[gi] + local_rate))
        return best

    # -- diagnostics ---------------------------------------------------
    def check_reachable(self, model: str) -> None:
        """Raise a PlannerError naming what cannot be served, however long T."""
        rep_share = sum(t.max_share for t in self.rep_tiers)
        problems: list[str] = []
        for gi, c in enumerate(self.consumers):
            reached = {self.sh_tier_of[j] for j, ok in enumerate(self.reach[gi]) if ok}
            share = rep_share + sum(self.sh_tiers[k].max_share for k in reached)
            if share >= 1.0 - 1e-9:
                continue
            unreached = [t.name for k, t in enumerate(self.sh_tiers) if k not in reached]
            if not reached and rep_share == 0:
                problems.append(
                    f"consumer {c.node_id!r} has no path from any store in topology "
                    f"{self.tname!r} (check that its links exist and have a non-zero capacity)"
                )
            else:
                problems.append(
                    f"consumer {c.node_id!r} reaches no store of tier(s) {', '.join(unreached)}; "
                    f"the tiers it reaches absorb at most {share:.0%} of its accesses"
                )
        if problems:
            raise PlannerError("the workload cannot be served: " + "; ".join(problems))
        if model == "concurrent":
            everyone = [all(r[j] for r in self.reach) for j in range(len(self.sh_stores))]
            usable = {self.sh_tier_of[j] for j, ok in enumerate(everyone) if ok}
            share = rep_share + sum(self.sh_tiers[k].max_share for k in usable)
            if share < 1.0 - 1e-9:
                lacking = [t.name for k, t in enumerate(self.sh_tiers) if k not in usable]
                raise PlannerError(
                    "the workload cannot be served in the concurrent model, where every consumer "
                    f"reads every store of a sharded tier: no store of tier(s) {', '.join(lacking)} "
                    f"is reachable from all consumers, and the rest absorb at most {share:.0%} "
                    "of the accesses (the maxflow model lets each consumer pick its stores)"
                )


def _reach(start: list[int], adj: list[list[int]]) -> set[int]:
    seen = set(start)
    todo = list(start)
    while todo:
        x = todo.pop()
        for y in adj[x]:
            if y not in seen:
                seen.add(y)
                todo.append(y)
    return seen


# ---------------------------------------------------------------------------
# maxflow: time-bisection max-flow, accelerated by cut (Newton) steps
# ---------------------------------------------------------------------------


class _MaxflowNet:
    """The s–t network of the paper, each capacity ``a + b·T`` or infinite."""

    def __init__(self, net: _Net) -> None:
        n0 = net.n_nodes
        k_sh = len(net.sh_tiers)
        n_cons = len(net.consumers)
        self.s, self.t = n0, n0 + 1
        tier_node = [n0 + 2 + k for k in range(k_sh)]
        self.sink_node = [n0 + 2 + k_sh + i for i in range(n_cons)]
        self.rep_node = [
            [n0 + 2 + k_sh + n_cons * (1 + r) + i for i in range(n_cons)]
            for r in range(len(net.rep_tiers))
        ]
        self.n = n0 + 2 + k_sh + n_cons * (1 + len(net.rep_tiers))
        tail: list[int] = []
        head: list[int] = []
        a: list[float] = []
        b: list[float] = []
        inf: list[bool] = []
        self.net_edge: list[int] = []  # index of the _Net edge, -1 for virtual edges
        self.read_store: list[str | None] = []  # the store whose read limit this edge is

        def edge(u: int, v: int, aa: float, bb: float, is_inf: bool, ne: int = -1,
                 st: str | None = None):
            tail.append(u)
            head.append(v)
            a.append(aa)
            b.append(bb)
            inf.append(is_inf)
            self.net_edge.append(ne)
            self.read_store.append(st)

        for k, t in enumerate(net.sh_tiers):
            edge(self.s, tier_node[k], t.max_share, 0.0, False)
        self.store_edge = []
        for j, st in enumerate(net.sh_stores):
            self.store_edge.append(len(tail))
            if st.read_bytes_per_s is None:
                edge(tier_node[net.sh_tier_of[j]], net.supply[j], 0.0, 0.0, True)
            else:
                edge(tier_node[net.sh_tier_of[j]], net.supply[j], 0.0,
                     st.read_bytes_per_s / net.ref, False, st=st.id)
        self.first_net_edge = len(tail)
        for i in range(len(net.tail)):
            if net.is_link[i]:
                edge(net.tail[i], net.head[i], 0.0, float(net.c[i]), False, ne=i)
            else:
                edge(net.tail[i], net.head[i], 0.0, 0.0, True, ne=i)
        for gi, m in enumerate(net.cmain):
            edge(m, self.sink_node[gi], 0.0, 0.0, True)
            edge(self.sink_node[gi], self.t, net.d[gi], 0.0, False)
        self.rep_edge: list[list[int]] = []
        for r, t in enumerate(net.rep_tiers):
            row = []
            for gi in range(n_cons):
                row.append(len(tail))
                edge(self.s, self.rep_node[r][gi], t.max_share * net.d[gi], 0.0, False)
                st = net.rep_store[r][gi]
                if st.read_bytes_per_s is None:
                    edge(self.rep_node[r][gi], self.sink_node[gi], 0.0, 0.0, True)
                else:
                    edge(self.rep_node[r][gi], self.sink_node[gi], 0.0,
                         st.read_bytes_per_s / net.ref, False, st=st.id)
            self.rep_edge.append(row)
        self.tail = np.array(tail, dtype=np.int64)
        self.head = np.array(head, dtype=np.int64)
        self.a = np.array(a)
        self.b = np.array(b)
        self.inf = np.array(inf, dtype=bool)
        # CSR layout, fixed for every T; parallel edges (two chains between the
        # same nodes) share one entry holding their summed capacity
        key = self.tail * self.n + self.head
        uniq, self.slot = np.unique(key, return_inverse=True)
        self.n_slots = len(uniq)
        self.indices = (uniq % self.n).astype(np.int32)
        self.indptr = np.searchsorted(uniq // self.n, np.arange(self.n + 1)).astype(np.int32)
        self.slot_tail = (uniq // self.n).astype(np.int64)
        self.slot_head = (uniq % self.n).astype(np.int64)
        self.demand_int = int(sum(math.floor(x * _MF_SCALE) for x in net.d))
        self.last_flow: np.ndarray | None = None

    def caps(self, T: float) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            v = (self.a + self.b * T) * _MF_SCALE
        return np.where(self.inf, float(_MF_CAP), np.minimum(v, float(_MF_CAP)))

    def run(self, T: float) -> tuple[bool, np.ndarray]:
        """(demand met?, source side of a min cut) at normalised time ``T``."""
        cap = self.caps(T)
        slot_cap = np.minimum(np.floor(np.bincount(self.slot, cap, self.n_slots)), _MF_CAP)
        slot_cap = slot_cap.astype(np.int32)
        graph = sparse.csr_array((slot_cap, self.indices, self.indptr), shape=(self.n, self.n))
        res = maximum_flow(graph, self.s, self.t)
        flow = res.flow.toarray()
        f = flow[self.slot_tail, self.slot_head]
        if res.flow_value >= self.demand_int - self.n_slots:
            # split each slot's flow over its parallel edges in proportion to capacity
            share = np.divide(cap, np.bincount(self.slot, cap, self.n_slots)[self.slot],
                              out=np.zeros_like(cap), where=cap > 0)
            self.last_flow = np.maximum(f[self.slot], 0) * share / _MF_SCALE
            return True, np.zeros(self.n, dtype=bool)
        fwd = slot_cap - f > 0
        bwd = f > 0
        adj: list[list[int]] = [[] for _ in range(self.n)]
        for u, v in zip(self.slot_tail[fwd].tolist(), self.slot_head[fwd].tolist(), strict=True):
            adj[u].append(v)
        for u, v in zip(self.slot_tail[bwd].tolist(), self.slot_head[bwd].tolist(), strict=True):
            adj[v].append(u)
        side = np.zeros(self.n, dtype=bool)
        side[self.s] = True
        todo = [self.s]
        while todo:
            x = todo.pop()
            for y in adj[x]:
                if not side[y]:
                    side[y] = True
                    todo.append(y)
        return False, side

    def cut_line(self, side: np.ndarray) -> tuple[float, float, bool, np.ndarray]:
        """The cut's capacity as ``a + b·T``, whether it has an infinite edge, its edges."""
        crossing = side[self.tail] & ~side[self.head]
        finite = crossing & ~self.inf
        return (
            float(self.a[finite].sum()),
            float(self.b[finite].sum()),
            bool((crossing & self.inf).any()),
            crossing,
        )


def _min_time(mf: _MaxflowNet, net: _Net, rel_tol: float) -> tuple[float, np.ndarray | None]:
    """Least normalised T at which the max flow meets the demand, and the binding cut.

    Each step runs a max-flow at ``T``, a lower bound starting at 0. If the
    demand is not met, the min cut ``C`` (capacity ``a_C + b_C·T``) cannot
    carry ``ΣD`` before ``T' = (ΣD − a_C)/b_C``, a better lower bound and
    the next step. The max flow is a concave piecewise-linear function of
    ``T``, so these steps land exactly on the optimum after a few cuts (2–4
    on real machines); should rounding stall them, plain bisection takes over
    until the bracket is within ``rel_tol`` of ``T``. Demands count as met
    within (number of edges)/2**29 of ``ΣD`` (the integer max-flow works on
    capacities scaled so that ΣD = 2**29).
    """
    T = 0.0
    cut = None
    for _ in range(64):
        ok, side = mf.run(T)
        if ok:
            return T, cut
        a, b, has_inf, crossing = mf.cut_line(side)
        if not has_inf and a + b * T >= 1.0 - 1e-9:
            # the cut only looked short through rounding: it is tight at T
            _settle(mf, T)
            return T, crossing
        if b <= 0 or has_inf:
            net.check_reachable("maxflow")
            raise PlannerError(
                "the workload cannot be served: the tiers the consumers reach cannot cover "
                "all of their demand at once, however long an iteration takes"
            )
        nxt = (1.0 - a) / b
        cut = crossing
        if nxt <= T * (1 + 1e-12):
            break
        T = nxt
    lo = T
    hi = max(lo * 2, 1e-9)
    while not mf.run(hi)[0]:
        lo, hi = hi, hi * 2
        if hi > 1e15:  # pragma: no cover - the cut steps rule this out
            raise PlannerError("the workload cannot be served: no time is long enough")
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        ok, side = mf.run(mid)
        if ok:
            hi = mid
        else:
            lo = mid
            cut = mf.cut_line(side)[3]
    _settle(mf, hi)
    return hi, cut


def _settle(mf: _MaxflowNet, T: float) -> None:
    """Leave in ``mf.last_flow`` a flow meeting the demand at (a hair above) ``T``."""
    for bump in (0.0, 1e-9, 1e-7, 1e-5):
        if mf.run(T * (1 + bump) + bump * 1e-12)[0]:
            return


def solve_maxflow(
    topo: Topology,
    workload: Workload,
    *,
    rel_tol: float = 1e-4,
    unknown_link_bytes_per_s: float | None = None,
    nvlink_relay: bool = True,
    tie_break: bool = True,
) -> FlowResult:
    """The paper's model: least ``T`` at which a max flow meets every demand.

    ``T`` is found by time bisection over max-flows (SciPy's Dinic on
    integer capacities), each step jumping to the time the current min cut
    needs; this ends on the exact optimum after a few max-flows, and
    ``rel_tol`` bounds the bracket of the plain bisection that takes over
    should those steps stall. The bottleneck is the min cut at the optimum.
    With ``tie_break`` the flows are then recomputed at that ``T`` by a
    small linear program that prefers early tiers and short paths (see the
    module docstring); without it they are the integer max-flow's own (each
    edge right to about 2e-9 of ``ΣD``), several times faster, with the same
    ``T`` and bottleneck.

    ``unknown_link_bytes_per_s`` is the capacity assumed for links whose
    ``bytes_per_s`` is ``None``; without it such a link, if it could carry
    traffic, is an error. Links of capacity 0 carry nothing.
    ``nvlink_relay`` lets a GPU pass on over NVLink what it received.

    >>> from planner.topology.model import Link, Node, NodeKind, Topology
    >>> from planner.workload import Consumer, Store, Tier, Workload
    >>> topo = Topology("two-gpus")
    >>> for n in (Node("socket0", NodeKind.SOCKET), Node("sw", NodeKind.SWITCH),
    ...           Node("gpu0", NodeKind.GPU), Node("gpu1", NodeKind.GPU),
    ...           Node("ssd0", NodeKind.NVME), Node("ssd1", NodeKind.NVME)):
    ...     _ = topo.add_node(n)
    >>> for a, b, lanes in (("socket0", "sw", 4), ("sw", "gpu0", 16), ("sw", "gpu1", 16),
    ...                     ("socket0", "ssd0", 4), ("socket0", "ssd1", 4)):
    ...     _ = topo.add_link(Link.pcie(a, b, gen=4, lanes=lanes))
    >>> ssd = Tier("ssd", [Store("ssd0", "ssd0"), Store("ssd1", "ssd1")], 1.0)
    >>> r = solve_maxflow(topo, Workload([Consumer("gpu0", 3e9), Consumer("gpu1", 3e9)], [ssd]))
    >>> r.bottleneck  # the switch's x4 uplink
    [('socket0', 'sw')]
    >>> round(r.seconds_per_iteration, 4)  # 6 GB through 16 GT/s × 4 × 128/130 / 8 × 0.8
    0.9521
    >>> r.store_bytes == {"ssd0": 3e9, "ssd1": 3e9}
    True
    """
    if isinstance(rel_tol, bool) or not (isinstance(rel_tol, (int, float)) and 0 < rel_tol < 1):
        raise PlannerError(f"rel_tol must be in (0, 1), got {rel_tol!r}")
    net = _Net(topo, workload, unknown_link_bytes_per_s, nvlink_relay)
    net.check_reachable("maxflow")
    mf = _MaxflowNet(net)
    T, cut = _min_time(mf, net, rel_tol)
    links: list[int] = []
    stores: list[str] = []
    if cut is not None:
        for i in np.flatnonzero(cut):
            if mf.net_edge[i] >= 0 and net.is_link[mf.net_edge[i]]:
                links.append(mf.net_edge[i])
            elif mf.read_store[i] is not None:
                stores.append(mf.read_store[i])
    if tie_break:
        lp = _LP(net, "maxflow", t_unit=T)
        sol = lp.tie_break(T, _T_SLACK)
        x, rep, flow = lp.unpack(sol)
    else:
        f = mf.last_flow if mf.last_flow is not None else np.zeros(len(mf.tail))
        x = f[mf.store_edge]
        rep = [[f[i] for i in row] for row in mf.rep_edge]
        flow = [f[mf.first_net_edge: mf.first_net_edge + len(net.tail)]]
    return _result(net, "maxflow", T, x, rep, flow, links, stores)


# ---------------------------------------------------------------------------
# The linear programs
# ---------------------------------------------------------------------------


class _LP:
    """The LP over (T, shares, flows) of either model, built once.

    Variables (normalised): ``T``; ``x_j`` the share of all accesses served
    by sharded store ``j``; for replicated tiers either ``y_r`` (concurrent:
    the share every consumer reads locally) or ``z_rg`` (maxflow: the share
    of ΣD consumer ``g`` reads locally); flows, one per edge (maxflow) or
    one per consumer and usable edge (concurrent).
    """

    def __init__(self, net: _Net, model: str, t_unit: float = 1.0) -> None:
        # the T variable counts units of t_unit (normalised time), chosen
        # near the answer so that every coefficient of the LP stays near 1
        self.net = net
        self.model = model
        self.t_unit = t_unit = t_unit if t_unit > 0 and math.isfinite(t_unit) else 1.0
        n_sh = len(net.sh_stores)
        n_rep = len(net.rep_tiers)
        n_cons = len(net.consumers)
        conc = model == "concurrent"
        self.col_x = 1
        self.col_rep = 1 + n_sh
        self.col_f = self.col_rep + (n_rep if conc else n_rep * n_cons)
        if conc:
            self.commodities = [(gi, net.edges_of[gi]) for gi in range(n_cons)]
        else:
            self.commodities = [(-1, np.arange(len(net.tail), dtype=np.int64))]
        self.f_cols: list[np.ndarray] = []
        col = self.col_f
        for _, edges in self.commodities:
            self.f_cols.append(np.arange(col, col + len(edges)))
            col += len(edges)
        self.n_vars = col
        d = net.d
        supply = np.array(net.supply, dtype=np.int64)

        er: list[np.ndarray] = []
        ec: list[np.ndarray] = []
        ev: list[np.ndarray] = []
        b_eq: list[np.ndarray] = []
        row = 0
        for (gi, edges), cols in zip(self.commodities, self.f_cols, strict=True):
            # conservation, one row per node: in − out + supply = consumption
            mains = np.array(net.cmain if gi < 0 else [net.cmain[gi]], dtype=np.int64)
            touched = np.unique(np.concatenate(
                [net.tail_arr[edges], net.head_arr[edges], supply, mains]))
            rows_of = np.full(net.n_nodes, -1, dtype=np.int64)
            rows_of[touched] = np.arange(row, row + len(touched))
            er += [rows_of[net.head_arr[edges]], rows_of[net.tail_arr[edges]]]
            ec += [cols, cols]
            ev += [np.ones(len(edges)), -np.ones(len(edges))]
            er.append(rows_of[supply])
            ec.append(np.arange(self.col_x, self.col_x + n_sh))
            ev.append(np.full(n_sh, 1.0 if gi < 0 else d[gi]))
            rhs = np.zeros(len(touched))
            if gi < 0:
                for g2, m in enumerate(net.cmain):
                    rhs[rows_of[m] - row] = d[g2]
                    er.append(np.full(n_rep, rows_of[m]))
                    ec.append(self.col_rep + np.arange(n_rep) * n_cons + g2)
                    ev.append(np.ones(n_rep))
            else:
                er.append(np.full(n_sh, rows_of[net.cmain[gi]]))
                ec.append(np.arange(self.col_x, self.col_x + n_sh))
                ev.append(np.full(n_sh, -d[gi]))
            b_eq.append(rhs)
            row += len(touched)
        if conc:  # the shares cover every access
            er.append(np.full(n_sh + n_rep, row))
            ec.append(np.arange(self.col_x, self.col_f))
            ev.append(np.ones(n_sh + n_rep))
            b_eq.append(np.ones(1))
            row += 1
        self.A_eq = _matrix(er, ec, ev, row, self.n_vars)
        self.b_eq = np.concatenate(b_eq)

        ur: list[np.ndarray] = []
        uc: list[np.ndarray] = []
        uv: list[np.ndarray] = []
        b_ub: list[float] = []
        # link capacities: Σ flows − c·T ≤ 0
        self.link_edges = np.flatnonzero(net.is_link)
        row_of_edge = np.full(len(net.tail), -1, dtype=np.int64)
        row_of_edge[self.link_edges] = np.arange(len(self.link_edges))
        for (_, edges), cols in zip(self.commodities, self.f_cols, strict=True):
            m = net.is_link[edges]
            ur.append(row_of_edge[edges[m]])
            uc.append(cols[m])
            uv.append(np.ones(int(m.sum())))
        ur.append(np.arange(len(self.link_edges)))
        uc.append(np.zeros(len(self.link_edges), dtype=np.int64))
        uv.append(-net.c[self.link_edges] * t_unit)
        self.link_coef = net.c[self.link_edges] * t_unit
        row = len(self.link_edges)
        b_ub += [0.0] * row
        # read limits of sharded stores: x_j − r_j·T ≤ 0
        self.read_rows: list[tuple[int, str, float]] = []  # (row, store id, T's coefficient)
        for j, st in enumerate(net.sh_stores):
            if st.read_bytes_per_s is not None:
                r = st.read_bytes_per_s / net.ref * t_unit
                ur.append(np.array([row, row]))
                uc.append(np.array([self.col_x + j, 0]))
                uv.append(np.array([1.0, -r]))
                b_ub.append(0.0)
                self.read_rows.append((row, st.id, r))
                row += 1
        # read limits of replicated stores
        for rr in range(n_rep):
            for g2 in range(n_cons):
                st = net.rep_store[rr][g2]
                if st.read_bytes_per_s is None:
                    continue
                col, coef = (self.col_rep + rr, d[g2]) if conc else (self.col_rep + rr * n_cons + g2, 1.0)
                ur.append(np.array([row, row]))
                uc.append(np.array([col, 0]))
                r = st.read_bytes_per_s / net.ref * t_unit
                uv.append(np.array([coef, -r]))
                b_ub.append(0.0)
                self.read_rows.append((row, st.id, r))
                row += 1
        # what each sharded tier can absorb
        for k, t in enumerate(net.sh_tiers):
            cols = [self.col_x + j for j in range(n_sh) if net.sh_tier_of[j] == k]
            ur.append(np.full(len(cols), row))
            uc.append(np.array(cols, dtype=np.int64))
            uv.append(np.ones(len(cols)))
            b_ub.append(t.max_share)
            row += 1
        self.A_ub = _matrix(ur, uc, uv, row, self.n_vars)
        self.b_ub = np.array(b_ub)
        self._ub = (ur, uc, uv, row)

        self.lo = np.zeros(self.n_vars)
        self.hi = np.full(self.n_vars, np.inf)
        for j in range(n_sh):
            # concurrent: a store that some consumer cannot reach holds nothing
            reached = [r[j] for r in net.reach]
            if not (all(reached) if conc else any(reached)):
                self.hi[self.col_x + j] = 0.0
        for rr, t in enumerate(net.rep_tiers):
            if conc:
                self.hi[self.col_rep + rr] = t.max_share
            else:
                for g2 in range(n_cons):
                    self.hi[self.col_rep + rr * n_cons + g2] = t.max_share * d[g2]

    def _run(self, c: np.ndarray, t_hi: float, interior: bool = False, extra=None):
        hi = self.hi.copy()
        hi[0] = t_hi
        lo = self.lo
        A_ub, b_ub, A_eq = self.A_ub, self.b_ub, self.A_eq
        if extra is not None:
            A_ub, b_ub, n_extra = extra
            n = self.n_vars + n_extra
            A_eq = sparse.csr_array((A_eq.data, A_eq.indices, A_eq.indptr), shape=(A_eq.shape[0], n))
            lo = np.concatenate([lo, np.zeros(n_extra)])
            hi = np.concatenate([hi, np.full(n_extra, np.inf)])
        if interior:
            # an interior-point solution without crossover: its duals are
            # strictly complementary, positive on every constraint that binds
            # in all optimal solutions (not just on one per symmetric group)
            kw = {"method": "highs-ipm", "options": _IPM_OPTIONS}
        else:
            kw = {"method": "highs-ds", "options": _SIMPLEX_OPTIONS}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OptimizeWarning)
            return linprog(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=self.b_eq,
                           bounds=np.column_stack([lo, hi]), **kw)

    def min_time(self) -> tuple[float, np.ndarray, list[int], list[str]]:
        """Least T, the solution, the binding link edges, the stores whose read limit binds."""
        c = np.zeros(self.n_vars)
        c[0] = 1.0
        res = self._run(c, np.inf, interior=True)
        if res.status != 0 or res.ineqlin is None or res.x[0] < 1e-7:
            # the interior point stops short of T = 0 (everything read locally):
            # the simplex lands on it exactly
            res = self._run(c, np.inf)
        if res.status != 0:
            self.net.check_reachable(self.model)
            raise PlannerError(f"the flow LP failed: {res.message}")
        # dual × T's coefficient: the share of T's price each constraint bears
        # (they sum to 1)
        lam = -np.asarray(res.ineqlin.marginals)
        share = lam[: len(self.link_edges)] * self.link_coef
        links = [int(e) for e, sh in zip(self.link_edges, share, strict=True) if sh > _DUAL_SHARE]
        stores = [sid for r, sid, coef in self.read_rows if lam[r] * coef > _DUAL_SHARE]
        return float(res.x[0]) * self.t_unit, np.asarray(res.x), links, stores

    def tie_break(self, T: float, slack: float) -> np.ndarray:
        """A solution at time ≤ T·(1+slack): early tiers, little traffic, balanced stores.

        The objective weighs, in decreasing order of importance: the share of
        each tier (earlier tiers first), the traffic on every link divided by
        what the link can carry in ``T`` (local reads, no detours), and how
        far each store's share exceeds its part of its tier in proportion to
        the rate it can deliver (``p_s ≥ x_s − w_s·Σ_tier x``, minimised), and
        the least served store (``m ≤ x_s / w_s``, maximised).
        """
        net = self.net
        c = np.zeros(self.n_vars)
        n_tiers = len(net.workload.tiers)
        rank = {t.name: i for i, t in enumerate(net.workload.tiers)}
        for j in range(len(net.sh_stores)):
            c[self.col_x + j] = -(n_tiers - rank[net.sh_tiers[net.sh_tier_of[j]].name]) / n_tiers
        n_cons = len(net.consumers)
        for rr, t in enumerate(net.rep_tiers):
            pref = -(n_tiers - rank[t.name]) / n_tiers
            if self.model == "concurrent":
                c[self.col_rep + rr] = pref
            else:
                c[self.col_rep + rr * n_cons: self.col_rep + (rr + 1) * n_cons] = pref
        n_links = max(1, len(self.link_edges))
        room = np.maximum(np.where(net.is_link, net.c * max(T, 1e-12), 1.0), 1e-6)
        weight = np.where(net.is_link, _TRAFFIC_WEIGHT / n_links / room, 0.0)
        for (_, edges), cols in zip(self.commodities, self.f_cols, strict=True):
            c[cols] = weight[edges]
        # balance: p_s ≥ x_s − w_s·Σ_{s' in tier} x_s'
        ur, uc, uv, row = self._ub
        ur, uc, uv = list(ur), list(uc), list(uv)
        n_p = 0
        extra_c: list[float] = []
        for k in range(len(net.sh_tiers)):
            members = [
                j for j in range(len(net.sh_stores))
                if net.sh_tier_of[j] == k and self.hi[self.col_x + j] > 0
            ]
            if len(members) < 2:
                continue
            w = np.array([net.rate[j] for j in members])
            w = w / w.sum()
            cols = self.col_x + np.array(members)
            for j in members:  # p_j ≥ x_j − w_j·Σx: excess over the proportional part
                ur += [np.full(len(members) + 2, row)]
                uc += [np.concatenate([cols, [self.col_x + j, self.n_vars + n_p]])]
                uv += [np.concatenate([-w, [1.0, -1.0]])]
                row += 1
                n_p += 1
                extra_c.append(_BALANCE_WEIGHT)
            # m ≤ x_j / w_j for every member: raise the least-served store
            ur += [np.arange(row, row + len(members))] * 2
            uc += [cols, np.full(len(members), self.n_vars + n_p)]
            uv += [-np.ones(len(members)), w]
            row += len(members)
            n_p += 1
            extra_c.append(-_BALANCE_WEIGHT)
        extra = None
        if n_p:
            A_ub = _matrix(ur, uc, uv, row, self.n_vars + n_p)
            extra = (A_ub, np.concatenate([self.b_ub, np.zeros(row - len(self.b_ub))]), n_p)
            c = np.concatenate([c, extra_c])
        res = None
        for s in (slack, 1e-7, 1e-5, 1e-3):
            res = self._run(c, T / self.t_unit * (1 + s) + 1e-12, extra=extra)
            if res.status == 0:
                return np.asarray(res.x)[: self.n_vars]
        raise PlannerError(f"the flow LP failed at the optimal time: {res.message}")  # pragma: no cover

    def unpack(self, sol: np.ndarray) -> tuple[np.ndarray, list[list[float]], list[np.ndarray]]:
        """(x per sharded store, replicated share [tier][consumer] of ΣD, flows per commodity)."""
        net = self.net
        n_sh = len(net.sh_stores)
        n_cons = len(net.consumers)
        x = sol[self.col_x: self.col_x + n_sh]
        rep = []
        for rr in range(len(net.rep_tiers)):
            if self.model == "concurrent":
                rep.append([sol[self.col_rep + rr] * net.d[g2] for g2 in range(n_cons)])
            else:
                rep.append([sol[self.col_rep + rr * n_cons + g2] for g2 in range(n_cons)])
        return x, rep, [sol[cols] for cols in self.f_cols]


def _matrix(rows, cols, vals, n_rows: int, n_cols: int) -> sparse.csr_array:
    return sparse.csr_array(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n_rows, n_cols)
    )


def solve_concurrent(
    topo: Topology,
    workload: Workload,
    *,
    unknown_link_bytes_per_s: float | None = None,
    nvlink_relay: bool = True,
    tie_break: bool = True,
) -> FlowResult:
    """Our stricter model: every consumer reads every store in proportion.

    A linear program (HiGHS through :func:`scipy.optimize.linprog`) over
    ``T``, the share ``x_s`` of all accesses each sharded store serves (at
    most ``max_share`` per tier), the share ``y`` of each replicated tier,
    and one flow per consumer ``g`` that carries ``x_s × D_g`` from every
    store ``s`` to ``g``; the flows of all consumers share each link's
    ``c(e) × T`` and each store's read limit × ``T``. Minimise ``T``. The
    bottleneck is the links whose capacity constraint has a positive dual
    in a strictly complementary solution (an interior point one), i.e. the
    links that are full in every optimal solution. With ``tie_break`` a
    second LP at that ``T`` picks the flows (see the module docstring).
    Other options as for :func:`solve_maxflow`.

    >>> from planner.topology.model import Link, LinkKind, Node, NodeKind, Topology
    >>> from planner.workload import Consumer, Store, Tier, Workload
    >>> topo = Topology("two-sockets")
    >>> for i in (0, 1):
    ...     for n in (Node(f"socket{i}", NodeKind.SOCKET), Node(f"gpu{i}", NodeKind.GPU),
    ...               Node(f"ssd{i}", NodeKind.NVME)):
    ...         _ = topo.add_node(n)
    ...     _ = topo.add_link(Link.pcie(f"socket{i}", f"gpu{i}", gen=4, lanes=16))
    ...     _ = topo.add_link(Link.pcie(f"socket{i}", f"ssd{i}", gen=4, lanes=4))
    >>> _ = topo.add_link(Link("socket0", "socket1", LinkKind.INTER_SOCKET, 1e9))
    >>> w = Workload([Consumer("gpu0", 1e9), Consumer("gpu1", 1e9)],
    ...              [Tier("ssd", [Store("ssd0", "ssd0"), Store("ssd1", "ssd1")], 1.0)])
    >>> r = solve_concurrent(topo, w)  # half of each GPU's reads cross the 1 GB/s link
    >>> round(r.seconds_per_iteration, 3), r.bottleneck
    (0.5, [('socket0', 'socket1'), ('socket1', 'socket0')])
    >>> round(solve_maxflow(topo, w).seconds_per_iteration, 3)  # each GPU reads its own SSD
    0.159
    """
    net = _Net(topo, workload, unknown_link_bytes_per_s, nvlink_relay)
    net.check_reachable("concurrent")
    lp = _LP(net, "concurrent", t_unit=net.time_lower_bound())
    T, sol, links, stores = lp.min_time()
    if tie_break:
        sol = lp.tie_break(T, _T_SLACK)
    x, rep, flows = lp.unpack(sol)
    if not tie_break:
        flows = [_net_out(net, edges, f) for (_, edges), f in zip(lp.commodities, flows, strict=True)]
    return _result(net, "concurrent", T, x, rep, flows, links, stores, commodities=lp.commodities)


def _net_out(net: _Net, edges: np.ndarray, f: np.ndarray) -> np.ndarray:
    """Cancel flow running both ways between two nodes (an interior solution has some)."""
    f = np.clip(f, 0.0, None)
    pos = {(net.tail[e], net.head[e]): i for i, e in enumerate(edges)}
    for (u, v), i in pos.items():
        k = pos.get((v, u))
        if k is not None and k > i:
            m = min(f[i], f[k])
            f[i] -= m
            f[k] -= m
    return f


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------


def _result(
    net: _Net,
    model: str,
    T_norm: float,
    x: np.ndarray,
    rep: list[list[float]],
    flows: list[np.ndarray],
    bottleneck_edges: list[int],
    saturated: list[str],
    commodities: list[tuple[int, np.ndarray]] | None = None,
) -> FlowResult:
    total = net.total
    T = max(T_norm, 0.0) * net.tau

    def clean(v: float) -> float:
        return 0.0 if abs(v) < _ZERO else float(v)

    x = [clean(max(v, 0.0)) for v in x]
    store_bytes: dict[str, float] = {}
    pair: dict[tuple[str, str], float] = {}
    tier_shares: dict[str, float] = {t.name: 0.0 for t in net.workload.tiers}
    for j, st in enumerate(net.sh_stores):
        store_bytes[st.id] = x[j] * total
        tier_shares[net.sh_tiers[net.sh_tier_of[j]].name] += x[j]
    for rr, t in enumerate(net.rep_tiers):
        for st in t.stores:
            store_bytes[st.id] = 0.0
        for gi, c in enumerate(net.consumers):
            v = clean(max(rep[rr][gi], 0.0))
            st = net.rep_store[rr][gi]
            store_bytes[st.id] = v * total
            if v:
                pair[st.id, c.node_id] = v * total
            tier_shares[t.name] += v

    edge_flow = np.zeros(len(net.tail))
    if commodities is None:
        edge_flow = np.clip(flows[0], 0.0, None)
    else:
        for (_, edges), f in zip(commodities, flows, strict=True):
            np.add.at(edge_flow, edges, np.clip(f, 0.0, None))
    if model == "concurrent":
        for c in net.consumers:
            for j, st in enumerate(net.sh_stores):
                if x[j]:
                    pair[st.id, c.node_id] = x[j] * c.demand_bytes
    else:
        for (j, gi), v in _decompose(net, edge_flow, x).items():
            if clean(v):
                pair[net.sh_stores[j].id, net.consumers[gi].node_id] = v * total

    link_bytes: dict[tuple[str, str], float] = dict.fromkeys(net.topo.graph.edges, 0.0)
    for i, chain in enumerate(net.chain):
        v = clean(edge_flow[i])
        if v:
            for lk in chain:
                link_bytes[lk] += v * total

    _symmetrise(net, store_bytes, pair, link_bytes)

    util: dict[tuple[str, str], float] = {}
    for e, cap in net.link_caps.items():
        b = link_bytes[e]
        util[e] = b / (cap * T) if cap > 0 and T > 0 else 0.0
    names: list[tuple[str, str]] = []
    for i in bottleneck_edges:
        # of a chain of links, the narrowest ones bind
        chain = net.chain[i]
        least = min(net.link_caps[lk] for lk in chain)
        names += [lk for lk in chain if net.link_caps[lk] <= least * (1 + 1e-9)]
    bottleneck = sorted(dict.fromkeys(names), key=lambda e: (-round(util.get(e, 0.0), 4), e))
    inlet = {c.node_id: (c.demand_bytes / T if T > 0 else math.inf) for c in net.consumers}
    return FlowResult(
        model=model,
        seconds_per_iteration=T,
        inlet_bytes_per_s=inlet,
        store_bytes=store_bytes,
        tier_shares={k: clean(v) for k, v in tier_shares.items()},
        link_bytes=link_bytes,
        link_utilisation=util,
        bottleneck=bottleneck,
        flows=pair,
        saturated_stores=sorted(set(saturated)),
        total_demand_bytes=total,
    )


def _decompose(net: _Net, flow: np.ndarray, x: list[float]) -> dict[tuple[int, int], float]:
    """Split a single-commodity flow into (sharded store, consumer) amounts.

    Follows edges with flow left from each store's supply node to a consumer
    still taking (depth-first, so a consumer drinks before relaying).
    """
    rem = [max(float(v), 0.0) for v in flow]
    cons_at = {m: gi for gi, m in enumerate(net.cmain)}
    # what each consumer keeps: inflow − what it relays onwards
    need = [sum(rem[i] for i in net.in_adj[m]) - sum(rem[i] for i in net.out_adj[m]) for m in net.cmain]
    out: dict[tuple[int, int], float] = {}
    eps = 1e-12
    for j, sup in enumerate(net.supply):
        left = x[j]
        for _ in range(4 * len(rem) + 8):
            if left <= eps:
                break
            path: list[int] = []
            stack = [iter(net.out_adj[sup])]
            nodes = [sup]
            seen = {sup}
            found = None
            while stack:
                gi = cons_at.get(nodes[-1])
                if gi is not None and need[gi] > eps:
                    found = gi
                    break
                nxt = next((i for i in stack[-1] if rem[i] > eps and net.head[i] not in seen), None)
                if nxt is None:
                    stack.pop()
                    nodes.pop()
                    if path:
                        path.pop()
                    continue
                path.append(nxt)
                node = net.head[nxt]
                seen.add(node)
                nodes.append(node)
                stack.append(iter(net.out_adj[node]))
            if found is None:
                break
            amount = min([left, need[found]] + [rem[i] for i in path])
            for i in path:
                rem[i] -= amount
            need[found] -= amount
            left -= amount
            out[j, found] = out.get((j, found), 0.0) + amount
    return out


def _symmetrise(
    net: _Net,
    store_bytes: dict[str, float],
    pair: dict[tuple[str, str], float],
    link_bytes: dict[tuple[str, str], float],
) -> None:
    """Give identical stores hanging identically off one node equal traffic.

    Two sharded stores of the same tier and read limit, each alone on a
    leaf device hanging off the same node through the same chain of links
    (SSDs in identical slots under one switch, say), can swap places without
    changing anything else; averaging their traffic keeps the solution
    feasible and optimal, and gives the data placement balanced targets.
    """
    g = net.topo.graph
    cons = {c.node_id for c in net.consumers}
    count: dict[str, int] = {}
    for t in net.workload.tiers:
        for st in t.stores:
            count[st.node_id] = count.get(st.node_id, 0) + 1
    nbrs = net.nbrs
    classes: dict[tuple, list[tuple[str, list[tuple[str, str]]]]] = {}
    for j, st in enumerate(net.sh_stores):
        n = st.node_id
        if count[n] != 1 or n in cons or len(nbrs[n]) != 1:
            continue
        chain: list[tuple[str, str]] = []
        sig = []
        prev, cur = n, nbrs[n][0]
        while True:
            chain.append((prev, cur))
            sig.append((str(g.edges[prev, cur].get("kind")) if g.has_edge(prev, cur) else None,
                        net.link_caps.get((prev, cur)), net.link_caps.get((cur, prev)),
                        str(net.kinds[cur])))
            nb = nbrs[cur]
            if len(nb) != 2 or cur in cons or cur in count or len(chain) > len(nbrs):
                break
            prev, cur = cur, (nb[0] if nb[1] == prev else nb[1])
        key = (net.sh_tier_of[j], st.read_bytes_per_s, cur, tuple(sig), str(net.kinds[n]))
        classes.setdefault(key, []).append((st.id, chain))
    for members in classes.values():
        if len(members) < 2:
            continue
        k = len(members)
        ids = [m[0] for m in members]
        mean = sum(store_bytes[i] for i in ids) / k
        for i in ids:
            store_bytes[i] = mean
        for c in net.consumers:
            mean = sum(pair.get((i, c.node_id), 0.0) for i in ids) / k
            for i in ids:
                if mean > 0:
                    pair[i, c.node_id] = mean
                else:
                    pair.pop((i, c.node_id), None)
        for pos in range(len(members[0][1])):
            for forward in (True, False):
                edges = [m[1][pos] if forward else m[1][pos][::-1] for m in members]
                if not all(e in link_bytes for e in edges):
                    continue
                mean = sum(link_bytes[e] for e in edges) / k
                for e in edges:
                    link_bytes[e] = mean
