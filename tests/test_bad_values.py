"""Bad values on the command line: one clear line naming the option, exit status 2, no traceback."""

from __future__ import annotations

import pytest

from moment.cli import main


def _run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        return int(exc.code)


@pytest.mark.parametrize("argv, message", [
    (["serve", "--dataset", "d", "--port", "99999"], "argument --port: 99999: expected a port from 1 to 65535"),
    (["serve", "--dataset", "d", "--port", "-1"], "argument --port: -1: expected a port from 1 to 65535"),
    (["serve", "--dataset", "d", "--timeout", "nan"], "argument --timeout: 'nan': expected a positive number"),
    (["serve", "--dataset", "d", "--lanes", "0"], "argument --lanes: '0': expected a positive number"),
    (["plan", "--machine", "moment-b", "--unknown-link-gbps", "-3"],
     "argument --unknown-link-gbps: -3: expected a positive number"),
    (["plan", "--machine", "moment-b", "--unknown-link-gbps", "inf"],
     "argument --unknown-link-gbps: inf: expected a positive number"),
    (["place", "--dataset", "d", "--machine", "moment-b", "--gpu-cache", "-1KiB", "--cpu-cache", "1MiB",
      "--ssd", "s", "--out", "o"], "'-1KiB' is not a size"),
    (["profile", "--ssd", ".", "--block-size", "-4KiB", "--no-memory"], "'-4KiB' is not a size"),
    (["bench", "io", "raw", "--dir", ".", "--file-size", "-1GiB"], "'-1GiB' is not a size"),
    (["bench", "io", "gather", "--seconds", "-1"], "need --seconds > 0"),
    (["bench", "io", "gather", "--alpha", "-1"], "Zipf exponent --alpha >= 0"),
    (["bench", "io", "gather", "--cpu-rows", "-5"], "--gpu-rows and --cpu-rows >= 0"),
    (["data", "synth", "{tmp}/s", "--nodes", "100", "--edges", "300", "--feature-dim", "0"],
     "--feature-dim 0: expected 1 or more"),
    # issue 28 item 4: these three were accepted
    (["plan", "--machine", "moment-b", "--nodes", "-2"], "--nodes -2: expected at least 1"),
    (["plan", "--machine", "moment-b", "--nodes", "0"], "--nodes 0: expected at least 1"),
    (["train", "--dataset", "{tmp}", "--backend", "kvikio"], "--backend kvikio reads a placement's SSD bins: give "
                                                             "--placement"),
])
def test_bad_value_is_one_line_exit_2(tmp_path, capsys, argv, message):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert _run(argv) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert "Traceback" not in err and "internal error" not in err
    assert sum(1 for line in err.splitlines() if "error:" in line) == 1


def test_bench_gather_into_a_missing_directory(tmp_path, capsys):
    missing = tmp_path / "nope"
    assert _run(["bench", "io", "gather", "--dir", str(missing), "--seconds", "0.1"]) == 2
    err = capsys.readouterr().err
    assert f"--dir {missing}: no such directory" in err and "internal error" not in err
    assert not missing.exists()


@pytest.mark.parametrize("command", ["plan", "topo"])
def test_a_picture_into_a_missing_directory(tmp_path, capsys, command):
    target = tmp_path / "nope" / "x.svg"
    assert _run([command, "--machine", "moment-b", "--svg", str(target)]) == 2
    err = capsys.readouterr().err
    assert f"{target}: cannot write the picture there" in err and "no such directory" in err


def test_npz_split_with_a_negative_count(tmp_path, capsys):
    from tests.conftest import graph_fixture

    src = graph_fixture("amazon-photo", "amazon_photo.npz")
    assert _run(["data", "import", "--format", "npz", str(src), str(tmp_path / "n"), "--train-per-class", "-1"]) == 2
    assert "--train-per-class -1 / --valid-per-class 30: expected 0 or more" in capsys.readouterr().err
    assert not (tmp_path / "n").exists()


@pytest.mark.parametrize("lr, decay", [(float("nan"), 0.0), (-1e-3, 0.0), (1e-3, float("nan")), (float("inf"), 0.0)])
def test_train_config_refuses_non_finite_rates(lr, decay):
    from training.errors import TrainError
    from training.specs import RunSpec

    with pytest.raises(TrainError, match="`lr` must be > 0 and `weight_decay` >= 0"):
        RunSpec(lr=lr, weight_decay=decay)


@pytest.mark.parametrize("value", ["nan", ".nan", "inf", "-.inf"])
@pytest.mark.parametrize("key", ["exponent", "steps"])
def test_an_emulate_workload_refuses_values_that_are_not_finite(tmp_path, capsys, key, value):
    # issue 28 item 4: `exponent: nan` passed the `>= 0` check (every comparison with nan is false)
    stream = {"kind": "zipf", "exponent": "1.1", "rows_per_step": "64", "steps": "3"}
    stream[key] = value
    (tmp_path / "wl.yaml").write_text(
        "data: {synthetic: {rows: 1000, row_bytes: 512, dir: " + str(tmp_path) + "}}\n"
        "stream: {" + ", ".join(f"{k}: {v}" for k, v in stream.items()) + "}\n")
    assert _run(["bench", "emulate", str(tmp_path / "wl.yaml")]) == 2
    err = capsys.readouterr().err
    assert f"stream.{key}:" in err and "not a" in err and "Traceback" not in err, err
    assert sum(1 for line in err.splitlines() if "error:" in line) == 1
