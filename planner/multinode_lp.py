"""The linear program of one node among many (see :mod:`planner.multinode`), solved with HiGHS.

Variables are, per commodity (the node's own reads, rows served to peers,
rows read from peers), a flow on every directed edge and the amounts its
sources send and its sinks take, and ``T``, the seconds per iteration; the LP
minimises ``T``. Bytes are counted in units of all GPUs' reads per iteration
(HiGHS needs the scale).
"""

from __future__ import annotations

import numpy as np

from planner.errors import PlannerError
from planner.topology.model import Node, NodeKind, Topology


def _memory_of(topo: Topology, node_id: str) -> str:
    sock = topo.socket_of(node_id)
    mems = [m for m in topo.nodes(NodeKind.MEMORY) if sock is not None and (p := topo.parent(m.id)) is not None
            and p.id == sock.id] or topo.nodes(NodeKind.MEMORY)
    if not mems:
        raise PlannerError(f"{topo.name}: without GPUDirect RDMA the network's bytes land in host memory, and the "
                           "machine has no memory node")
    return mems[0].id


_FORWARDING = frozenset({NodeKind.SOCKET, NodeKind.SWITCH, NodeKind.SLOT})


def _edges(topo: Topology, unknown: float | None) -> tuple[list[tuple[str, str]], np.ndarray]:
    """Directed edges (both directions of every link) and their capacities, bytes/s."""
    edges, caps = [], []
    for lk in topo.links():
        c = lk.bytes_per_s if lk.bytes_per_s is not None else unknown
        if c is None:
            raise PlannerError(f"{topo.name}: the link {lk.src} → {lk.dst} has no known bandwidth; give measured "
                               "figures or assume one (`unknown_link_bytes_per_s`)")
        for e in ((lk.src, lk.dst), (lk.dst, lk.src)):
            edges.append(e)
            caps.append(float(c))
    return edges, np.array(caps)


class _LP:
    """Variables: per commodity, a flow on every directed edge, source and sink amounts; and ``T`` (last)."""

    def __init__(self, edges: list[tuple[str, str]]) -> None:
        self.edges = edges
        self.n = 0
        # the constraint matrices in COO form (row, column, value) and their right-hand sides
        self.eq_rows: list[int] = []
        self.eq_cols: list[int] = []
        self.eq_vals: list[float] = []
        self.eq_rhs: list[float] = []
        self.ub_rows: list[int] = []
        self.ub_cols: list[int] = []
        self.ub_vals: list[float] = []
        self.ub_rhs: list[float] = []
        self.bounds: list[tuple[float, float | None]] = []

    def var(self, count: int = 1, hi: float | None = None) -> int:
        first = self.n
        self.n += count
        self.bounds += [(0.0, hi)] * count
        return first

    def eq(self, terms: dict[int, float], rhs: float) -> None:
        r = len(self.eq_rhs)
        for c, v in terms.items():
            self.eq_rows.append(r)
            self.eq_cols.append(c)
            self.eq_vals.append(v)
        self.eq_rhs.append(rhs)

    def le(self, terms: dict[int, float], rhs: float = 0.0) -> int:
        r = len(self.ub_rhs)
        for c, v in terms.items():
            self.ub_rows.append(r)
            self.ub_cols.append(c)
            self.ub_vals.append(v)
        self.ub_rhs.append(rhs)
        return r


def _commodity(lp: _LP, forwards: set[str], sources: dict[str, int], sinks: dict[str, float],
               var_sinks: dict[str, int] | None = None) -> np.ndarray:
    """One flow from ``sources`` (node → its supply variable) to ``sinks`` (node → bytes) and ``var_sinks``
    (node → a variable: what it takes). Traffic passes only through ``forwards``.

    Returns each edge's flow variable (-1: the edge cannot carry this flow).
    """
    var_sinks = var_sinks or {}
    ends = set(sinks) | set(var_sinks)
    idx = np.full(len(lp.edges), -1, np.int64)
    balance: dict[str, dict[int, float]] = {}
    for i, (u, v) in enumerate(lp.edges):
        if (u in forwards or u in sources) and (v in forwards or v in ends) and v not in sources:
            idx[i] = k = lp.var()
            balance.setdefault(u, {})[k] = -1.0
            balance.setdefault(v, {})[k] = 1.0
    for node in set(forwards) | set(sources) | ends:
        terms = dict(balance.get(node, {}))  # inflow - outflow (+ supply) (- what it takes) = fixed sink
        if node in sources:
            terms[sources[node]] = terms.get(sources[node], 0.0) + 1.0
        if node in var_sinks:
            terms[var_sinks[node]] = terms.get(var_sinks[node], 0.0) - 1.0
        if terms or node in sinks:
            lp.eq(terms, float(sinks.get(node, 0.0)))
    return idx


class _NodeLP:
    """The LP of one node: local reads, rows served to peers, rows read from them (bytes in ``unit``s)."""

    def __init__(self, topo: Topology, edges: list[tuple[str, str]], caps: np.ndarray,
                 local_tiers: list) -> None:
        self.topo, self.edges, self.caps = topo, edges, caps
        nbrs: dict[str, int] = {}
        for u, _ in edges:
            nbrs[u] = nbrs.get(u, 0) + 1
        self.forwards = {n.id for n in topo.nodes() if n.kind in _FORWARDING
                         or (n.kind == NodeKind.OTHER and nbrs.get(n.id, 0) >= 2)}
        self.local_tiers = local_tiers
        self.stores = [s for t in local_tiers for s in t.stores]
        self.tsum = sum(t.max_share for t in local_tiers) or 1.0
        self.lp = _LP(edges)
        self.T = self.lp.var()
        self.flows: dict[str, np.ndarray] = {}
        self.supplies: list[dict[str, int]] = []  # per store commodity: store id -> its supply
        self.nic_in: dict[str, int] = {}
        self.nic_out: dict[str, int] = {}

    def store_commodity(self, name: str, sinks: dict[str, float], var_sinks: dict[str, int],
                        amount: float) -> None:
        """Rows from the local stores (one supply variable per store) to ``sinks`` and ``var_sinks``."""
        lp = self.lp
        sup = {}
        by_node: dict[str, list[int]] = {}
        for s in self.stores:
            v = lp.var()
            sup[s.id] = v
            by_node.setdefault(s.node_id, []).append(v)
        node_sup = {}
        for node, vs in by_node.items():  # stores of one node feed it together
            agg = lp.var()
            lp.eq({agg: 1.0, **{v: -1.0 for v in vs}}, 0.0)
            node_sup[node] = agg
        self.flows[name] = _commodity(lp, self.forwards, node_sup, sinks, var_sinks)
        for t in self.local_tiers:  # each tier serves at most its share of what the stores send
            lp.le({sup[s.id]: 1.0 for s in t.stores}, t.max_share / self.tsum * amount)
        self.supplies.append(sup)

    def network(self, nics: list[Node], ports: dict[str, float], gpu_sinks: dict[str, float],
                r: float, gpudirect: bool) -> None:
        """Rows served to peers through the NICs, and the same amount read from them."""
        lp, T = self.lp, self.T
        for n in nics:
            self.nic_in[n.id], self.nic_out[n.id] = lp.var(), lp.var()
            lp.le({self.nic_in[n.id]: 1.0, T: -ports[n.id]})
            lp.le({self.nic_out[n.id]: 1.0, T: -ports[n.id]})
        self.store_commodity("out", {}, dict(self.nic_out), r)
        lp.eq(dict.fromkeys(self.nic_out.values(), 1.0), r)  # peers ask this node what it asks them
        lp.eq(dict.fromkeys(self.nic_in.values(), 1.0), r)
        if gpudirect:
            self.flows["in"] = _commodity(lp, self.forwards, dict(self.nic_in), gpu_sinks)
            return
        # two legs: NIC -> the memory of its socket, then memory -> GPU
        land: dict[str, list[int]] = {}
        for n in nics:
            land.setdefault(_memory_of(self.topo, n.id), []).append(self.nic_in[n.id])
        mem_in = {m: lp.var() for m in land}
        for m, vs in land.items():
            lp.eq({mem_in[m]: 1.0, **dict.fromkeys(vs, -1.0)}, 0.0)
        self.flows["in-host"] = _commodity(lp, self.forwards, dict(self.nic_in), {}, dict(mem_in))
        self.flows["in"] = _commodity(lp, self.forwards, dict(mem_in), gpu_sinks)

    def limits(self, unit: float) -> None:
        """Store read limits (the GPUs' and the peers' reads together) and link capacities."""
        lp, T = self.lp, self.T
        for s in self.stores:
            if s.read_bytes_per_s:
                terms = {T: -float(s.read_bytes_per_s) / unit}
                for sup in self.supplies:
                    if s.id in sup:
                        terms[sup[s.id]] = 1.0
                lp.le(terms)
        for i in range(len(self.edges)):  # every commodity together
            terms = {int(f[i]): 1.0 for f in self.flows.values() if f[i] >= 0}
            if terms:
                terms[T] = -self.caps[i]
                lp.le(terms)

    def solve(self) -> np.ndarray:
        """Minimise ``T`` with HiGHS; the solution vector."""
        from scipy import sparse
        from scipy.optimize import linprog

        lp = self.lp
        c = np.zeros(lp.n)
        c[self.T] = 1.0
        a_ub = sparse.csr_array((lp.ub_vals, (lp.ub_rows, lp.ub_cols)), shape=(len(lp.ub_rhs), lp.n)) \
            if lp.ub_rhs else None
        a_eq = sparse.csr_array((lp.eq_vals, (lp.eq_rows, lp.eq_cols)), shape=(len(lp.eq_rhs), lp.n))
        res = linprog(c, A_ub=a_ub, b_ub=np.array(lp.ub_rhs) if lp.ub_rhs else None, A_eq=a_eq,
                      b_eq=np.array(lp.eq_rhs), bounds=lp.bounds, method="highs")
        if res.status != 0:
            raise PlannerError(f"{self.topo.name}: no flow delivers the reads ({res.message}); a GPU or a NIC "
                               "that no store or GPU can reach?")
        return res.x

    def loads(self, x: np.ndarray, unit: float) -> tuple[dict, list[str], dict[str, float]]:
        """(link utilisation, bottlenecks: links and stores at their limit, bytes each store serves)."""
        t_opt = float(x[self.T])
        util = {}
        for i, e in enumerate(self.edges):
            b = sum(float(x[f[i]]) for f in self.flows.values() if f[i] >= 0)
            if b > 0:
                util[e] = b / (self.caps[i] * t_opt) if t_opt > 0 else 0.0
        bottleneck = [f"{u} → {v}" for (u, v), q in sorted(util.items(), key=lambda kv: (-kv[1], kv[0]))
                      if q > 0.999]
        store_bytes = {s.id: unit * sum(float(x[sup[s.id]]) for sup in self.supplies if s.id in sup)
                       for s in self.stores}
        for s in self.stores:
            if s.read_bytes_per_s and t_opt > 0 and store_bytes[s.id] >= 0.999 * s.read_bytes_per_s * t_opt:
                bottleneck.append(f"store:{s.id}")
        return util, bottleneck, store_bytes
