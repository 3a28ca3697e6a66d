"""Progress: the library's callbacks carry sane totals; the CLI's bars stay quiet with --json or off a terminal."""

from __future__ import annotations

import numpy as np
import pytest

from moment.cli import main


class Recorder:
    """A :class:`planner.progress.Progress` that keeps every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int | None]] = []

    def __call__(self, stage: str, done: int, total: int | None) -> None:
        self.calls.append((stage, done, total))

    def stages(self) -> dict[str, list[tuple[int, int | None]]]:
        out: dict[str, list[tuple[int, int | None]]] = {}
        for s, d, t in self.calls:
            out.setdefault(s, []).append((d, t))
        return out


def assert_sane(rec: Recorder, *, must_finish: bool = True) -> None:
    """Per stage: done never goes back, never passes the total, and (``must_finish``) ends at the total."""
    assert rec.calls, "the callback was never called"
    for stage, seq in rec.stages().items():
        dones = [d for d, _ in seq]
        assert dones == sorted(dones), f"{stage}: done went back: {dones}"
        for d, t in seq:
            assert d >= 0 and (t is None or (t > 0 and d <= t)), f"{stage}: {d} of {t}"
        last_done, last_total = seq[-1]
        if must_finish and last_total is not None:
            assert last_done == last_total, f"{stage}: ended at {last_done} of {last_total}"


def test_ddak_reports_its_three_stages():
    from planner.ddak import ddak
    from planner.placement import DdakBin

    rng = np.random.default_rng(0)
    h = rng.zipf(1.5, 10_000).astype(np.float32)
    bins = [DdakBin("gpu", "gpu", 1000, 1.0), DdakBin("cpu", "cpu", 3000, 1.0), DdakBin("ssd", "ssd", 20_000, 1.0)]
    rec = Recorder()
    ddak(h, bins, pool=10, progress=rec)
    assert rec.calls == [("ddak", 0, 3), ("ddak", 1, 3), ("ddak", 2, 3), ("ddak", 3, 3)]


def test_write_bins_reports_every_bin_to_its_row_count(tmp_path):
    from iostack.bins import write_bins
    from iostack.placement import simple_placement

    feats = np.arange(5000 * 8, dtype=np.float32).reshape(5000, 8)
    p = simple_placement(5000, [("ssd", 3000), ("ssd", 2000)])
    rec = Recorder()
    infos = write_bins(feats, p, tmp_path, block_bytes=8192, progress=rec, fsync=False)
    assert_sane(rec)
    stages = rec.stages()
    assert set(stages) == {f"writing bin {b}" for b in infos}
    for b, info in infos.items():
        seq = stages[f"writing bin {b}"]
        assert len(seq) > 1 and seq[-1] == (info.rows, info.rows)  # several blocks, ends at the bin's rows


def test_synth_and_hotness_report_sane_totals(tmp_path):
    from training.data import open_dataset
    from training.hotness import HotnessSpec, compute_hotness
    from training.synth import SynthSpec
    from training.synth_run import synthesize

    rec = Recorder()
    synthesize(tmp_path / "g", SynthSpec(num_nodes=2000, num_edges=20_000, feature_dim=8, train_share=0.2),
               chunk_edges=4096, progress=rec)
    assert_sane(rec, must_finish=False)  # some stages count up with no total
    assert len(rec.calls) >= 5  # 20 000 edges in chunks of 4096: several calls, not one at the end
    rec = Recorder()
    compute_hotness(open_dataset(tmp_path / "g"), HotnessSpec("presample", fanouts=(5, 5), batch_size=64),
                    progress=rec)
    assert_sane(rec)
    (seq,) = rec.stages().values()
    assert seq[-1][1] == 400 // 64 + 1  # every batch of the 400 training seeds, one call each


@pytest.fixture(scope="module")
def small_graph(tmp_path_factory):
    d = tmp_path_factory.mktemp("g") / "g"
    assert main(["data", "synth", str(d), "--nodes", "3000", "--edges", "30000", "--feature-dim", "8",
                 "--train-share", "0.1", "--quiet"]) == 0
    return d


def _place(graph, tmp_path, *extra):
    return main(
        [
            "place",
            "--dataset",
            str(graph),
            "--machine",
            "moment-b",
            "--gpu-cache",
            "0",
            "--cpu-cache",
            "16KiB",
            *[a for _ in range(8) for a in ("--ssd", str(tmp_path / "ssd"))],
            "--out",
            str(tmp_path / "out"),
            "--fanouts",
            "5,5",
            "--batch-size",
            "64",
            "--hotness-dir",
            str(tmp_path / "hot"),
            *extra,
        ]
    )


def test_place_draws_bars_on_a_terminal_and_none_with_json(small_graph, tmp_path, monkeypatch, capsys):
    import moment.bars

    monkeypatch.setattr(moment.bars, "is_terminal", lambda: True)  # as if run in a terminal
    assert _place(small_graph, tmp_path / "a") == 0
    err = capsys.readouterr().err
    for stage in ("presample", "ddak", "writing bin"):
        assert stage in err, err
    assert _place(small_graph, tmp_path / "b", "--json") == 0
    cap = capsys.readouterr()
    assert "presample" not in cap.err and "ddak" not in cap.err and cap.out.lstrip().startswith("{")


def test_place_draws_no_bars_off_a_terminal(small_graph, tmp_path, capsys):
    assert _place(small_graph, tmp_path) == 0  # under pytest neither stdout nor stderr is a terminal
    assert "presample" not in capsys.readouterr().err
