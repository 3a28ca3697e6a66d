"""Several nodes: NICs on the PCIe graph, the network as a link with a capacity, and where the NICs should go.

The Moment paper's §5 sketches the extension: treat NICs like GPUs and SSDs,
as devices on the PCIe graph, and the links between machines as edges with a
capacity. Here, for ``N`` identical nodes training data-parallel over a feature
store sharded across them (:mod:`iostack.shards`), one node is modelled with
three kinds of traffic, each a flow over the node's directed links, all sharing
the links' capacities × ``T`` (the time of an iteration, minimised by a linear
program, SciPy's HiGHS):

``local``
    the node's own stores (host memory, SSDs: the non-replicated tiers of the
    single-node :class:`~planner.workload.Workload`) to its GPUs, for the
    share of the reads the node holds;
``in``
    the ``remote_share`` of every GPU's reads (:func:`remote_share`: what the
    node does not hold, after replicas and caches) from the data NICs to the
    GPUs. With GPUDirect RDMA (``gpudirect=True``) straight from the NIC over
    PCIe (through a shared switch when there is one: no CPU on the way);
    without it, NIC → the host memory of its socket, then memory → GPU;
``out``
    the node serves its peers as much as it fetches from them (the layout is
    symmetric): its stores send ``remote_share`` × the node's reads to its
    NICs, over the same links in their own direction, from the same stores'
    read limits.

Every NIC's port carries at most its rate × ``T`` in each direction (the
network link's capacity). GPU caches (a replicated tier) cost no link. What
forwards traffic is as in :mod:`planner.flow` (sockets, switches, slots, a
node of kind ``other`` with two or more links), except that a GPU never relays
over NVLink here (a lower bound on machines where it helps).

Why a model of its own: :mod:`planner.flow`'s models have one kind of
consumer, GPUs reading tiers; a NIC that is a source of one flow and a sink of
another is neither, and a NIC-as-consumer would read the network tier from
itself for free. With ``remote_share = 0`` this is the maxflow model of one
machine (the tests compare the two).

:func:`place_nics` puts NICs of a :class:`NicModel` into every distinct
combination of free slots and ranks them.

>>> from planner.topology.model import Link, Node, NodeKind, Topology
>>> from planner.workload import Consumer, Store, Tier, Workload
>>> t = Topology("toy")
>>> for n in (Node("socket0", NodeKind.SOCKET), Node("sw", NodeKind.SWITCH), Node("gpu0", NodeKind.GPU),
...           Node("nic0", NodeKind.NIC), Node("ssd0", NodeKind.NVME)):
...     _ = t.add_node(n)
>>> for a, b, lanes in (("socket0", "sw", 16), ("sw", "gpu0", 16), ("sw", "nic0", 16), ("socket0", "ssd0", 4)):
...     _ = t.add_link(Link.pcie(a, b, gen=4, lanes=lanes))
>>> base = Workload([Consumer("gpu0", 1e9)], [Tier("ssd", [Store("ssd0", "ssd0", 6e9)], 1.0)])
>>> one = solve_nodes(t, base, NetworkDemand(nodes=1, remote_share=0.0))
>>> two = solve_nodes(t, base, NetworkDemand(nodes=2, remote_share=0.5, nic_bytes_per_s=25e9))
>>> round(one.inlet_bytes_per_s["gpu0"] / 1e9, 2), round(two.inlet_bytes_per_s["gpu0"] / 1e9, 2)
(6.0, 6.0)
>>> two.gdr_paths, round(two.nic_in_bytes["nic0"] / 1e9, 2), round(two.nic_out_bytes["nic0"] / 1e9, 2)
({'nic0': ['gpu0']}, 0.5, 0.5)

(The SSD's 6 GB/s serve the GPU's half and the peer's half alike: the same
inlet as one node.)
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from planner.errors import PlannerError
from planner.multinode_lp import _edges, _NodeLP
from planner.topology.model import Link, Node, NodeKind, Topology
from planner.workload import Workload

#: a data NIC's PCIe link carries at least this share of the fastest NIC's (the rest: management ports)
DATA_NIC_SHARE = 0.25

#: combinations of free slots tried by :func:`place_nics`, at most
MAX_COMBINATIONS = 2000


@dataclass(frozen=True)
class NicModel:
    """A network adapter to place: its PCIe link, the slots it fits, its port rate (bytes/s, per direction)."""

    name: str
    lanes: int
    pcie_gen: int
    port_bytes_per_s: float
    form_factors: tuple[str, ...] = ("cem", "ocp")
    title: str = ""
    source: str = ""


#: NIC models the planner knows; port rates are the ports' line rates (bits / 8)
NIC_MODELS: dict[str, NicModel] = {m.name: m for m in (
    NicModel("connectx-7-400g", 16, 5, 400e9 / 8, title="NVIDIA ConnectX-7 400Gb/s",
             source="NVIDIA ConnectX-7 datasheet: one 400 Gb/s port, PCIe Gen5 x16 (HGX H100 class "
                    "machines carry one per GPU)"),
    NicModel("connectx-6-200g", 16, 4, 200e9 / 8, title="NVIDIA ConnectX-6 200Gb/s HDR",
             source="NVIDIA ConnectX-6 datasheet: 200 Gb/s HDR InfiniBand, PCIe Gen4 x16 (Azure NDv4: "
                    "eight, one per A100)"),
    NicModel("connectx-5-100g", 16, 3, 100e9 / 8, title="NVIDIA ConnectX-5 100Gb/s",
             source="NVIDIA ConnectX-5 datasheet: 100 Gb/s, PCIe Gen3 x16 (the HPE Cray XD665 capture)"),
    NicModel("efa-100g", 16, 3, 100e9 / 8, title="AWS Elastic Fabric Adapter 100Gb/s",
             source="AWS p4d.24xlarge: 4 x 100 Gb/s EFA (400 Gb/s per instance), PCIe Gen3 x16 in its "
                    "NCCL topology file"),
    NicModel("bcm57416-10g", 8, 3, 10e9 / 8, form_factors=("ocp", "cem"), title="Broadcom BCM57416 10GbE",
             source="Broadcom BCM57416 NetXtreme-E: two 10GBASE-T ports, PCIe Gen3 x8 (the XD665's OCP slot)"),
    NicModel("i210-1g", 1, 2, 1e9 / 8, title="Intel I210 1GbE",
             source="Intel I210: one 1 Gb/s port, PCIe Gen2 x1 (on the board: management)"),
)}

#: NIC models by PCI vendor:device, then by a token of their name (captures without ids)
_NIC_IDS = {("15b3", "1017"): "connectx-5-100g", ("15b3", "1019"): "connectx-5-100g",
            ("15b3", "101b"): "connectx-6-200g", ("15b3", "101d"): "connectx-6-200g",
            ("15b3", "1021"): "connectx-7-400g", ("1d0f", "efa0"): "efa-100g", ("1d0f", "efa1"): "efa-100g",
            ("14e4", "16d8"): "bcm57416-10g", ("8086", "1533"): "i210-1g"}
_NIC_TOKENS = (("connectx-7", "connectx-7-400g"), ("connectx-6", "connectx-6-200g"),
               ("connectx-5", "connectx-5-100g"), ("bcm57416", "bcm57416-10g"), ("i210", "i210-1g"))


def recognise_nic(nic: Node) -> NicModel | None:
    """The known model of a NIC node, by PCI ids or a name token; None when unknown.

    >>> recognise_nic(Node("n", NodeKind.NIC, vendor_id="1d0f", device_id="efa0")).name
    'efa-100g'
    """
    key = (str(nic.vendor_id or "").lower(), str(nic.device_id or "").lower())
    if key in _NIC_IDS:
        return NIC_MODELS[_NIC_IDS[key]]
    text = " ".join(str(x) for x in (nic.name, nic.attrs.get("subsystem"), nic.attrs.get("device_name"))).lower()
    return next((NIC_MODELS[m] for tok, m in _NIC_TOKENS if tok in text), None)


@dataclass(frozen=True)
class NetworkDemand:
    """``nodes`` identical nodes; ``remote_share`` of every GPU's reads crosses the network.

    ``gpudirect``: GPUDirect RDMA (the NIC writes into GPU memory over PCIe)
    or a bounce through host memory. ``nic_bytes_per_s``: every data NIC's
    port rate (per direction); ``None`` takes a NIC's ``port_bytes_per_s``
    attribute, else its PCIe link (an upper bound: the port may be slower).
    """

    nodes: int
    remote_share: float
    gpudirect: bool = True
    nic_bytes_per_s: float | None = None

    def __post_init__(self) -> None:
        if int(self.nodes) < 1:
            raise PlannerError(f"nodes: expected at least 1, got {self.nodes}")
        if not 0.0 <= self.remote_share <= 1.0:
            raise PlannerError(f"remote share: expected 0 to 1, got {self.remote_share}")
        if self.nodes == 1 and self.remote_share > 0:
            raise PlannerError("one node has no remote rows: remote share must be 0")
        if self.nic_bytes_per_s is not None and not (0 < self.nic_bytes_per_s < math.inf):
            raise PlannerError(f"NIC rate: expected a positive number of bytes/s, got {self.nic_bytes_per_s}")


def remote_share(nodes: int, *, replicas: int = 1, hot_read_share: float = 0.0, gpu_cache_share: float = 0.0,
                 cache_read_share: float = 0.0, groups: int = 1) -> float:
    """Share of a GPU's reads that come from other nodes (see :mod:`iostack.shards`).

    Rows are dealt evenly, so a node holds ``1/nodes`` of the reads of the
    rows held once and ``replicas/nodes`` of the ``hot_read_share`` of reads
    that go to the replicated hottest rows; the GPU caches (the hottest rows,
    ``gpu_cache_share`` of the reads, on every GPU) and the locality cache
    (``cache_read_share`` of the reads) keep theirs local. ``groups`` full
    replicas (replica groups): the same within a group of ``nodes / groups``.

    >>> remote_share(4), remote_share(4, replicas=4, hot_read_share=0.2), remote_share(2, gpu_cache_share=0.3)
    (0.75, 0.6, 0.35)
    >>> remote_share(4, groups=2), remote_share(4, groups=4)
    (0.5, 0.0)

    Raises
    ------
    PlannerError
        ``groups`` that do not divide ``nodes``, ``replicas`` above the nodes of a group.
    """
    if nodes < 1 or groups < 1 or nodes % groups:
        raise PlannerError(f"nodes {nodes}, groups {groups}: replica groups split the nodes evenly")
    nodes //= groups
    if not 1 <= replicas <= nodes:
        raise PlannerError(f"nodes {nodes}, replicas {replicas}: need 1 <= replicas <= nodes of a group")
    rest = max(0.0, 1.0 - gpu_cache_share)
    hot = min(hot_read_share, rest)
    local = hot * replicas / nodes + (rest - hot) / nodes
    return max(0.0, rest - local - cache_read_share)


def data_nics(topo: Topology) -> list[Node]:
    """The NICs that carry data: those whose port rate (:func:`port_rate`) is at least
    :data:`DATA_NIC_SHARE` of the fastest NIC's (the rest: management ports)."""
    nics = topo.nodes(NodeKind.NIC)
    rate = {n.id: _rate_or_zero(topo, n) for n in nics}
    best = max(rate.values(), default=0.0)
    return [n for n in nics if rate[n.id] >= DATA_NIC_SHARE * best] if best > 0 else nics


def _up_rate(topo: Topology, node_id: str) -> float:
    up = topo.parent(node_id)
    lk = topo.link_between(up.id, node_id) if up is not None else None
    return float(lk.bytes_per_s) if lk is not None and lk.bytes_per_s else 0.0


def _rate_or_zero(topo: Topology, nic: Node) -> float:
    try:
        return port_rate(topo, nic)
    except PlannerError:
        return 0.0


def port_rate(topo: Topology, nic: Node, override: float | None = None) -> float:
    """A NIC's network rate, bytes/s per direction, the least of what is known: ``override``, else its
    ``port_bytes_per_s`` or its recognised model's port (:func:`recognise_nic`), and its PCIe link."""
    if override is not None:
        return float(override)
    link = _up_rate(topo, nic.id)
    model = recognise_nic(nic)
    port = nic.attrs.get("port_bytes_per_s") or (model.port_bytes_per_s if model is not None else None)
    if port:
        return min(float(port), link) if link > 0 else float(port)
    r = link
    if r <= 0:
        raise PlannerError(f"{topo.name}: NIC {nic.id} has no known link rate; give the port rate (`nic_bytes_per_s`)")
    return r


@dataclass(frozen=True)
class NodesResult:
    """One node of ``demand.nodes``, solved (bytes per iteration, rates in bytes/s).

    ``seconds_per_iteration``: ``T``; ``inlet_bytes_per_s[g] = D_g / T``;
    ``nic_in_bytes``/``nic_out_bytes``: what each data NIC brings in and
    sends out; ``store_bytes``: what each local store sends (its GPUs' and
    its peers'); ``link_utilisation[(src, dst)]``: every directed edge's
    traffic over its capacity × ``T``; ``bottleneck``: the edges, NIC ports
    (``port:<nic>:in|out``) and stores (``store:<id>``) that bind;
    ``gdr_paths``: per NIC, the GPUs it reaches without crossing a CPU
    socket (a PCIe switch between them).
    """

    demand: NetworkDemand
    seconds_per_iteration: float
    inlet_bytes_per_s: dict[str, float]
    nic_in_bytes: dict[str, float]
    nic_out_bytes: dict[str, float]
    store_bytes: dict[str, float]
    link_utilisation: dict[tuple[str, str], float]
    bottleneck: list[str]
    gdr_paths: dict[str, list[str]]

    @property
    def mean_inlet_bytes_per_s(self) -> float:
        v = list(self.inlet_bytes_per_s.values())
        return sum(v) / len(v) if v else 0.0

    @property
    def min_inlet_bytes_per_s(self) -> float:
        return min(self.inlet_bytes_per_s.values(), default=0.0)


def gdr_paths(topo: Topology, nics: Sequence[Node], gpus: Sequence[str]) -> dict[str, list[str]]:
    """Per NIC, the GPUs that share a PCIe switch with it (their path never reaches a socket)."""
    out = {}
    for n in nics:
        sw = {a.id for a in topo.ancestors(n.id) if a.kind == NodeKind.SWITCH}
        out[n.id] = sorted(g for g in gpus if sw & {a.id for a in topo.ancestors(g) if a.kind == NodeKind.SWITCH})
    return out


def solve_nodes(topo: Topology, base: Workload, demand: NetworkDemand, *, nics: Sequence[Node] | None = None,
                unknown_link_bytes_per_s: float | None = None) -> NodesResult:
    """Solve one node of ``demand.nodes`` (see the module docstring).

    ``base``: the single node's workload (GPUs and tiers, e.g.
    :func:`planner.plan.workload_for`); its replicated tiers (GPU caches) are
    local and free, its other tiers are the node's own rows. ``nics``: the
    data NICs (default :func:`data_nics`).
    """
    r = float(demand.remote_share)
    nics = list(nics) if nics is not None else data_nics(topo)
    if r > 0 and not nics:
        raise PlannerError(f"{topo.name}: {demand.nodes} nodes need a NIC to reach each other, and this machine has "
                           "none that carries data; put one in (`place_nics`)")
    edges, caps = _edges(topo, unknown_link_bytes_per_s)
    dem = {c.node_id: float(c.demand_bytes) for c in base.consumers}
    unit = sum(dem.values())  # the LP counts bytes in units of all GPUs' reads (HiGHS needs the scale)
    cache = sum(t.max_share for t in base.tiers if t.replicated)
    local_tiers = [t for t in base.tiers if not t.replicated]
    local = max(0.0, 1.0 - min(cache, 1.0 - r) - r)
    dem = {g: d / unit for g, d in dem.items()}
    if local > 1e-12 and not local_tiers:
        raise PlannerError(f"{base.name or topo.name}: {local:.0%} of the reads are the node's own rows, and the "
                           "workload has no store for them")
    m = _NodeLP(topo, edges, caps / unit, local_tiers)
    if local > 1e-12:
        m.store_commodity("local", {g: d * local for g, d in dem.items()}, {}, local)
    if r > 0:
        ports = {n.id: port_rate(topo, n, demand.nic_bytes_per_s) / unit for n in nics}
        m.network(nics, ports, {g: d * r for g, d in dem.items()}, r, demand.gpudirect)
    m.limits(unit)
    x = m.solve()
    t_opt = float(x[m.T])
    util, bottleneck, store_bytes = m.loads(x, unit)
    ins = {n: unit * max(0.0, float(x[v])) for n, v in m.nic_in.items()}  # HiGHS: -1e-17 is 0
    outs = {n: unit * max(0.0, float(x[v])) for n, v in m.nic_out.items()}
    if r > 0:
        for n in nics:
            p = port_rate(topo, n, demand.nic_bytes_per_s) * t_opt
            for what, b in (("in", ins[n.id]), ("out", outs[n.id])):
                if p > 0 and b >= 0.999 * p:
                    bottleneck.append(f"port:{n.id}:{what}")
    inlet = {g: (unit * d / t_opt if t_opt > 0 else math.inf) for g, d in dem.items()}
    return NodesResult(demand, t_opt, inlet, ins, outs, store_bytes, util, bottleneck,
                       gdr_paths(topo, nics, list(dem)))


# ----------------------------------------------------------------------------------------------
# where the NICs go


@dataclass(frozen=True)
class NicPlacement:
    """NICs put into ``slots`` (slot node ids), the machine with them (``placed``), and its result."""

    slots: tuple[str, ...]
    placed: Topology
    result: NodesResult
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def mean_inlet_bytes_per_s(self) -> float:
        return self.result.mean_inlet_bytes_per_s


def nic_slots(topo: Topology, model: NicModel) -> list[Node]:
    """Empty slots a NIC of ``model`` fits: its form factor (or unknown) and at least x8 electrically."""
    from planner.inventory.slots import slot_form_factor

    out = []
    for s in topo.nodes(NodeKind.SLOT):
        if s.attrs.get("placement") == "unknown" or topo.children(s.id):
            continue
        ff = slot_form_factor(s)
        width = s.attrs.get("width_lanes")
        if (ff is None or ff in model.form_factors) and isinstance(width, int) and width >= 8:
            out.append(s)
    return out


def with_nics(topo: Topology, model: NicModel, slots: Sequence[str]) -> Topology:
    """A copy of ``topo`` with a NIC of ``model`` in each of ``slots`` (ids ``nic:<slot>``)."""
    from planner.layout import usual_efficiency
    from planner.layout.place import _pcie_efficiency

    t = topo.copy()
    eff = usual_efficiency(topo)
    for sid in slots:
        slot = t.node(sid)
        up = t.parent(sid)
        up_link = t.link_between(up.id, sid) if up is not None else None
        gen = min(slot.attrs.get("pcie_gen") or model.pcie_gen, model.pcie_gen)
        lanes = min(slot.attrs.get("width_lanes") or model.lanes, model.lanes)
        nid = f"nic:{sid}"
        t.add_node(Node(nid, NodeKind.NIC, name=model.title or model.name,
                        attrs={"model": model.name, "port_bytes_per_s": model.port_bytes_per_s, "planned": True}))
        lk = Link.pcie(sid, nid, gen, lanes, (_pcie_efficiency(up_link) if up_link is not None else None) or eff)
        t.add_link(lk)
    return t


def place_nics(topo: Topology, base: Workload, demand: NetworkDemand, model: NicModel, count: int, *,
               top: int = 3, unknown_link_bytes_per_s: float | None = None) -> list[NicPlacement]:
    """The best ``top`` ways to put ``count`` NICs of ``model`` into ``topo``'s free slots (fastest first).

    Slots under the same parent with the same link are one choice (their
    results are equal); at most :data:`MAX_COMBINATIONS` combinations are
    solved (a note says when the list was cut). The new NICs join the data
    NICs the machine has; each runs at its port rate (``demand.nic_bytes_per_s``
    overrides every NIC's).
    """
    if count < 1:
        raise PlannerError(f"NICs to place: expected at least 1, got {count}")
    free = nic_slots(topo, model)
    if len(free) < count:
        raise PlannerError(f"{topo.name}: {count} NIC(s) of {model.name} need {count} free slot(s) of x8 or wider "
                           f"({', '.join(model.form_factors)}); the machine has {len(free)}")
    # slots alike (same parent, same width and generation) give equal results: try one of each group
    groups: dict[tuple, list[str]] = {}
    for s in free:
        up = topo.parent(s.id)
        groups.setdefault((up.id if up else None, s.attrs.get("width_lanes"), s.attrs.get("pcie_gen")),
                          []).append(s.id)
    combos = []
    for picks in itertools.combinations_with_replacement(sorted(groups), count):
        need = {g: picks.count(g) for g in picks}
        if all(len(groups[g]) >= k for g, k in need.items()):
            combos.append(tuple(s for g, k in sorted(need.items()) for s in groups[g][:k]))
    notes = []
    if len(combos) > MAX_COMBINATIONS:
        notes.append(f"{len(combos)} distinct slot combinations; the first {MAX_COMBINATIONS} were solved")
        combos = combos[:MAX_COMBINATIONS]
    out = []
    for slots in combos:
        placed = with_nics(topo, model, slots)  # beside the NICs the machine has
        res = solve_nodes(placed, base, demand, unknown_link_bytes_per_s=unknown_link_bytes_per_s)
        out.append(NicPlacement(slots, placed, res, tuple(notes)))
    # ties (another part of the machine binds): NICs that reach more GPUs without a CPU on the way first
    out.sort(key=lambda p: (round(p.result.seconds_per_iteration, 12),
                            -len({g for gs in p.result.gdr_paths.values() for g in gs}), p.slots))
    return out[:top]


__all__ = ["NIC_MODELS", "NetworkDemand", "NicModel", "NicPlacement", "NodesResult", "data_nics", "gdr_paths",
           "nic_slots", "place_nics", "port_rate", "remote_share", "solve_nodes", "with_nics"]
