"""What a training run's metrics file says: time split, traffic per tier and bin, prediction.

``moment train --metrics FILE.jsonl`` appends one JSON record per line: a ``start``
record (the configuration), one ``step`` record per step and one ``epoch`` record per
epoch (times in seconds, ``tiers``: rows and bytes read from each tier). This module
reads such a file into a :class:`RunMetrics` and derives the figures ``moment report``
draws; it prints nothing and draws nothing.

Targets (what share of the reads each tier and bin should serve) come from the run itself
when its ``start`` record carries ``targets``, else from the placement it trained on
(``place.json`` in ``config.placement``). A record of kind ``prediction`` (a model's
forecast of the run) is optional: its figures are compared with what was measured when
there is one, and nothing is assumed about it otherwise.

>>> import json, tempfile, os
>>> recs = [{"kind": "start", "config": {}}, {"kind": "epoch", "epoch": 0, "epoch_s": 2.0, "compute_s": 1.5,
...          "allreduce_s": 0.1, "io_wait_s": 0.4, "sample_s": 0.3, "gather_s": 0.2,
...          "tiers": {"cpu": {"rows": 30, "bytes": 300}, "ssd": {"rows": 10, "bytes": 100}}}]
>>> with tempfile.TemporaryDirectory() as d:
...     p = os.path.join(d, "m.jsonl")
...     _ = open(p, "w").write("\\n".join(json.dumps(r) for r in recs) + "\\n")
...     run = read_metrics(p)
>>> [round(s, 2) for s in tier_shares(run.epochs[-1]).values()]
[0.75, 0.25]
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from momentbase.jsontypes import JsonObject
from training.errors import TrainingError

#: the parts of an epoch's time, as the trainer records them (seconds): on the training
#: thread (they add up to about the epoch's step time) and on the prefetch thread
FOREGROUND = ("compute_s", "allreduce_s", "io_wait_s")
BACKGROUND = ("sample_s", "gather_s")


class MetricsError(TrainingError):
    """A metrics file that cannot be read (missing, not JSON lines, no epoch)."""


@dataclass(frozen=True)
class RunMetrics:
    """One run of a metrics file: its ``start`` record (the latest, after a resume), the epoch records
    (the latest of each epoch number, in order), and any ``prediction`` records. ``run_id``: the id its
    records carry (``None`` in files written before records had one); ``number`` of ``runs``: where it
    stands among the runs appended to the file (1-based)."""

    path: Path
    start: JsonObject | None
    epochs: tuple[JsonObject, ...]
    steps: int
    predictions: tuple[JsonObject, ...]
    run_id: str | None = None
    number: int = 1
    runs: int = 1

    @property
    def name(self) -> str:
        """``run 2 of 3 (id)`` where the file holds several runs, else empty."""
        if self.runs == 1:
            return ""
        return f"run {self.number} of {self.runs}" + (f" ({self.run_id})" if self.run_id else "")


def _records(p: Path) -> list[JsonObject]:
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise MetricsError(f"{p}: no such metrics file (write one by training with `metrics_path={p}`)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MetricsError(f"{p}: not readable ({exc})") from None
    lines, out = text.splitlines(), []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            if i == len(lines):  # a run killed mid-write leaves a cut last line
                break
            raise MetricsError(f"{p}:{i}: not a JSON record; is this a training run's `metrics_path` file?") from None
        if not isinstance(rec, dict):
            raise MetricsError(f"{p}:{i}: expected a JSON object per line")
        out.append(rec)
    return out


def _group(records: list[JsonObject]) -> list[tuple[str | None, list[JsonObject]]]:
    """The records split into runs, in the order they began: by their ``run`` id; records without one
    (older files) start a new run at each ``start`` record that is not a resume."""
    groups: list[tuple[str | None, list[JsonObject]]] = []
    by_id: dict[str, list[JsonObject]] = {}
    legacy: list[JsonObject] | None = None
    for rec in records:
        rid = rec.get("run")
        if rid is not None:
            if str(rid) not in by_id:
                by_id[str(rid)] = []
                groups.append((str(rid), by_id[str(rid)]))
            by_id[str(rid)].append(rec)
            legacy = None
            continue
        resume = rec.get("start_epoch") or rec.get("start_step")
        new_run = rec.get("kind") == "start" and not resume and legacy is not None and \
            any(r.get("kind") == "start" for r in legacy)
        if legacy is None or new_run:
            legacy = []
            groups.append((None, legacy))
        legacy.append(rec)
    return groups


def read_runs(path: str | Path) -> list[RunMetrics]:
    """Every run of ``path`` (JSON lines, as ``moment train --metrics`` writes), in the order they began,
    runs that finished no epoch included (with no epochs); :class:`MetricsError` naming the file and
    line when it cannot be read."""
    p = Path(path)
    groups = _group(_records(p))
    runs = []
    for number, (rid, recs) in enumerate(groups, 1):
        start, epochs, preds, steps = None, {}, [], 0
        for rec in recs:
            kind = rec.get("kind")
            if kind == "start":
                start = rec
            elif kind == "epoch" and isinstance(rec.get("epoch"), int):
                epochs[rec["epoch"]] = rec  # a resumed run's epoch replaces the earlier one
            elif kind == "step":
                steps += 1
            elif kind == "prediction":
                preds.append(rec)
        runs.append(RunMetrics(p, start, tuple(epochs[k] for k in sorted(epochs)), steps, tuple(preds),
                               rid, number, len(groups)))
    return runs


def read_metrics(path: str | Path, run: int | None = None) -> RunMetrics:
    """Run number ``run`` (1-based; default: the last) of ``path``; :class:`MetricsError` naming the file
    when it cannot be read, holds no such run, or the run finished no epoch."""
    runs = read_runs(path)
    p = Path(path)
    if not runs:
        raise MetricsError(f"{p}: no epoch record (did the run finish an epoch?)")
    if run is not None and not 1 <= run <= len(runs):
        raise MetricsError(f"`run={run}`: {p} holds {len(runs)} run(s); expected 1 to {len(runs)}")
    chosen = runs[(run or len(runs)) - 1]
    if not chosen.epochs:
        done = [r.number for r in runs if r.epochs]
        hint = f"; run(s) {', '.join(map(str, done))} did (choose one with `run`)" if done else ""
        where = f" {chosen.name}" if chosen.name else ""
        raise MetricsError(f"{p}:{where} no epoch record (did the run finish an epoch?){hint}")
    return chosen


def time_split(epoch: JsonObject) -> dict[str, float]:
    """Seconds per part of one epoch record (missing parts are 0)."""
    return {k: float(epoch.get(k) or 0.0) for k in (*FOREGROUND, *BACKGROUND)}


def tier_shares(epoch: JsonObject) -> dict[str, float]:
    """Share of the rows read from each tier in one epoch record (``{}`` when none was recorded)."""
    rows = {t: float(v.get("rows", 0)) for t, v in (epoch.get("tiers") or {}).items() if isinstance(v, dict)}
    total = sum(rows.values())
    return {t: r / total for t, r in rows.items()} if total > 0 else {}


def bin_shares(epoch: JsonObject) -> dict[str, float]:
    """Share of the rows read from each bin, when the epoch record has ``bins`` (else ``{}``)."""
    rows = {str(b): float(v.get("rows", 0) if isinstance(v, dict) else v) for b, v in (epoch.get("bins") or {}).items()}
    total = sum(rows.values())
    return {b: r / total for b, r in rows.items()} if total > 0 else {}


def _place_report(run: RunMetrics) -> JsonObject | None:
    placement = ((run.start or {}).get("config") or {}).get("placement")
    if not placement:
        return None
    p = Path(placement)
    if not p.is_absolute() and not p.exists():
        p = run.path.parent / placement  # a relative path, from where the run was started
    try:
        return json.loads((p / "place.json").read_text())
    except (OSError, ValueError):
        return None


def placement_bins(run: RunMetrics) -> list[JsonObject]:
    """Per bin of the placement the run trained on: ``id``, ``kind``, ``target`` (share of reads the
    plan wants there) and ``expected`` (share the placement should draw, by its hotness); ``[]``
    without a readable ``place.json``."""
    rep = _place_report(run)
    if not rep:
        return []
    bins = rep.get("bins") or []
    expected = {b.get("id"): b.get("traffic_share") for b in (rep.get("report") or {}).get("bins") or []}
    out = []
    for i, b in enumerate(bins):
        out.append({"id": i, "kind": b.get("kind", "?"), "target": float(b.get("target_share") or 0.0),
                    "expected": expected.get(i)})
    return out


def tier_targets(run: RunMetrics) -> dict[str, float]:
    """Target share of the reads per tier: the ``start`` record's ``targets`` when it has them
    (``{tier: share}``), else the placement's bins summed per tier; ``{}`` when there are none."""
    given = (run.start or {}).get("targets")
    if isinstance(given, dict) and all(isinstance(v, (int, float)) for v in given.values()):
        return {str(k): float(v) for k, v in given.items()}
    out: dict[str, float] = {}
    for b in placement_bins(run):
        out[b["kind"]] = out.get(b["kind"], 0.0) + b["target"]
    total = sum(out.values())
    return {k: v / total for k, v in out.items()} if total > 0 else {}


def _numbers(d: object, prefix: str = "") -> dict[str, float]:
    """The finite numbers of a (nested) dict, by dotted key."""
    out: dict[str, float] = {}
    if not isinstance(d, dict):
        return out
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_numbers(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[f"{prefix}{k}"] = float(v)
    return out


def predicted_vs_measured(run: RunMetrics) -> list[tuple[str, float, float]]:
    """``(figure, predicted, measured)`` for every figure a ``prediction`` record forecasts and the
    run measured. A prediction gives its figures as ``predicted: {...}`` (or ``predicted_<name>``
    keys); the measured side is its ``measured: {...}`` (or ``measured_<name>``), else the last
    epoch's figure of the same name. Without such records, the last epoch's own ``prediction``
    (``moment train --capacities``: read seconds and bytes per tier). ``[]`` without either."""
    epoch_pred = run.epochs[-1].get("prediction")
    if not run.predictions and isinstance(epoch_pred, dict):
        # moment train's own: the last epoch's throughput against the plan's (training.throughput), and
        # its prediction per tier (training.prediction)
        out = _throughput_figures(run.epochs[-1].get("throughput"))
        for t in epoch_pred.get("tiers", ()):
            if t.get("predicted_s") is not None and t.get("measured_s"):
                out.append((f"{t['tier']} read s", float(t["predicted_s"]), float(t["measured_s"])))
            if t.get("measured_bytes"):
                out.append(
                    (f"{t['tier']} MB read", float(t["predicted_bytes"]) / 1e6, float(t["measured_bytes"]) / 1e6)
                )
        return out
    if not run.predictions:
        return []
    rec = run.predictions[-1]
    pred = _numbers(rec.get("predicted")) or {k[len("predicted_"):]: v for k, v in _numbers(rec).items()
                                              if k.startswith("predicted_")}
    meas = _numbers(rec.get("measured")) or {k[len("measured_"):]: v for k, v in _numbers(rec).items()
                                             if k.startswith("measured_")}
    last = _numbers(run.epochs[-1])
    out = []
    for name, value in pred.items():
        m = meas.get(name, last.get(name))
        if m is not None:
            out.append((name, value, m))
    return out


def _throughput_figures(t: object) -> list[tuple[str, float, float]]:
    """``(figure, predicted, measured)`` of an epoch's ``throughput`` record: GB/s and seeds/s, plan and profile."""
    if not isinstance(t, dict):
        return []
    out = []
    for src in ("plan", "profile"):
        if t.get(f"{src}_bytes_per_s"):
            out.append((f"feature GB/s ({src})", float(t[f"{src}_bytes_per_s"]) / 1e9,
                        float(t["measured_bytes_per_s"]) / 1e9))
            out.append((f"seeds/s ({src})", float(t[f"{src}_seeds_per_s"]), float(t["measured_seeds_per_s"])))
    return out


def summary(run: RunMetrics) -> list[str]:
    """A few lines for a reader: what ran, the last epoch's time split, traffic against targets, prediction."""
    last = run.epochs[-1]
    cfg = (run.start or {}).get("config") or {}
    lines = [f"{run.path}{': ' + run.name if run.name else ''}: {len(run.epochs)} epoch(s), "
             f"{run.steps} step record(s)"
             + (f", {cfg.get('model')} on {cfg.get('dataset')}" if cfg.get("model") else "")]
    t = time_split(last)
    fg = sum(t[k] for k in FOREGROUND) or 1.0
    lines.append(f"last epoch ({last['epoch']}): {float(last.get('epoch_s') or 0):.2f} s, "
                 f"{float(last.get('seeds_per_s') or 0):,.0f} seeds/s; training thread: "
                 + ", ".join(f"{k[:-2].replace('allreduce', 'all-reduce').replace('io_wait', 'I/O wait')} "
                             f"{t[k]:.2f} s ({t[k] / fg:.0%})" for k in FOREGROUND)
                 + f"; in the background: sample {t['sample_s']:.2f} s, gather {t['gather_s']:.2f} s")
    shares, targets = tier_shares(last), tier_targets(run)
    if shares:
        lines.append("reads per tier: " + ", ".join(
            f"{k} {v:.1%}" + (f" (target {targets[k]:.1%})" if k in targets else "") for k, v in shares.items()))
    pvm = predicted_vs_measured(run)
    if pvm:
        lines.append("predicted vs measured: " + ", ".join(
            f"{n} {p:.3g} vs {m:.3g}" + (f" ({m / p:.2f}×)" if p else "") for n, p, m in pvm[:6]))
    else:
        lines.append("no prediction in the metrics (nothing to compare the measured figures with)")
    if isinstance(last.get("throughput"), dict):
        from training.throughput import describe as in_paper_terms

        lines += [f"throughput: {line}" for line in in_paper_terms(last["throughput"])]
    if isinstance(last.get("contention"), dict):
        from training.contention import describe

        pred = last.get("prediction")
        lines.append("contention: " + describe(pred if isinstance(pred, dict) else None, last["contention"]))
    return lines
