"""Eviction policies of the caches that fill on access (:mod:`iostack.dyncache`), by name.

Each policy is one module implementing :class:`iostack.cachepolicy.base.EvictionPolicy`
and registered here as a lazily imported ``"module:Class"`` entry, so that the command line
lists the names (``moment train --cache-policy``) without importing numpy. ``static`` is the
placement's fill and nothing else (a miss is read through, never inserted); the others admit
every miss and choose victims as their names say (GraphBolt's ``cache_policy.h`` has the same
families: S3-FIFO, SIEVE, LRU, CLOCK).
"""

from __future__ import annotations

from iostack.errors import StoreError
from momentbase.registry import Registry

__all__ = ["CACHE_POLICIES", "DEFAULT_POLICY"]

#: name → :class:`~iostack.cachepolicy.base.EvictionPolicy` subclass (``admits``: it inserts misses)
CACHE_POLICIES: Registry = Registry("cache policy", StoreError)
CACHE_POLICIES.register("static", "iostack.cachepolicy.static:StaticPolicy", admits=False)
CACHE_POLICIES.register("lru", "iostack.cachepolicy.lru:LruPolicy", admits=True)
CACHE_POLICIES.register("clock", "iostack.cachepolicy.clock:ClockPolicy", admits=True)
CACHE_POLICIES.register("s3fifo", "iostack.cachepolicy.s3fifo:S3FifoPolicy", admits=True)

#: the policy a dynamic cache uses when none is named (chosen by tools/bench_dyncache.py)
DEFAULT_POLICY = "s3fifo"
