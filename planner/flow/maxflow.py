"""The paper's flow model: time-bisection max-flow, accelerated by cut (Newton) steps."""

from __future__ import annotations

import math

import numpy as np

from planner.errors import PlannerError
from planner.flow.dinic import maximum_flow
from planner.flow.net import _Net
from planner.flow.result import FlowResult, _result
from planner.topology.model import Topology
from planner.workload import Workload

__all__ = ["solve_maxflow"]

#: the integer max-flow works on capacities scaled so that ΣD = 2**29; larger
#: capacities are clipped to 2**30 (such an edge is never in a cut below ΣD)
_MF_SCALE = float(2**29)
_MF_CAP = 2**30


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
        flow_value, f = maximum_flow(self.indptr, self.indices, slot_cap, self.s, self.t)
        if flow_value >= self.demand_int - self.n_slots:
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

    ``T`` is found by time bisection over max-flows (Dinic's algorithm on
    integer capacities, :mod:`planner.flow.dinic`), each step jumping to the time the current min cut
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
        # the LP (scipy.sparse, HiGHS) loads here: ranking layouts never tie-breaks, and
        # importing scipy.sparse costs more than the whole ranking
        from planner.flow.lp import _LP, _T_SLACK

        lp = _LP(net, "maxflow", t_unit=T)
        sol = lp.tie_break(T, _T_SLACK)
        x, rep, flow = lp.unpack(sol)
    else:
        f = mf.last_flow if mf.last_flow is not None else np.zeros(len(mf.tail))
        x = f[mf.store_edge]
        rep = [[f[i] for i in row] for row in mf.rep_edge]
        flow = [f[mf.first_net_edge: mf.first_net_edge + len(net.tail)]]
    return _result(net, "maxflow", T, x, rep, flow, links, stores)
