"""What a flow model answers (:class:`FlowResult`), and the solvers' numbers turned into it.

Both models end in :func:`_result`: shares and flows in normalised units
become bytes per store, per (store, consumer) pair and per directed link;
identical stores hanging identically off one node get equal traffic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from planner.flow.net import _Net

__all__ = ["FlowResult"]

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
    x = [_clean(max(v, 0.0)) for v in x]
    store_bytes, pair, tier_shares = _shares(net, x, rep)

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
            if _clean(v):
                pair[net.sh_stores[j].id, net.consumers[gi].node_id] = v * total

    link_bytes: dict[tuple[str, str], float] = dict.fromkeys(net.topo.graph.edges, 0.0)
    for i, chain in enumerate(net.chain):
        v = _clean(edge_flow[i])
        if v:
            for lk in chain:
                link_bytes[lk] += v * total

    _symmetrise(net, store_bytes, pair, link_bytes)
    util, bottleneck = _utilisation(net, link_bytes, T, bottleneck_edges)
    inlet = {c.node_id: (c.demand_bytes / T if T > 0 else math.inf) for c in net.consumers}
    return FlowResult(
        model=model,
        seconds_per_iteration=T,
        inlet_bytes_per_s=inlet,
        store_bytes=store_bytes,
        tier_shares={k: _clean(v) for k, v in tier_shares.items()},
        link_bytes=link_bytes,
        link_utilisation=util,
        bottleneck=bottleneck,
        flows=pair,
        saturated_stores=sorted(set(saturated)),
        total_demand_bytes=total,
    )


def _clean(v: float) -> float:
    return 0.0 if abs(v) < _ZERO else float(v)


def _shares(net: _Net, x: list[float], rep: list[list[float]]
            ) -> tuple[dict[str, float], dict[tuple[str, str], float], dict[str, float]]:
    """(bytes per store, bytes per replicated (store, consumer) pair, share per tier)."""
    total = net.total
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
            v = _clean(max(rep[rr][gi], 0.0))
            st = net.rep_store[rr][gi]
            store_bytes[st.id] = v * total
            if v:
                pair[st.id, c.node_id] = v * total
            tier_shares[t.name] += v
    return store_bytes, pair, tier_shares


def _utilisation(net: _Net, link_bytes: dict[tuple[str, str], float], T: float,
                 bottleneck_edges: list[int]) -> tuple[dict[tuple[str, str], float], list[tuple[str, str]]]:
    """Each link's utilisation, and the binding links by utilisation then name."""
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
    return util, sorted(dict.fromkeys(names), key=lambda e: (-round(util.get(e, 0.0), 4), e))


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
