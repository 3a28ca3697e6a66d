"""Hotness methods by name: the one table ``moment place --hotness`` and :func:`~training.hotness.compute_hotness` read.

A hotness method is a function ``method(ds, spec, *, progress) -> (values,
epochs_covered)``: ``ds`` a :class:`~training.data.Dataset`, ``spec`` the
:class:`~training.hotness.HotnessSpec` asked for, ``values`` a non-negative
``[num_nodes]`` array (how often each row will be read), ``epochs_covered``
the epochs a read count amounts to (``None`` when the values are not read
counts). Each is registered in :data:`HOTNESS_METHODS` with capability
``params``: the :class:`~training.hotness.HotnessSpec` fields its result
depends on (saved with it, so a cached hotness of other parameters is not
reused) and optionally ``sampled``: its values are one random draw of
training's reads, so another ``seed`` gives an independent draw (``moment
place`` measures its placement's shares on one). The table imports nothing heavy: the command line lists its names
without numpy.

>>> HOTNESS_METHODS.names()
('presample', 'degree', 'pagerank')
>>> HOTNESS_METHODS.caps("pagerank")["params"]
('damping', 'tol', 'max_iter')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from momentbase.registry import Registry
from training.errors import TrainingError

__all__ = ["HOTNESS_METHODS"]

# Any: each method's own hotness array or tensor
HOTNESS_METHODS: Registry[Callable[..., tuple[Any, float | None]]] = Registry("hotness method", TrainingError)
HOTNESS_METHODS.register("presample", "training.hotness:presample_counts", sampled=True,
                         params=("fanouts", "batch_size", "epochs", "num_batches", "seed"))
HOTNESS_METHODS.register("degree", "training.hotness:degree_hotness", params=())
HOTNESS_METHODS.register("pagerank", "training.hotness:pagerank_hotness", params=("damping", "tol", "max_iter"))
