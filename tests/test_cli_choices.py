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
    from iostack.cachepolicy import CACHE_POLICIES
    from planner.flow import FLOW_MODELS
    from planner.policies import PLACEMENT_POLICIES
    from training.hotness_methods import HOTNESS_METHODS
    from training.partition import PARTITIONERS
    from training.tasks import TASKS

    backends = ("auto", *READ_BACKENDS.names())
    return {
        ("moment plan", "--model"): FLOW_MODELS.names(),
        ("moment place", "--model"): FLOW_MODELS.names(),
        ("moment place", "--hotness"): HOTNESS_METHODS.names(),
        ("moment place", "--strategy"): PLACEMENT_POLICIES.names(),
        ("moment train", "--backend"): backends,
        ("moment infer", "--backend"): backends,
        ("moment train", "--cache-policy"): CACHE_POLICIES.names(),
        ("moment bench io gather", "--backend"): backends,
        ("moment data partition", "--method"): PARTITIONERS.names(),
        ("moment train", "--task"): TASKS.names(),
    }


def _library_tables() -> dict[tuple[str, str], tuple[str, ...]]:
    """Options whose values the library checks against a table of its own. The tables live in
    light modules (``*/vocab.py``, which import nothing) so that the command line builds its
    parser from them without importing the heavy modules that check them."""
    from iostack.vocab import ENGINES, STORAGE_DTYPES
    from planner.vocab import HANDOFF_LAYOUTS
    from training.importers import FORMATS
    from training.vocab import (
        DATASET_CHECKS,
        DATASET_FEATURE_DTYPES,
        DYNAMIC_CACHE_ON,
        EXCHANGES,
        GPU_MODES,
        GRAPH_ON,
        LINK_DECODERS,
        MODEL_NAMES,
        NEGATIVE_METHODS,
        PRECISIONS,
        SAMPLE_ON,
        TRAIN_MODEL_NAMES,
    )

    return {
        ("moment plan", "--layout"): HANDOFF_LAYOUTS,
        ("moment data import", "--format"): ("auto", *FORMATS),
        ("moment data import", "--feature-dtype"): DATASET_FEATURE_DTYPES,
        ("moment bench io raw", "--engine"): ("all", *ENGINES),
        ("moment train", "--model"): TRAIN_MODEL_NAMES,
        ("moment demo", "--model"): MODEL_NAMES,
        ("moment train", "--sample-on"): SAMPLE_ON,
        ("moment train", "--graph-on"): GRAPH_ON,
        ("moment train", "--exchange"): EXCHANGES,
        ("moment train", "--check-dataset"): DATASET_CHECKS,
        ("moment train", "--dynamic-cache-on"): DYNAMIC_CACHE_ON,
        ("moment train", "--precision"): PRECISIONS,
        ("moment place", "--gpu-cache-mode"): GPU_MODES,
        ("moment place", "--feature-dtype"): STORAGE_DTYPES,
        ("moment train", "--decoder"): LINK_DECODERS,
        ("moment train", "--negatives"): NEGATIVE_METHODS,
        ("moment data split-edges", "--negatives"): NEGATIVE_METHODS,
    }


def test_the_heavy_modules_check_against_the_light_tables():
    """Each light table is the very table its implementation checks a value against (one
    object, not a copy), and the GNNs the trainer builds are the ones the table names."""
    import iostack.backends.posix as posix
    import iostack.codec as codec
    import planner.handoff as handoff
    import training.data as data
    import training.devices as devices
    import training.link.model as link_model
    import training.link.negatives as negatives
    import training.place.bins as placing
    import training.precision as precision
    import training.sharded.features as sharded
    import training.specs as specs
    from iostack import vocab as io_vocab
    from planner import vocab as plan_vocab
    from training import vocab
    from training.models import MODELS

    assert tuple(MODELS) == vocab.MODEL_NAMES
    pairs = [(posix.ENGINES, io_vocab.ENGINES), (codec.STORAGE_DTYPES, io_vocab.STORAGE_DTYPES),
             (handoff.HANDOFF_LAYOUTS, plan_vocab.HANDOFF_LAYOUTS),
             (data.DATASET_FEATURE_DTYPES, vocab.DATASET_FEATURE_DTYPES),
             (devices.SAMPLE_ON, vocab.SAMPLE_ON), (placing.GPU_MODES, vocab.GPU_MODES),
             (specs.GRAPH_ON, vocab.GRAPH_ON), (specs.EXCHANGES, vocab.EXCHANGES),
             (specs.DATASET_CHECKS, vocab.DATASET_CHECKS), (specs.DYNAMIC_CACHE_ON, vocab.DYNAMIC_CACHE_ON),
             (sharded.EXCHANGES, vocab.EXCHANGES), (specs.PRECISIONS, vocab.PRECISIONS),
             (precision.PRECISIONS, vocab.PRECISIONS), (negatives.NEGATIVE_METHODS, vocab.NEGATIVE_METHODS),
             (link_model.LINK_DECODERS, vocab.LINK_DECODERS)]
    assert all(used is table for used, table in pairs)


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
