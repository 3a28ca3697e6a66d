"""`moment report METRICS`: the metrics file read back, plotted and summarised; the dataset check `moment train`
prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moment.cli import main
from training.runreport import predicted_vs_measured, read_metrics, tier_targets

PNG = b"\x89PNG\r\n\x1a\n"


def _epoch(e: int, **extra) -> dict:
    return {"kind": "epoch", "epoch": e, "epoch_s": 2.0, "seeds_per_s": 500.0, "compute_s": 1.2,
            "allreduce_s": 0.1, "io_wait_s": 0.5, "sample_s": 0.6, "gather_s": 0.4, "io_wait_share": 0.25,
            "tiers": {"gpu": {"rows": 50, "bytes": 500}, "cpu": {"rows": 30, "bytes": 300},
                      "ssd": {"rows": 20, "bytes": 200}}, **extra}


def _write(path: Path, records: list[dict], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


@pytest.fixture
def placed(tmp_path) -> Path:
    """A placement directory with a place.json as `moment place` writes it (the fields the report reads)."""
    d = tmp_path / "placement"
    d.mkdir()
    (d / "place.json").write_text(json.dumps({
        "bins": [{"kind": "gpu", "target_share": 0.4}, {"kind": "cpu", "target_share": 0.35},
                 {"kind": "ssd", "target_share": 0.15}, {"kind": "ssd", "target_share": 0.10}],
        "report": {"bins": [{"id": 0, "traffic_share": 0.41}, {"id": 1, "traffic_share": 0.33},
                            {"id": 2, "traffic_share": 0.16}, {"id": 3, "traffic_share": 0.10}]}}))
    return d


def test_report_without_prediction_plots_and_summarises(tmp_path, placed, capsys):
    m = _write(tmp_path / "m.jsonl", [{"kind": "start", "config": {"model": "sage", "dataset": "g",
                                                                   "placement": str(placed)}},
                                      _epoch(0), {"kind": "step", "epoch": 1, "step": 0}, _epoch(1)],
               tail='{"kind": "step", "ep')  # a run killed mid-write: the cut last line is skipped
    run = read_metrics(m)
    assert [e["epoch"] for e in run.epochs] == [0, 1] and predicted_vs_measured(run) == []
    assert tier_targets(run) == pytest.approx({"gpu": 0.4, "cpu": 0.35, "ssd": 0.25})
    assert main(["report", str(m), "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "gpu 50.0% (target 40.0%)" in out and "ssd 20.0% (target 25.0%)" in out
    assert "I/O wait 0.50 s (28%)" in out and "no prediction" in out
    assert (tmp_path / "r" / "report.png").read_bytes()[:8] == PNG
    svg = (tmp_path / "r" / "report.svg").read_text()
    assert "reads per tier" in svg and "reads per bin" in svg and "predicted vs measured" not in svg


@pytest.mark.parametrize("prediction", [
    {"kind": "prediction", "predicted": {"epoch_s": 1.6, "io_wait_share": 0.2}},  # measured: the last epoch's
    {"kind": "prediction", "predicted_epoch_s": 1.6, "predicted_io_wait_share": 0.2, "measured_epoch_s": 2.0},
])
def test_a_prediction_record_is_compared_with_what_was_measured(tmp_path, prediction, capsys):
    m = _write(tmp_path / "m.jsonl", [{"kind": "start", "config": {}}, _epoch(0), prediction])
    pairs = {n: (p, v) for n, p, v in predicted_vs_measured(read_metrics(m))}
    assert pairs["epoch_s"] == (1.6, 2.0) and pairs["io_wait_share"] == (0.2, 0.25)
    assert main(["report", str(m), "--out", str(tmp_path / "r"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"figure": "epoch_s", "predicted": 1.6, "measured": 2.0} in data["predicted_vs_measured"]
    assert data["tier_targets"] == {}  # no placement, no targets: nothing invented
    assert "predicted vs measured" in (tmp_path / "r" / "report.svg").read_text()


@pytest.mark.parametrize("content,message", [
    (None, "no such metrics file"),
    ('{"kind": "start"}\nnot json\n{"kind": "epoch", "epoch": 0}\n', ":2: not a JSON record"),
    ('{"kind": "start", "config": {}}\n', "no epoch record"),
])
def test_bad_metrics_files_are_one_line_errors(tmp_path, content, message, capsys):
    m = tmp_path / "m.jsonl"
    if content is not None:
        m.write_text(content)
    assert main(["report", str(m)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not (tmp_path / "m-report").exists()


def test_train_notes_the_dataset_integrity_check_and_its_metrics_make_a_report(tmp_path, capsys):
    g = tmp_path / "g"
    assert main(["data", "synth", str(g), "--nodes", "1500", "--edges", "12000", "--feature-dim", "8",
                 "--train-share", "0.2", "--quiet"]) == 0
    train = ["train", "--dataset", str(g), "--fanouts", "5", "--batch-size", "128", "--hidden", "16"]
    assert main([*train, "--metrics", str(tmp_path / "m.jsonl")]) == 0
    assert "dataset: CRC-32 verified" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "m.jsonl")]) == 0
    assert "last epoch (0)" in capsys.readouterr().out
    assert (tmp_path / "m-report" / "report.png").read_bytes()[:8] == PNG
    meta = json.loads((g / "meta.json").read_text())
    del meta["checksums"]  # as a dataset written before checksums were recorded
    (g / "meta.json").write_text(json.dumps(meta))
    assert main(train) == 0
    assert "dataset: no checksums" in capsys.readouterr().err


def test_the_prediction_panels_labels_fit_their_bars_or_sit_past_them(tmp_path, monkeypatch):
    """Each value label lies inside its bar (white) or wholly past the bar's end inside the panel (black):
    they used to start inside every bar and run past short ones, white on white (issue 28)."""
    from moment import plots

    m = _write(tmp_path / "m.jsonl", [{"kind": "start", "config": {}}, _epoch(0), {
        "kind": "prediction", "predicted": {"epoch_s": 1.6, "io_wait_share": 5.0, "seeds_per_s": 480.0}}])
    figs = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figs.append(fig))
    plots.plot_report(read_metrics(m), tmp_path / "r", formats=("png",))
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    ax = figs[0].axes[-1]
    renderer = FigureCanvasAgg(figs[0]).get_renderer()  # the figure was closed: a canvas of the same size
    labels = [t for t in ax.texts if " measured / " in t.get_text()]
    bars = ax.patches
    assert len(labels) == len(bars) == 3
    panel = ax.get_window_extent(renderer)
    placed = []
    for t, bar in zip(labels, bars, strict=True):
        tb, bb = t.get_window_extent(renderer), bar.get_window_extent(renderer)
        if bb.x0 <= tb.x0 and tb.x1 <= bb.x1:
            placed.append("inside")
            assert t.get_color() == "white", t.get_text()
        else:
            assert tb.x0 >= bb.x1 and tb.x1 <= panel.x1, (t.get_text(), tb, bb, panel)
            placed.append("past")
            assert t.get_color() == "black", t.get_text()
    assert placed[1] == "past"  # io_wait_share: measured 0.25 of 5 predicted, a sliver of a bar
