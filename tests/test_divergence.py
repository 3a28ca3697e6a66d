"""A diverging run is named at the epoch's end: warned in one line and recorded in the metrics (issue 28 item 5)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moment.cli import main
from tests.conftest import graph_fixture
from training.divergence import NEAR, RISE, check
from training.importers import import_dataset


@pytest.fixture(scope="module")
def cora(tmp_path_factory) -> Path:
    return import_dataset(graph_fixture("cora"), tmp_path_factory.mktemp("cora") / "cora")


def test_the_issues_run_rising_then_at_chance():
    # GraphSAGE on raw Amazon Computers at lr 0.01: 2.4 -> 6.4, then ln 10
    rising = check([2.4, 6.4], 10, lr=0.01)
    assert rising["kind"] == "rising" and "`lr=0.001`" in rising["message"]
    assert "`normalize_features=True`" in rising["message"]
    chance = check([2.4, 6.4, math.log(10) + 0.01, math.log(10)], 10)
    assert chance["kind"] == "at chance" and "ln 10 = 2.303" in chance["message"]
    assert check([math.log(10)], 10) is None  # a first epoch at chance is an untrained model's


@given(st.lists(st.floats(0.01, 50.0), min_size=1, max_size=12), st.integers(2, 1000))
def test_a_falling_loss_away_from_chance_is_never_flagged(losses, classes):
    chance = math.log(classes)
    falling = sorted(losses, reverse=True)
    if all(abs(x - chance) <= NEAR * chance for x in falling[-2:]) and len(falling) > 1:
        falling = falling[:-1] + [falling[-2] - 0.5 * chance]  # falling well away from chance
    if falling[-1] <= 0:
        return
    assert check(falling, classes) is None


@given(st.lists(st.floats(0.01, 50.0), min_size=1, max_size=12), st.floats(1.01, 10.0), st.integers(2, 1000))
def test_a_loss_above_its_best_by_more_than_the_margin_is_rising(losses, factor, classes):
    now = min(losses) * RISE * factor
    assert check([*losses, now], classes)["kind"] == "rising"


def test_moment_train_warns_once_and_records_it(cora, tmp_path, capsys):
    metrics = tmp_path / "m.jsonl"
    common = ["train", "--dataset", str(cora), "--fanouts", "5,5", "--batch-size", "35", "--hidden", "16",
              "--seed", "3", "--eval-every", "0", "--metrics", str(metrics)]
    assert main([*common, "--lr", "1.0", "--epochs", "3"]) == 0  # raw features, a learning rate far too high
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, err
    assert "epoch 1: the training loss rose" in warnings[0] and "--lr 0.1" in warnings[0]
    assert "--normalize-features" in warnings[0]
    epochs = [json.loads(line) for line in metrics.read_text().splitlines() if '"kind": "epoch"' in line]
    assert epochs[0]["divergence"] is None and epochs[1]["divergence"]["kind"] == "rising"
    # a healthy run says nothing and records nothing
    metrics.unlink()
    assert main([*common, "--lr", "0.01", "--epochs", "3"]) == 0
    assert "warning:" not in capsys.readouterr().err
    assert all(json.loads(line).get("divergence") is None for line in metrics.read_text().splitlines())
