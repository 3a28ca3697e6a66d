"""Planner: hardware topology → slot layout → data placement.

A library in its own right: its inputs are devices, links and demands, never
graph vertices, so that any workload moving data from storage devices to
accelerators can use it.
"""

from planner.errors import ParseError, PlannerError, TopologyError

__all__ = ["ParseError", "PlannerError", "TopologyError"]
