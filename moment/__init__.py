"""Moment: plan, place and train out-of-core GNNs on one multi-GPU server."""

from momentbase import __version__

__all__ = ["__version__"]
