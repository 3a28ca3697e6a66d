"""One root for user errors: every package's error base derives from momentbase.errors.MomentError."""

from __future__ import annotations

import importlib

import pytest

from momentbase.errors import MomentError

# every user-facing error class, by module: the CLI turns each into one line and exit status 2
ERRORS = {
    "momentbase.units": ["SizeError"],
    "planner.errors": ["PlannerError", "ParseError", "TopologyError"],
    "iostack.errors": ["StoreError"],
    "iostack.bench.workload": ["WorkloadError"],
    "training.errors": ["TrainingError", "TrainError"],
    "training.data": ["DatasetError"],
    "training.sampler": ["SamplerError"],
    "training.hotness": ["HotnessError"],
    "training.place.bins": ["PlacingError"],
    "training.devices": ["DeviceError"],
    "training.models": ["ModelError"],
    "training.synth": ["SynthError"],
    "training.sharded.features": ["NodeError"],
    "training.sharded.exchange": ["PeerLostError"],
    "training.runreport": ["MetricsError"],
    "training.serve.protocol": ["ServerError"],
    "moment.errors": ["CommandError"],
}


@pytest.mark.parametrize(("module", "name"), [(m, n) for m, ns in ERRORS.items() for n in ns])
def test_every_user_error_has_the_one_root(module, name):
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, MomentError)


@pytest.mark.parametrize(("module", "name"), [("training.errors", "TrainingError"),
                                              ("iostack.errors", "StoreError"),
                                              ("moment.errors", "CommandError")])
def test_a_package_base_is_not_another_packages(module, name):
    """A library user can catch one package's errors alone: planner's base does not swallow the others."""
    from planner.errors import PlannerError

    assert not issubclass(getattr(importlib.import_module(module), name), PlannerError)


def test_the_cli_prints_any_root_error_as_one_line(capsys, monkeypatch):
    from moment import cli
    from training.errors import TrainingError

    def fail(_args):
        raise TrainingError("data.npz: no features; run moment data import first")

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    args = parser.parse_args(["topo", "--machine", "moment-a"])
    monkeypatch.setattr(parser, "parse_known_args", lambda argv=None: (argparse_ns(args, fail), []))
    assert cli.main(["topo"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["moment topo: error: data.npz: no features; run moment data import first"]


def argparse_ns(args, func):
    args.func = func
    return args


# the library speaks of its parameters; the command line of its options
LIBRARY = ("momentbase", "planner", "iostack", "hwprofile", "training")
# options of other programs a message may quote: fio's, lstopo's, torchrun's
OTHER_TOOLS = ("--output-format=json", "--of xml", "--nnodes")


def _raised_texts():
    import ast
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for pkg in LIBRARY:
        for path in sorted((root / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                    text = "".join(c.value for c in ast.walk(node.exc)
                                   if isinstance(c, ast.Constant) and isinstance(c.value, str))
                    for other in OTHER_TOOLS:
                        text = text.replace(other, "")
                    if re.search(r"(?<![\w-])--[a-z]", text):
                        yield f"{path.relative_to(root)}:{node.lineno}: {text[:100]}"


def test_no_library_error_quotes_a_command_line_option():
    assert list(_raised_texts()) == []


def test_the_cli_says_options_where_the_library_says_parameters(capsys, tmp_path):
    from moment import cli
    from training.synth import SynthError, SynthSpec

    with pytest.raises(SynthError, match=r"^`num_nodes` 1: expected a whole number"):
        SynthSpec(num_nodes=1, num_edges=5).validate()
    assert cli.main(["data", "synth", str(tmp_path / "g"), "--nodes", "1", "--edges", "5"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("moment data: error: --nodes 1: expected a whole number"), err
    # an option whose name is not the parameter's (--force sets overwrite), and a name no option sets
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "x").write_text("")
    assert cli.main(["data", "synth", str(tmp_path / "g"), "--nodes", "100", "--edges", "200", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pass --force to replace it" in err[0] and "`" not in err[0], err
    # a parameter another command's option sets: that command, the value inside its quotes
    assert cli.main(["report", str(tmp_path / "m.jsonl")]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(
        f"(write one by training with `moment train --metrics {tmp_path}/m.jsonl`)"
    )
