"""The topology as a flow network for one workload: the network both flow models share."""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from planner.errors import PlannerError
from planner.topology.model import LinkKind, NodeKind, Topology
from planner.workload import Store, Tier, Workload

#: node kinds that forward any traffic between their links
_FORWARDING = frozenset({NodeKind.SOCKET, NodeKind.SWITCH, NodeKind.SLOT})


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
        default = _checked_default(topo, workload, unknown_link_bytes_per_s)
        self.topo = topo
        self.workload = workload
        self.tname = topo.name or "unnamed"
        hosts, cons_nodes = self._stores(workload)
        raw = self._capacities(default)
        forwards, passthrough = self._roles(set(hosts), cons_nodes)
        out = self._compiled_nodes(passthrough, hosts)
        tails, heads, chains, ends = self._edges(raw, forwards, passthrough, out, hosts, nvlink_relay)
        self._keep(tails, heads, chains, ends, raw, default)
        self._per_consumer()
        self._rates_and_scale()

    def _stores(self, workload: Workload) -> tuple[list[str], set[str]]:
        """Consumers and stores: replicated tiers per consumer, sharded stores tier by tier.

        Returns the nodes hosting sharded stores and the consumers' nodes.
        """
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
        return hosts, cons_nodes

    def _capacities(self, default: float | None) -> dict[tuple[str, str], float | None]:
        """Each directed edge's capacity (None: unknown); known or assumed ones in ``link_caps``."""
        g, tname = self.topo.graph, self.tname
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
        return raw

    def _roles(self, host_set: set[str], cons_nodes: set[str]) -> tuple[dict[str, bool], set[str]]:
        """Which nodes forward traffic, and which are mere pass-through (folded into edges)."""
        g = self.topo.graph
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
        return forwards, passthrough

    def _compiled_nodes(self, passthrough: set[str], hosts: list[str]) -> dict[str, int]:
        """Number the compiled nodes (main, out, supply); returns the ``out`` node of each host."""
        g = self.topo.graph
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
        return out

    def _edges(self, raw: dict[tuple[str, str], float | None], forwards: dict[str, bool],
               passthrough: set[str], out: dict[str, int], hosts: list[str], nvlink_relay: bool
               ) -> tuple[list[int], list[int], list[tuple[tuple[str, str], ...]], list[tuple[str, str] | None]]:
        """Every candidate edge: (tail, head, topology links along it, endpoints in the topology)."""
        g, nbrs, kinds = self.topo.graph, self.nbrs, self.kinds
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
        return tails, heads, chains, ends

    def _keep(self, tails: list[int], heads: list[int], chains: list[tuple[tuple[str, str], ...]],
              ends: list[tuple[str, str] | None], raw: dict[tuple[str, str], float | None],
              default: float | None) -> None:
        """The edges that can carry something, with their capacities, and the adjacency lists."""
        g, tname = self.topo.graph, self.tname
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

    def _per_consumer(self) -> None:
        """Per consumer: the edges its flow may use.

        Across a bridge of the topology (most links: PCIe is a tree) only the
        direction towards the consumer is any use to it.
        """
        n_edges = len(self.tail)
        self._adj = self._contracted()
        bridges = self._bridges()
        self.edges_of: list[np.ndarray] = []
        self.reach: list[list[bool]] = []
        for m in self.cmain:
            back = self._reach_back(m)
            dist = self._hops(self.names[m])
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

    def _rates_and_scale(self) -> None:
        """Each sharded store's own rate (for balancing), and the normalisation."""
        nbrs, n_edges = self.nbrs, len(self.tail)
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


def _checked_default(topo: Topology, workload: Workload, default: float | None) -> float | None:
    """Check the arguments (types, the assumed capacity, consumers and stores on nodes); the capacity."""
    if not isinstance(topo, Topology):
        raise PlannerError(f"expected a Topology, got {type(topo).__name__}")
    if not isinstance(workload, Workload):
        raise PlannerError(f"expected a Workload, got {type(workload).__name__}")

    if default is not None and not (
        isinstance(default, (int, float)) and not isinstance(default, bool)
        and math.isfinite(default) and default > 0
    ):
        raise PlannerError(f"unknown_link_bytes_per_s must be a positive number, got {default!r}")
    tname = topo.name or "unnamed"
    for c in workload.consumers:
        if c.node_id not in topo.graph:
            raise PlannerError(f"consumer {c.node_id!r} is not a node of topology {tname!r}")
    for t in workload.tiers:
        for s in t.stores:
            if s.node_id not in topo.graph:
                raise PlannerError(
                    f"store {s.id!r} of tier {t.name!r} sits on node {s.node_id!r}, "
                    f"which is not in topology {tname!r}"
                )
    return default


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
