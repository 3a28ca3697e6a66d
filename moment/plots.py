"""Pictures of results (matplotlib, PNG or SVG by the file's suffix): the CLI's output side.

Imported only by the commands that draw, so ``moment --help`` never loads matplotlib.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from iostack.bench.emulate import EmulateResult
    from training.runreport import RunMetrics


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers
    matplotlib.rcParams["svg.fonttype"] = "none"  # SVG text stays text: searchable, selectable, smaller
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Figure, path: Path) -> None:
    """``fig`` to ``path`` through a temporary sibling renamed into place: a disk that fills while
    writing leaves no half picture (the previous one, if any, stays); the error goes up."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        fig.savefig(tmp, dpi=110, format=path.suffix.lstrip(".").lower() or None)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def plot_emulation(result: EmulateResult, path: str | Path) -> Path:
    """Per-step I/O wait and compute of reader 0, and bytes per tier, of an
    :class:`~iostack.bench.emulate.EmulateResult`."""
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
    try:
        _save(fig, out)
    finally:
        plt.close(fig)
    return out


_PARTS = {"compute_s": ("compute", "#4c72b0"), "allreduce_s": ("all-reduce", "#8172b3"),
          "io_wait_s": ("I/O wait", "#dd8452"), "sample_s": ("sample (background)", "#55a868"),
          "gather_s": ("gather (background)", "#c44e52")}


def _time_panel(ax, run: RunMetrics) -> None:
    from training.runreport import BACKGROUND, FOREGROUND, time_split

    epochs = [e["epoch"] for e in run.epochs]
    splits = [time_split(e) for e in run.epochs]
    x = list(range(len(epochs)))
    w = 0.38
    for group, offset in ((FOREGROUND, -w / 2), (BACKGROUND, w / 2)):
        bottom = [0.0] * len(x)
        for k in group:
            vals = [s[k] for s in splits]
            label, color = _PARTS[k]
            ax.bar([i + offset for i in x], vals, w, bottom=bottom, color=color, label=label,
                   hatch="//" if k in BACKGROUND else None, edgecolor="white", linewidth=0.5)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.hlines([float(e.get("epoch_s") or 0) for e in run.epochs], [i - w for i in x], [i + w for i in x],
              colors="k", linewidth=2, label="epoch time (with evaluation)")
    ax.set_xticks(x, [str(e) for e in epochs])
    ax.set_xlabel("epoch")
    ax.set_ylabel("seconds")
    ax.set_title("time per epoch: training thread (left) and prefetch thread (right)", fontsize=10)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3, frameon=False)


def _share_panel(ax, title: str, measured: dict[str, float], target: dict[str, float],
                 expected: dict[str, float] | None = None) -> None:
    names = list(dict.fromkeys([*target, *measured]))
    x = list(range(len(names)))
    series = [("measured", measured, "#4c72b0"), ("placement expects", expected or {}, "#64b5cd"),
              ("target (plan)", target, "#c44e52")]
    series = [s for s in series if s[1]]
    w = 0.8 / max(1, len(series))
    for i, (label, vals, color) in enumerate(series):
        pos = [j + (i - (len(series) - 1) / 2) * w for j in x]
        ax.bar(pos, [100 * vals.get(n, 0.0) for n in names], w, color=color, label=label)
    ax.set_xticks(x, names, rotation=0 if len(names) <= 6 else 60, fontsize=8)
    ax.set_xlabel("bin (id, tier)" if len(names) > 6 or any(" " in n for n in names) else "tier")
    ax.set_ylabel("% of rows read")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)


def _prediction_panel(ax, pvm: list[tuple[str, float, float]]) -> list[float]:
    """The bars of measured / predicted per figure, labelled; the ratios (labels placed by :func:`_fit_labels`)."""
    names = [n for n, _, _ in pvm]
    ratio = [m / p if p else float("nan") for _, p, m in pvm]
    ax.barh(names, ratio, color=["#55a868" if 0.8 <= r <= 1.25 else "#dd8452" for r in ratio])
    ax.axvline(1.0, color="k", lw=1)
    top = max([r for r in ratio if r == r] + [1.0])
    ax.set_xlim(0, top * 1.15)
    for i, (_, p, m) in enumerate(pvm):
        ax.text(0.0, i, f"{m:.3g} measured / {p:.3g} predicted", va="center", fontsize=7, gid="value-label")
    ax.set_xlabel("measured / predicted")
    ax.set_title("predicted vs measured (1 = exact)", fontsize=10)
    return ratio


def _fit_labels(ax, ratio: list[float]) -> None:
    """Put each bar's label inside its bar (white) where its measured width fits, else just past the bar's
    end (black), widening the x axis until every label outside ends inside the panel.

    Run after the layout is final (the panel's width in pixels decides what fits): text widths are
    measured with the figure's renderer, in pixels, which do not change with the axis limits.
    """
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    labels = [t for t in ax.texts if t.get_gid() == "value-label"]
    width_px = ax.get_window_extent(renderer).width
    text_px = [t.get_window_extent(renderer).width for t in labels]
    pad_px = 4.0
    xmax = ax.get_xlim()[1]
    for _ in range(4):  # a wider axis shrinks the bars: settle which labels fit inside, then the axis
        px_per_x = width_px / xmax
        inside = [r == r and 2 * pad_px + w <= r * px_per_x for r, w in zip(ratio, text_px, strict=True)]
        need = max([xmax] + [((r if r == r else 0.0) * px_per_x + 2 * pad_px + w) / px_per_x
                             for r, w, ins in zip(ratio, text_px, inside, strict=True) if not ins])
        if need <= xmax:
            break
        xmax = need * 1.02
    ax.set_xlim(0, xmax)
    px_per_x = width_px / xmax
    for t, r, ins in zip(labels, ratio, inside, strict=True):
        end = r if r == r else 0.0
        t.set_x(pad_px / px_per_x if ins else end + pad_px / px_per_x)
        t.set_color("white" if ins else "black")


def plot_report(run: RunMetrics, out_dir: str | Path, formats: tuple[str, ...] = ("png", "svg")) -> list[Path]:
    """The pictures of a :class:`training.runreport.RunMetrics`: the time split per epoch, reads per
    tier (and per bin) against the plan's targets when known, and predicted vs measured when the
    metrics hold a prediction; one figure, written as ``report.<fmt>`` in ``out_dir`` per format."""
    from training.runreport import (
        bin_shares,
        placement_bins,
        predicted_vs_measured,
        tier_shares,
        tier_targets,
    )

    plt = _pyplot()
    last = run.epochs[-1]
    panels = ["time"]
    tiers, targets = tier_shares(last), tier_targets(run)
    if tiers or targets:
        panels.append("tiers")
    pbins, measured_bins = placement_bins(run), bin_shares(last)
    if pbins or measured_bins:
        panels.append("bins")
    pvm = predicted_vs_measured(run)
    if pvm:
        panels.append("prediction")
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.8), squeeze=False)
    ratio: list[float] = []
    for ax, what in zip(axes[0], panels, strict=True):
        if what == "time":
            _time_panel(ax, run)
        elif what == "tiers":
            _share_panel(ax, f"reads per tier, epoch {last['epoch']}", tiers, targets)
        elif what == "bins":
            label = {str(b["id"]): f"{b['id']} {b['kind']}" for b in pbins}
            _share_panel(ax, "reads per bin" + ("" if measured_bins else " (placement's own estimate)"),
                         {label.get(k, k): v for k, v in measured_bins.items()},
                         {label[str(b["id"])]: b["target"] for b in pbins},
                         {label[str(b["id"])]: b["expected"] for b in pbins if b["expected"] is not None})
        else:
            ratio = _prediction_panel(ax, pvm)
    cfg = (run.start or {}).get("config") or {}
    fig.suptitle(f"{run.path.name}" + (f": {cfg.get('model')} on {Path(str(cfg.get('dataset'))).name}"
                                         if cfg.get("model") else ""), fontsize=11)
    fig.tight_layout()
    if pvm:
        _fit_labels(axes[0][-1], ratio)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    try:
        for fmt in formats:
            p = out / f"report.{fmt}"
            _save(fig, p)
            paths.append(p)
    finally:
        plt.close(fig)
    return paths
