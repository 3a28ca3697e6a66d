"""The linear programs: the concurrent model, and the tie-break both models use at the optimal ``T``."""

from __future__ import annotations

import math
import warnings

import numpy as np
from scipy import sparse

from planner.errors import PlannerError
from planner.flow.net import _Net
from planner.flow.result import FlowResult, _result
from planner.topology.model import Topology
from planner.workload import Workload

__all__ = ["solve_concurrent"]

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
        self._equalities(net, conc)
        self._inequalities(net, conc, t_unit)
        self._bounds(net, conc)

    def _equalities(self, net: _Net, conc: bool) -> None:
        """Flow conservation per commodity and node; in ``concurrent``, the shares sum to 1."""
        n_sh, n_rep, n_cons, d = len(net.sh_stores), len(net.rep_tiers), len(net.consumers), net.d
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

    def _inequalities(self, net: _Net, conc: bool, t_unit: float) -> None:
        """Link capacities, stores' read limits and tiers' shares, each against ``T``."""
        n_sh, n_rep, n_cons, d = len(net.sh_stores), len(net.rep_tiers), len(net.consumers), net.d
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

    def _bounds(self, net: _Net, conc: bool) -> None:
        """Variable bounds: unreachable stores hold nothing, replicated tiers their share."""
        n_sh, n_cons, d = len(net.sh_stores), len(net.consumers), net.d
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
        # scipy.optimize loads here, not at import: it is ~0.3-0.6 s of start-up (it imports
        # every optimizer), and the maxflow model's ranking never solves an LP
        from scipy.optimize import OptimizeWarning, linprog

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
    >>> from planner.flow import solve_maxflow
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
