"""Moment: plan, place and train out-of-core GNNs on one multi-GPU server."""

__version__ = "0.1.0"
