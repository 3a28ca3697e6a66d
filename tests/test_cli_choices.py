"""Every ``choices=`` of the command line equals the library table it names.

The parser is walked (every subcommand, every option with choices) and each
option is looked up below: options naming an extension point must list
exactly its registry's names (they are built from it, so a registered entry
shows up on the command line), the others exactly the library table the
library checks the value against. An option with choices that is in neither
list fails, so a new literal ``choices=`` cannot slip in unchecked.
"""

from __future__ import annotations

import argparse

import pytest

from moment.cli import build_parser


def _choices(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("moment",)):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _choices(sub, (*path, name))
        elif action.choices is not None:
            yield " ".join(path), action.option_strings[-1], tuple(action.choices)


def _registry_tables() -> dict[tuple[str, str], tuple[str, ...]]:
    """Options that name an extension point: their registry's names (``auto`` first for backends)."""
    from iostack.backends import READ_BACKENDS
    from planner.flow import FLOW_MODELS
    from planner.policies import PLACEMENT_POLICIES
    from training.hotness_methods import HOTNESS_METHODS

    backends = ("auto", *READ_BACKENDS.names())
    return {
        ("moment plan", "--model"): FLOW_MODELS.names(),
        ("moment place", "--model"): FLOW_MODELS.names(),
        ("moment place", "--hotness"): HOTNESS_METHODS.names(),
        ("moment place", "--strategy"): PLACEMENT_POLICIES.names(),
        ("moment train", "--backend"): backends,
        ("moment bench io gather", "--backend"): backends,
    }


def _library_tables() -> dict[tuple[str, str], tuple[str, ...]]:
    """Options whose values the library checks against a table of its own (heavy modules: the
    command line cannot import them to build its parser, so this test keeps the two equal)."""
    from iostack.backends.posix import ENGINES
    from iostack.codec import STORAGE_DTYPES
    from planner.handoff import HANDOFF_LAYOUTS
    from training.data import DATASET_FEATURE_DTYPES
    from training.devices import SAMPLE_ON
    from training.diskcsr import GRAPH_ON
    from training.exchange import EXCHANGES
    from training.importers import FORMATS
    from training.models import MODELS
    from training.placing import GPU_MODES

    return {
        ("moment plan", "--layout"): HANDOFF_LAYOUTS,
        ("moment data import", "--format"): ("auto", *FORMATS),
        ("moment data import", "--feature-dtype"): DATASET_FEATURE_DTYPES,
        ("moment bench io raw", "--engine"): ("all", *ENGINES),
        ("moment train", "--model"): tuple(MODELS),
        ("moment demo", "--model"): tuple(MODELS),
        ("moment train", "--sample-on"): SAMPLE_ON,
        ("moment train", "--graph-on"): GRAPH_ON,
        ("moment train", "--exchange"): EXCHANGES,
        ("moment place", "--gpu-cache-mode"): GPU_MODES,
        ("moment place", "--feature-dtype"): STORAGE_DTYPES,
    }


#: choices that are the command's own (checked inline by one importer or the command, no table to share)
OWN = {
    ("moment data import", "--split"),  # npz importer: random per-class split or none
    ("moment data import", "--igb-classes"),  # IGB's two label sets
    ("moment data import", "--features"),  # edge-list importer: what to fill features with
    ("moment train", "--gcn-norm"),  # GCN's two normalisations, a TrainConfig literal
    ("moment serve", "--device"),  # where the server samples
}


def test_every_choices_option_is_accounted_for():
    seen = {(path, flag) for path, flag, _ in _choices(build_parser())}
    known = set(_registry_tables()) | set(_library_tables()) | OWN
    assert seen - known == set(), "a choices= option neither from a registry nor checked against a table"
    assert known - seen == set(), "an option listed here is gone from the parser: drop it from this test"


@pytest.mark.parametrize("tables", [_registry_tables, _library_tables], ids=["registries", "library tables"])
def test_choices_equal_their_tables(tables):
    expected = tables()
    got = {(path, flag): choices for path, flag, choices in _choices(build_parser()) if (path, flag) in expected}
    assert got == expected


def test_a_registered_entry_appears_on_the_command_line():
    """The choices are read from the registry when the parser is built, not copied from it."""
    from planner.flow import FLOW_MODELS
    from planner.policies import PLACEMENT_POLICIES

    with FLOW_MODELS.registered("toy-model", len), PLACEMENT_POLICIES.registered("toy-policy", len):
        parsed = build_parser().parse_args(["plan", "--machine", "moment-b", "--model", "toy-model"])
        assert parsed.model == "toy-model"
        got = {(p, f): c for p, f, c in _choices(build_parser())}
        assert got["moment place", "--strategy"][-1] == "toy-policy"
    assert "toy-model" not in {c for p, f, cs in _choices(build_parser()) for c in cs}
