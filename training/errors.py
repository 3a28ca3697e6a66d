"""The base of training's user-facing errors: :class:`TrainingError`, a :class:`~momentbase.errors.MomentError`.

Each module keeps its own subclass (``DatasetError``, ``SamplerError``,
``TrainError``, ...) so a caller can catch one job's errors or all of them.
"""

from __future__ import annotations

from momentbase.errors import MomentError


class TrainingError(MomentError):
    """Base class of training's user-facing errors: bad data, options or peers; one-line messages."""


class TrainError(TrainingError):
    """A training run that cannot start or continue: bad config, dataset, placement or checkpoint."""
