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

The package, one job a module: :mod:`~planner.flow.net` (the topology as a
flow network, shared by both models), :mod:`~planner.flow.maxflow` (the
paper's model), :mod:`~planner.flow.lp` (the concurrent model and the
tie-break LP), :mod:`~planner.flow.result` (:class:`FlowResult` and the
solvers' numbers turned into it); :data:`FLOW_MODELS` and :func:`solve` are here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from momentbase.registry import Registry
from planner.errors import PlannerError

if TYPE_CHECKING:
    from planner.flow.lp import solve_concurrent
    from planner.flow.maxflow import solve_maxflow
    from planner.flow.result import FlowResult
    from planner.topology.model import Topology
    from planner.workload import Workload

__all__ = ["FLOW_MODELS", "FlowResult", "solve", "solve_concurrent", "solve_maxflow"]

#: the flow models by name: ``model(topo, workload, **options) -> FlowResult``. Listing them
#: imports nothing (the command line's ``--model`` choices); a model loads when first solved.
# Any: lazily imported names and each flow model's own options
FLOW_MODELS: Registry[Any] = Registry("flow model", PlannerError)
FLOW_MODELS.register("maxflow", "planner.flow.maxflow:solve_maxflow")
FLOW_MODELS.register("concurrent", "planner.flow.lp:solve_concurrent")

# The solvers load on first use (PEP 562): the model names above must be listable without
# networkx and scipy (``moment --help`` imports nothing heavy).
_LAZY = {"FlowResult": "planner.flow.result", "solve_maxflow": "planner.flow.maxflow",
         "solve_concurrent": "planner.flow.lp"}


def __getattr__(name: str) -> Any:  # Any: lazily imported names and each flow model's own options
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def solve(topo: Topology, workload: Workload, model: str | Callable[..., FlowResult] = "maxflow",
          **options: Any) -> FlowResult:  # Any: lazily imported names and each flow model's own options
    """Solve ``workload`` on ``topo`` with the flow model ``model``: a name of :data:`FLOW_MODELS`, or the
    model itself (a function ``(topo, workload, **options) -> FlowResult``, as networkx's ``flow_func=``).

    ``options`` go to the model (``tie_break``, ``unknown_link_bytes_per_s``, ... for
    :func:`solve_maxflow` and :func:`solve_concurrent`).

    >>> solve(None, None, model="fastest")
    Traceback (most recent call last):
        ...
    planner.errors.PlannerError: unknown flow model 'fastest' (known: maxflow, concurrent)
    """
    return (model if callable(model) else FLOW_MODELS.get(model))(topo, workload, **options)
