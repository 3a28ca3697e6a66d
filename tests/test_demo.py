"""``moment demo``: plan -> data -> place -> train end to end on a small graph."""

from __future__ import annotations

import json

from moment.cli import main


def test_demo_runs_every_step_and_writes_its_outputs(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--nodes", "3000", "--edges", "30000", "--feature-dim", "16",
                 "--epochs", "1"]) == 0
    text = capsys.readouterr().out
    for step in ("1. plan the layout", "2. make a graph", "3. place the features", "4. measure the disk",
                 "5. train", "6. report"):
        assert step in text
    assert "ssd reads: plan vs run" in text  # the prediction checked against the run, per tier
    assert "$ moment place --dataset" in text  # each step shows the command a user would type
    assert (out / "plan.svg").read_text().lstrip().startswith("<svg")
    manifest = json.loads((out / "placement" / "placement.json").read_text())
    kinds = [b["kind"] for b in manifest["bins"]]
    assert kinds.count("ssd") == 8 and "cpu" in kinds and "gpu" in kinds
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r["kind"] == "epoch"]
    assert len(epochs) == 1 and epochs[0]["loss"] > 0
    ssd = next(t for t in epochs[0]["prediction"]["tiers"] if t["tier"] == "ssd")
    assert ssd["predicted_s"] > 0 and ssd["measured_s"] > 0
    assert (out / "report" / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in (out / "report" / "report.svg").read_text()[:2000]
    assert "reads per tier:" in text and "(target " in text  # the summary, against the placement's targets
    # the README's command run again: the earlier demo is replaced, no --force needed
    assert main(["demo", "--out", str(out), "--nodes", "3000", "--edges", "30000", "--feature-dim", "16",
                 "--epochs", "1"]) == 0
    assert f"replacing the earlier demo in {out}" in " ".join(capsys.readouterr().out.split())  # however wrapped
    assert len([line for line in (out / "metrics.jsonl").read_text().splitlines() if '"epoch"' in line]) >= 1


def test_demo_refuses_a_directory_holding_more_than_a_demo(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("keep me")
    assert main(["demo", "--out", str(tmp_path)]) == 2
    assert "not empty" in capsys.readouterr().err
    (tmp_path / "graph").mkdir()  # looks like a demo, but mine.txt is not the demo's
    assert main(["demo", "--out", str(tmp_path), "--force"]) == 2  # --force replaces only a demo
    assert "mine.txt, which the demo did not write" in capsys.readouterr().err
    assert (tmp_path / "mine.txt").read_text() == "keep me" and (tmp_path / "graph").is_dir()


def test_demo_bad_numbers_fail_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "d"
    assert main(["demo", "--out", str(out), "--nodes", "abc"]) == 2
    assert "--nodes abc" in capsys.readouterr().err and not out.exists()
