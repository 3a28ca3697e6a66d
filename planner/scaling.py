"""GPU-count scaling: the recommended layout and the classic layouts (a)-(d) per number of GPUs.

The paper's §4.6 scales Machines A and B from 1 to 4 GPUs and compares Moment's layout
with the classic layouts (c) and (d). :func:`scaling_table` plans the machine once per
GPU count (the SSDs and every other input unchanged) and keeps, per count, the best
layout's mean per-GPU inlet rate and each classic layout's; the speed-up of a column is
its aggregate rate (per-GPU rate × GPUs) at the largest count over that at the smallest,
the quantity the paper's "1→4 GPUs 2.26×" reports.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from planner.errors import PlannerError
from planner.plan import PlanResult, RankedLayout, choose_inventory, plan
from planner.topology.model import Topology
from planner.workload import Demand

__all__ = ["ScalingRow", "ScalingTable", "scaling_table", "CLASSIC_NAMES"]

#: the columns of the table beside the recommended layout (the paper's classic layouts)
CLASSIC_NAMES = ("a", "b", "c", "d")


@dataclass(frozen=True)
class ScalingRow:
    """One GPU count: the mean per-GPU inlet rate (bytes/s) of the best and each classic layout.

    A classic layout that does not apply at this count (no such arrangement of the
    devices in the slots) is ``None`` in ``classic_bytes_per_s`` with its reason in
    ``classic_notes``.
    """

    gpus: int
    best_bytes_per_s: float
    best_summary: str
    classic_bytes_per_s: dict[str, float | None]
    classic_notes: dict[str, str]

    def aggregate_bytes_per_s(self, column: str) -> float | None:
        """All GPUs together (per-GPU rate × GPUs) for ``column`` ('best' or a classic name)."""
        v = self.best_bytes_per_s if column == "best" else self.classic_bytes_per_s.get(column)
        return None if v is None else v * self.gpus


@dataclass(frozen=True)
class ScalingTable:
    """The rows, smallest GPU count first."""

    machine: str
    rows: tuple[ScalingRow, ...]

    def speedup(self, column: str) -> float | None:
        """Aggregate rate at the largest count over the smallest (None if either is missing)."""
        lo = self.rows[0].aggregate_bytes_per_s(column)
        hi = self.rows[-1].aggregate_bytes_per_s(column)
        return None if lo is None or hi is None else hi / lo


def _row(n: int, result: PlanResult) -> ScalingRow:
    from planner.plan import layout_summary

    classic: dict[str, float | None] = {}
    notes: dict[str, str] = {}
    for name in CLASSIC_NAMES:
        b = result.baselines.get(name)
        if isinstance(b, RankedLayout):
            classic[name] = b.mean_inlet_bytes_per_s
        else:
            classic[name] = None
            notes[name] = b if isinstance(b, str) else "not defined for this machine"
    return ScalingRow(n, result.best.mean_inlet_bytes_per_s, layout_summary(result.best.placed), classic, notes)


def scaling_table(
    topology: Topology,
    gpu_counts: Sequence[int],
    demand: Demand,
    *,
    spec: str | None = None,
    ssds: int | None = None,
    model: str = "maxflow",
    nvlink_pairs: Sequence[tuple[int, int]] = (),
    unknown_link_bytes_per_s: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ScalingTable:
    """Plan ``topology`` once per count of ``gpu_counts`` and tabulate best and classic layouts.

    Parameters
    ----------
    topology, demand, spec, ssds, model, unknown_link_bytes_per_s
        As for :func:`planner.plan.choose_inventory` and :func:`planner.plan.plan`.
    gpu_counts
        GPU counts, each ≥ 1, without repeats; the rows come out sorted.
    nvlink_pairs
        NVLink what-if pairs; a pair naming a GPU beyond a count is dropped for that count.
    progress
        ``progress(done, total)`` after each count.

    Raises
    ------
    PlannerError
        If ``gpu_counts`` is empty, repeats a count or holds a count below 1, or a plan fails.
    """
    counts = sorted(gpu_counts)
    if not counts:
        raise PlannerError("`gpu_counts` is empty: give at least one GPU count")
    if len(set(counts)) != len(counts) or counts[0] < 1:
        raise PlannerError(f"`gpu_counts` {list(gpu_counts)}: expected distinct counts, each at least 1")
    rows = []
    for i, n in enumerate(counts):
        topo, inventory = choose_inventory(topology, spec=spec, gpus=n, ssds=ssds)
        pairs = [(a, b) for a, b in nvlink_pairs if a < n and b < n]
        result = plan(topo, inventory, demand, model=model, nvlink_pairs=pairs,
                      unknown_link_bytes_per_s=unknown_link_bytes_per_s, tidy_best=False)
        rows.append(_row(n, result))
        if progress is not None:
            progress(i + 1, len(counts))
    return ScalingTable(topology.name, tuple(rows))
