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
    "iostack.emulate_workload": ["WorkloadError"],
    "training.errors": ["TrainingError", "TrainError"],
    "training.data": ["DatasetError"],
    "training.sampler": ["SamplerError"],
    "training.hotness": ["HotnessError"],
    "training.placing": ["PlacingError"],
    "training.devices": ["DeviceError"],
    "training.models": ["ModelError"],
    "training.synth": ["SynthError"],
    "training.sharded": ["NodeError"],
    "training.exchange": ["PeerLostError"],
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
    monkeypatch.setattr(parser, "parse_args", lambda argv=None: argparse_ns(args, fail))
    assert cli.main(["topo"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["moment topo: error: data.npz: no features; run moment data import first"]


def argparse_ns(args, func):
    args.func = func
    return args
