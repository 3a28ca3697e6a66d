"""Training tasks by name: the one table ``moment train --task`` reads.

A task is a function ``run(spec, options, *, progress) -> TrainResult``: ``spec`` the
:class:`~training.specs.TrainSpec`, ``options`` the task's own settings (a mapping; empty for the
default), ``progress`` the record callback. ``node`` (node classification, the default) is
:func:`training.trainer.train`; ``link`` (link prediction on an edge-split dataset) is
:func:`training.link.train.train_link`. The table imports nothing heavy: the command line lists its
names without torch.

``hetero`` (node classification on the target type of a heterogeneous dataset, HeteroSAGE or
R-GCN) is :func:`training.hetero.train.train_hetero`.

>>> TASKS.names()
('node', 'link', 'hetero')
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from momentbase.registry import Registry
from training.errors import TrainingError

if TYPE_CHECKING:
    from training.specs import TrainSpec
    from training.trainer import TrainResult

__all__ = ["TASKS", "run_hetero", "run_link", "run_node"]

# Any: a task's run(spec, options, *, progress) -> TrainResult, named as strings to stay free of torch
TASKS: Registry[Callable[..., Any]] = Registry("training task", TrainingError)
TASKS.register("node", "training.tasks:run_node")
TASKS.register("link", "training.tasks:run_link")
TASKS.register("hetero", "training.tasks:run_hetero")


def run_node(spec: TrainSpec, options: Mapping[str, object], *, progress: Callable[[dict], None] | None = None
             ) -> TrainResult:
    """Node classification: :func:`training.trainer.train` (no options of its own)."""
    from training.trainer import train

    return train(spec, progress=progress)


def run_link(spec: TrainSpec, options: Mapping[str, object], *, progress: Callable[[dict], None] | None = None
             ) -> TrainResult:
    """Link prediction: :func:`training.link.train.train_link`, ``options`` the fields of its ``LinkSpec``."""
    from training.link.train import LinkSpec, train_link

    return train_link(spec, LinkSpec(**options), progress=progress)  # type: ignore[arg-type]


def run_hetero(spec: TrainSpec, options: Mapping[str, object], *, progress: Callable[[dict], None] | None = None
               ) -> TrainResult:
    """A heterogeneous dataset: :func:`training.hetero.train.train_hetero` (``spec.model.arch`` names the model)."""
    from training.hetero.train import train_hetero

    return train_hetero(spec, progress=progress)
