"""What a newcomer stumbled on (issue 28): a cut table, a reset bar, the wrong usage.

The demo re-running without ``--force`` is tested with the demo (tests/test_demo.py), the
report's labels with the report (tests/test_report.py).
"""

from __future__ import annotations

import json
import re

import pytest

from moment.cli import main


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    d = tmp_path_factory.mktemp("small") / "g"
    assert main(["data", "synth", str(d), "--nodes", "3000", "--edges", "20000", "--feature-dim", "32",
                 "--quiet"]) == 0
    return d


def test_an_80_column_terminal_keeps_every_number_of_the_placement_table(small, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    ssd = [a for _ in range(8) for a in ("--ssd", str(tmp_path))]
    assert main(["place", "--dataset", str(small), "--machine", "moment-b", "--gpu-cache", "64KiB",
                 "--cpu-cache", "128KiB", *ssd, "--out", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    table = out[out.index("bins (written to"):out.index("against the hash baseline")]
    assert all(len(line) <= 80 for line in table.splitlines()), table
    assert "…" not in table, table
    report = json.loads((tmp_path / "p" / "place.json").read_text())["report"]
    lines = table.splitlines()
    for b in report["bins"]:  # each bin's row holds its figures whole
        row = next(line for line in lines if re.match(rf"\s*{b['id']}\s", line))
        for figure in (f"{b['rows']:,}", f"{b['capacity_rows']:,}", f"{b['traffic_share']:.2%}",
                       f"{b['target_share']:.2%}"):
            assert f" {figure}" in row, (figure, row)


def test_place_with_an_option_of_another_command_answers_with_places_usage(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["place", "--dataset", str(tmp_path), "--gpu-cache", "1MiB", "--cpu-cache", "1MiB", "--out",
              str(tmp_path / "o"), "--gpus"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.startswith("usage: moment place ") and "moment place: error: unrecognized arguments: --gpus" in err
    assert "COMMAND ..." not in err  # not the top-level usage


def test_a_stage_that_runs_again_gets_a_bar_of_its_own(monkeypatch):
    """place's second pre-sample used to reset the first one's finished bar to 0."""
    from moment import bars as bars_mod

    monkeypatch.setattr(bars_mod, "is_terminal", lambda: True)
    with bars_mod.Bars() as bars:
        bars("presample", 0, 4)
        bars("presample", 4, 4)
        bars("presample", 0, 4)  # the independent pre-sample
        bars("presample", 2, 4)
        assert bars.progress is not None
        tasks = bars.progress.tasks
        assert [(t.description, t.completed, t.finished) for t in tasks] == [("presample", 4, True),
                                                                            ("presample", 2, False)]
