"""What a placement is: small frozen specs for :func:`training.place.run.place_dataset` and
:func:`training.place.nodes.place_sharded`, grouped by the code that reads them.

- :class:`TierSpec`: the caches and SSD directories the bins are built from
  (:func:`training.place.bins.build_bins`, the plan's targets for the caches);
- :class:`PolicySpec`: the placement policy, DDAK or a baseline, with its pool and seed
  (:func:`training.place.policy.place`);
- :class:`ShardSpec`: the split of the rows over nodes (:func:`training.place.nodes.place_sharded`);
- :class:`PlaceSpec`: the three, with the hotness to compute and how the rows are stored
  (``moment place``'s options, parsed).

Each checks its own fields when made and raises :class:`~training.place.bins.PlacingError`.

>>> spec = PlaceSpec(TierSpec(gpu_cache_bytes=1 << 20, ssd_dirs=["/ssd0", "/ssd1"]), PolicySpec("hash"))
>>> spec.tiers.ssd_dirs, spec.policy.strategy, spec.shards.nodes
(('/ssd0', '/ssd1'), 'hash', 1)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from iostack.vocab import STORAGE_DTYPES
from planner.policies import PLACEMENT_POLICIES
from training.hotness import HotnessSpec
from training.place.bins import PlacingError
from training.vocab import GPU_MODES

__all__ = ["PlaceSpec", "PolicySpec", "ShardSpec", "TierSpec"]


@dataclass(frozen=True)
class TierSpec:
    """The tiers a placement fills. ``gpu_cache_bytes``, ``cpu_cache_bytes``: the feature cache per GPU
    and per host memory (NUMA node; 0 = none). ``ssd_dirs``: one directory per SSD of the plan, in its
    order (one may repeat). ``gpu_mode``: ``replicate`` (the hottest rows on every GPU) or ``partition``
    (the GPU caches split across NVLink peers)."""

    gpu_cache_bytes: int = 0
    cpu_cache_bytes: int = 0
    ssd_dirs: Sequence[str | os.PathLike[str]] = ()
    gpu_mode: str = "replicate"

    def __post_init__(self) -> None:
        object.__setattr__(self, "ssd_dirs", tuple(os.fspath(d) for d in self.ssd_dirs))
        for name in ("gpu_cache_bytes", "cpu_cache_bytes"):
            if int(getattr(self, name)) < 0:
                raise PlacingError(f"`{name}` {getattr(self, name)}: expected a size in bytes >= 0")
        if self.gpu_mode not in GPU_MODES:
            raise PlacingError(f"`gpu_mode` {self.gpu_mode!r}: expected one of {', '.join(GPU_MODES)}")


@dataclass(frozen=True)
class PolicySpec:
    """The placement policy: ``strategy`` (``ddak`` or a baseline), DDAK's ``pool`` (rows; ``None``: its
    default) and the ``seed`` of the random choices; ``socket_aware``: where the plan's GPUs span sockets,
    keep rows near the socket whose GPUs read them (:mod:`training.place.sockets`)."""

    strategy: str = "ddak"
    pool: int | None = None
    seed: int = 0
    socket_aware: bool = True

    def __post_init__(self) -> None:
        if self.strategy not in PLACEMENT_POLICIES:
            raise PlacingError(f"`strategy` {self.strategy!r}: expected one of {', '.join(PLACEMENT_POLICIES)}")
        if self.pool is not None and int(self.pool) < 1:
            raise PlacingError(f"`pool` {self.pool}: expected at least 1")


@dataclass(frozen=True)
class ShardSpec:
    """The rows over ``nodes`` nodes (1: one machine), the ``hot_rows`` share of them (hottest first, 0..1)
    on ``replicas`` nodes each; ``partition``: a ``moment data partition`` output whose partitions own the rows
    (None: rows dealt by hotness, :func:`iostack.shards.shard_rows`); ``groups``: full replicas of the rows
    (DDStore's width), each over ``nodes / groups`` nodes that exchange rows only among themselves (with
    ``partition``: of ``nodes / groups`` parts, one a node of each group); ``halo_cache_bytes``: the locality cache
    each node's training will hold (its remote-cache budget), whose reads the placement leaves out of the reads a
    node serves (0: none)."""

    nodes: int = 1
    replicas: int = 1
    hot_rows: float = 0.05
    partition: str | None = None
    groups: int = 1
    halo_cache_bytes: int = 0

    def __post_init__(self) -> None:
        if int(self.nodes) < 1:
            raise PlacingError(f"`nodes` {self.nodes}: expected at least 1")
        if int(self.groups) < 1 or int(self.nodes) % int(self.groups):
            raise PlacingError(f"`groups` {self.groups}: replica groups split `nodes` {self.nodes} evenly; choose "
                               f"a divisor of {self.nodes}")
        size = int(self.nodes) // int(self.groups)
        if not 1 <= int(self.replicas) <= size:
            raise PlacingError(f"`replicas` {self.replicas}: expected 1 to `nodes` ({self.nodes}) over `groups` "
                               f"({self.groups}): a row is on at most every node of a group")
        if self.partition is not None and size < 2:
            raise PlacingError(f"`partition` {self.partition}: ownership by partition needs 2 or more nodes "
                               + (f"per replica group (`nodes` {self.nodes} over `groups` {self.groups} gives "
                                  f"{size})" if self.groups > 1 else "(`nodes` of 2 or more)"))
        if not 0.0 <= self.hot_rows <= 1.0:
            raise PlacingError(f"`hot_rows` {self.hot_rows}: expected a share of the rows between 0 and 1")
        if int(self.halo_cache_bytes) < 0:
            raise PlacingError(f"`halo_cache_bytes` {self.halo_cache_bytes}: expected a size in bytes >= 0")
        if self.halo_cache_bytes and self.partition is None:
            raise PlacingError(f"`halo_cache_bytes` {self.halo_cache_bytes}: the halo cache is a partition's; give "
                               "`partition` too, or leave it out")
        if self.halo_cache_bytes and self.groups > 1:
            raise PlacingError(f"`halo_cache_bytes` {self.halo_cache_bytes}: a halo cache is not chosen for replica "
                               f"groups yet (`groups` {self.groups}); leave one of them out")

    def hot_row_count(self, num_rows: int) -> int:
        """The hot share as a row count (rounded).

        >>> ShardSpec(2, 2, 0.05).hot_row_count(2708)
        135
        """
        return int(round(self.hot_rows * num_rows))


@dataclass(frozen=True)
class PlaceSpec:
    """A placement: its tiers, policy and split over nodes; ``hotness``, how hot each row is (default:
    pre-sampling); ``feature_dtype``, the rows stored as ``float32``, ``float16``, ``bfloat16`` or ``int8``
    (one machine only; ``None``: their own type); ``in_place``, a one-SSD plan's bin is the dataset's own
    ``features.npy``, read where it is (one machine, rows in their own type)."""

    tiers: TierSpec = field(default_factory=TierSpec)
    policy: PolicySpec = field(default_factory=PolicySpec)
    shards: ShardSpec = field(default_factory=ShardSpec)
    hotness: HotnessSpec = field(default_factory=HotnessSpec)
    feature_dtype: str | None = None
    in_place: bool = False

    def __post_init__(self) -> None:
        for name, cls in (("tiers", TierSpec), ("policy", PolicySpec), ("shards", ShardSpec),
                          ("hotness", HotnessSpec)):
            if not isinstance(getattr(self, name), cls):
                raise PlacingError(f"`{name}`: expected a {cls.__name__}, got {type(getattr(self, name)).__name__}")
        if self.feature_dtype is not None and self.feature_dtype not in STORAGE_DTYPES:
            raise PlacingError(f"`feature_dtype` {self.feature_dtype!r}: expected one of {', '.join(STORAGE_DTYPES)}")
        nodes = self.shards.nodes
        if self.feature_dtype is not None and nodes > 1:
            raise PlacingError("`feature_dtype` with `nodes` > 1: a sharded placement holds the features' own type; "
                               "leave out `feature_dtype`")
        if self.in_place and (nodes > 1 or self.feature_dtype is not None):
            raise PlacingError("`in_place` with " + ("`nodes` > 1" if nodes > 1 else "`feature_dtype`")
                               + ": the dataset's file holds every row in its own type; leave out one of them")
