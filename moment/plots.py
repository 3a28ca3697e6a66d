"""Pictures of results (matplotlib, PNG or SVG by the file's suffix): the CLI's output side.

Imported only by the commands that draw, so ``moment --help`` never loads matplotlib.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers
    import matplotlib.pyplot as plt

    return plt


def plot_emulation(result: Any, path: str | Path) -> Path:
    """Per-step I/O wait and compute of reader 0, and bytes per tier, of an :class:`~iostack.emulate.EmulateResult`."""
    plt = _pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 1]})
    steps = range(len(result.step_wait_s))
    a.bar(steps, result.step_compute_s, width=1.0, color="#4c72b0", label="compute (emulated)")
    a.bar(steps, result.step_wait_s, width=1.0, bottom=result.step_compute_s, color="#dd8452", label="I/O wait")
    a.set_xlabel("step (reader 0)")
    a.set_ylabel("seconds")
    a.set_title(f"{result.workload}: I/O wait {result.io_wait_share:.0%}, "
                f"accelerator utilisation {result.accelerator_utilisation:.0%}")
    a.legend(loc="upper right")
    kinds = list(result.tiers)
    b.bar(kinds, [result.tiers[k].bytes / 2**20 for k in kinds], color=["#55a868", "#8172b3", "#c44e52"][: len(kinds)])
    b.set_ylabel("MiB read")
    b.set_title("bytes per tier")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
