"""Placement policies by name: the one table ``moment place --strategy`` and the placement workflow read.

A placement policy is a function ``policy(hotness, bins, **options) ->
DdakResult`` (:mod:`planner.placement`: ``hotness`` ``[n]`` non-negative,
``bins`` a sequence of :class:`~planner.placement.DdakBin`). Each is registered
in :data:`PLACEMENT_POLICIES` with what it takes besides (capability
``options``, a subset of ``pool``, ``seed``, ``progress``) and, for a policy
with a variant that keeps rows near the sockets that read them, that variant
(capability ``affinity``, a ``"module:attr"`` taking ``(hotness, bins,
affinity, **options)``). :func:`place_items` calls one by name. This module
imports nothing heavy, so the command line lists the names cheaply.

>>> PLACEMENT_POLICIES.names()
('ddak', 'hash', 'hot-first', 'random')
>>> import numpy as np
>>> from planner.placement import DdakBin
>>> bins = [DdakBin("gpu", "gpu", 1, 3.0), DdakBin("ssd", "ssd", 4, 1.0)]
>>> place_items("hot-first", np.array([1.0, 5.0, 2.0]), bins).bin_of.tolist()
[1, 0, 1]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from momentbase.registry import Registry, resolve
from planner.errors import PlannerError

if TYPE_CHECKING:
    import numpy as np

    from planner.placement import DdakBin, DdakResult
    from planner.progress import Progress

__all__ = ["OPTIONS", "PLACEMENT_POLICIES", "place_items"]

#: what :func:`place_items` can pass a policy besides hotness and bins (it passes those the policy names)
OPTIONS = ("pool", "seed", "progress")

PLACEMENT_POLICIES: Registry[Callable[..., DdakResult]] = Registry("placement strategy", PlannerError)
PLACEMENT_POLICIES.register("ddak", "planner.ddak:ddak", options=("pool", "progress"),
                            affinity="planner.affinity:ddak_affinity")
PLACEMENT_POLICIES.register("hash", "planner.baselines:hash_placement")
PLACEMENT_POLICIES.register("hot-first", "planner.baselines:hot_first_placement")
PLACEMENT_POLICIES.register("random", "planner.baselines:random_placement", options=("seed",))


def place_items(name: str, hotness: np.ndarray, bins: Sequence[DdakBin], *, pool: int = 100, seed: int = 0,
                # Any: each policy's own affinity structure, passed through
                progress: Progress | None = None, affinity: Any = None) -> DdakResult:
    """Place ``hotness`` (``[n]``) into ``bins`` with the policy called ``name``.

    ``pool`` (DDAK's pool of items), ``seed`` and ``progress`` go to the
    policies that take them (their ``options``). ``affinity`` (a
    :class:`planner.affinity.Affinity`): each item's reads by socket; a policy
    with an ``affinity`` variant then runs that instead, the others ignore it.
    """
    policy = PLACEMENT_POLICIES.get(name)
    caps = PLACEMENT_POLICIES.caps(name)
    given = {"pool": pool, "seed": seed, "progress": progress}
    options = {k: given[k] for k in caps.get("options", ())}
    if affinity is not None and caps.get("affinity"):
        return resolve(caps["affinity"])(hotness, bins, affinity, **options)
    return policy(hotness, bins, **options)
