"""What a workload asks of the machine: who reads how much, from where.

The flow models (:mod:`planner.flow`) know nothing of graphs or vertices. A
workload is a set of **consumers** (accelerators, named by their node id in
the :class:`~planner.topology.model.Topology`), each reading
``demand_bytes`` per iteration, and a list of **tiers** of **stores** that
serve those reads. A tier can absorb at most ``max_share`` of all accesses
(what its caches can hold of the hotness curve); the shares of the tiers
together must reach 1.

A tier is either *sharded* (the default: each row sits in exactly one store
of the tier, and every consumer reads the tier's share spread over its
stores, the split being for the planner to choose) or *replicated* (every
consumer holds the same rows in a store on its own node, e.g. a GPU cache of
the hottest rows, and reads the tier's share from there without touching the
interconnect).

List tiers fastest first: when several splits between tiers reach the same
time, the flow models prefer the earlier tiers.

A non-GNN example, an LLM data loader: 8 GPUs each read 2 GB of token shards
per step from 4 NVMe SSDs (7 GB/s each), and the page cache of the two NUMA
nodes absorbs 30% of the reads.

>>> gpus = [Consumer(f"gpu{i}", demand_bytes=2e9) for i in range(8)]
>>> cache = Tier("page-cache", [Store("mem0", "mem0"), Store("mem1", "mem1")], max_share=0.3)
>>> ssds = Tier("ssd", [Store(f"ssd{i}", f"nvme{i}", read_bytes_per_s=7e9) for i in range(4)],
...             max_share=1.0)
>>> w = Workload(gpus, [cache, ssds], name="llm-loader")
>>> w.total_demand_bytes
16000000000.0
>>> [s.id for s in w.stores][:3]
['mem0', 'mem1', 'ssd0']
>>> Workload(gpus, [cache])
Traceback (most recent call last):
    ...
planner.errors.PlannerError: workload 'unnamed': the tiers can absorb at most 30% of the accesses (page-cache 30%), they must reach 100%; raise a tier's max_share or add a tier (an SSD tier usually takes max_share=1.0)
"""  # noqa: E501 (a doctest's or a capture's line, as printed)

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from planner.errors import PlannerError

__all__ = ["Consumer", "Demand", "Store", "Tier", "Workload"]

#: slack on "shares sum to at least 1", for shares written as decimals
SHARE_TOLERANCE = 1e-9


def _check_name(what: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise PlannerError(f"{what} must be a non-empty string, got {value!r}")


def _positive(what: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PlannerError(f"{what} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v <= 0:
        raise PlannerError(f"{what} must be a positive finite number, got {value!r}")
    return v


@dataclass(frozen=True)
class Consumer:
    """A device that reads ``demand_bytes`` per iteration (a GPU, usually).

    ``node_id`` names a node of the topology; whether it exists is checked
    when a flow model is solved.

    >>> Consumer("pci:0000:17:00.0", 1.5e9).demand_bytes
    1500000000.0
    >>> Consumer("gpu0", 0)
    Traceback (most recent call last):
        ...
    planner.errors.PlannerError: consumer 'gpu0': demand_bytes must be a positive finite number, got 0
    """

    node_id: str
    demand_bytes: float

    def __post_init__(self) -> None:
        _check_name("a consumer's node_id", self.node_id)
        object.__setattr__(
            self, "demand_bytes", _positive(f"consumer {self.node_id!r}: demand_bytes", self.demand_bytes)
        )


@dataclass(frozen=True)
class Store:
    """Where a tier's data physically sits.

    ``node_id`` is an NVMe node (``read_bytes_per_s`` = the device's own read
    limit, e.g. 6 GiB/s, which may be below its PCIe link), a memory node
    (the DRAM of a NUMA node; its memory link bounds it) or a GPU node (its
    HBM). ``read_bytes_per_s=None`` means the store is bounded only by its
    links. ``id`` names the store in results (the DDAK bins).

    >>> Store("ssd0", "pci:0000:c1:00.0", read_bytes_per_s=6 * 2**30).read_bytes_per_s
    6442450944.0
    """

    id: str
    node_id: str
    read_bytes_per_s: float | None = None

    def __post_init__(self) -> None:
        _check_name("a store's id", self.id)
        _check_name(f"store {self.id!r}: node_id", self.node_id)
        if self.read_bytes_per_s is not None:
            object.__setattr__(
                self,
                "read_bytes_per_s",
                _positive(f"store {self.id!r}: read_bytes_per_s", self.read_bytes_per_s),
            )


@dataclass(frozen=True)
class Tier:
    """A set of stores that together absorb at most ``max_share`` of all accesses.

    ``max_share`` in [0, 1] follows from the tier's capacity and the hotness
    curve (a cache holding the hottest 5% of rows may absorb 40% of reads); a
    tier holding everything (the SSDs) has ``max_share=1.0``. With
    ``replicated=True`` every consumer reads the tier's share from the store
    on its own node (each GPU caching the same hottest rows); otherwise each
    row sits once and every consumer reads the share spread over the stores.

    >>> t = Tier("gpu-cache", [Store("hbm0", "gpu0"), Store("hbm1", "gpu1")], 0.25, replicated=True)
    >>> len(t.stores), t.max_share
    (2, 0.25)
    >>> Tier("cpu", [Store("m0", "mem0")], max_share=1.5)
    Traceback (most recent call last):
        ...
    planner.errors.PlannerError: tier 'cpu': max_share must be in [0, 1], got 1.5
    """

    name: str
    stores: tuple[Store, ...]
    max_share: float
    replicated: bool = False

    def __post_init__(self) -> None:
        _check_name("a tier's name", self.name)
        stores = _as_tuple(self.stores, Store, f"tier {self.name!r}: stores")
        if not stores:
            raise PlannerError(f"tier {self.name!r} has no stores")
        ids = [s.id for s in stores]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise PlannerError(f"tier {self.name!r}: store ids repeated: {', '.join(dup)}")
        if self.replicated:
            nodes = [s.node_id for s in stores]
            dup = sorted({n for n in nodes if nodes.count(n) > 1})
            if dup:
                raise PlannerError(
                    f"replicated tier {self.name!r}: several stores on node(s) {', '.join(dup)}; "
                    "a replicated tier has one store per consumer"
                )
        share = self.max_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= share <= 1.0:
            raise PlannerError(f"tier {self.name!r}: max_share must be in [0, 1], got {share!r}")
        object.__setattr__(self, "stores", stores)
        object.__setattr__(self, "max_share", float(share))
        object.__setattr__(self, "replicated", bool(self.replicated))


@dataclass(frozen=True)
class Workload:
    """Consumers and the tiers that serve them (see the module docstring)."""

    consumers: tuple[Consumer, ...]
    tiers: tuple[Tier, ...]
    name: str = ""

    def __post_init__(self) -> None:
        label = self.name or "unnamed"
        consumers = _as_tuple(self.consumers, Consumer, f"workload {label!r}: consumers")
        tiers = _as_tuple(self.tiers, Tier, f"workload {label!r}: tiers")
        if not consumers:
            raise PlannerError(f"workload {label!r} has no consumers")
        if not tiers:
            raise PlannerError(f"workload {label!r} has no tiers")
        nodes = [c.node_id for c in consumers]
        dup = sorted({n for n in nodes if nodes.count(n) > 1})
        if dup:
            raise PlannerError(f"workload {label!r}: several consumers on node(s) {', '.join(dup)}")
        names = [t.name for t in tiers]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise PlannerError(f"workload {label!r}: tier names repeated: {', '.join(dup)}")
        ids = [s.id for t in tiers for s in t.stores]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise PlannerError(
                f"workload {label!r}: store ids repeated across tiers: {', '.join(dup)}"
            )
        total = sum(t.max_share for t in tiers)
        if total < 1.0 - SHARE_TOLERANCE:
            parts = ", ".join(f"{t.name} {t.max_share:.0%}" for t in tiers)
            raise PlannerError(
                f"workload {label!r}: the tiers can absorb at most {total:.0%} of the accesses "
                f"({parts}), they must reach 100%; raise a tier's max_share or add a tier "
                "(an SSD tier usually takes max_share=1.0)"
            )
        object.__setattr__(self, "consumers", consumers)
        object.__setattr__(self, "tiers", tiers)

    @property
    def total_demand_bytes(self) -> float:
        """Bytes read per iteration by all consumers together."""
        return float(sum(c.demand_bytes for c in self.consumers))

    @property
    def stores(self) -> tuple[Store, ...]:
        """Every store, tier by tier."""
        return tuple(s for t in self.tiers for s in t.stores)

    def tier_of(self, store_id: str) -> Tier:
        """The tier holding the store ``store_id``."""
        for t in self.tiers:
            if any(s.id == store_id for s in t.stores):
                return t
        raise PlannerError(f"workload {self.name or 'unnamed'!r} has no store {store_id!r}")


def _as_tuple(items: Iterable[object], cls: type, what: str) -> tuple:
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise PlannerError(f"{what} must be a sequence of {cls.__name__}, got {items!r}")
    out = tuple(items)
    for it in out:
        if not isinstance(it, cls):
            raise PlannerError(f"{what} must hold {cls.__name__} objects, got {it!r}")
    return out


@dataclass(frozen=True)
class Demand:
    """What every accelerator reads per iteration, and where it can come from.

    ``bytes_per_consumer`` is per accelerator and per iteration (bytes).
    ``accelerator_cache_share``: share of reads served by a cache replicated
    on every accelerator (its own memory, no interconnect traffic);
    ``host_memory_share``: share served by host memory, each row held once
    across the NUMA nodes; the storage devices serve the rest. Shares are
    upper bounds the flow model may use, from cache sizes × hotness curve.
    """

    bytes_per_consumer: float
    accelerator_cache_share: float = 0.0
    host_memory_share: float = 0.0

    def __post_init__(self) -> None:
        b = self.bytes_per_consumer
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or b <= 0:
            raise PlannerError(f"demand per accelerator must be a positive number of bytes, got {b!r}")
        for name in ("accelerator_cache_share", "host_memory_share"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise PlannerError(f"{name.replace('_', ' ')} must be in [0, 1], got {v!r}")
        if self.accelerator_cache_share + self.host_memory_share > 1.0 + 1e-9:
            raise PlannerError(
                "accelerator cache share + host memory share exceed 1: "
                f"{self.accelerator_cache_share} + {self.host_memory_share}"
            )
