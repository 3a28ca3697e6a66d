"""training.background_verify: the dataset arrays training reads are checked in full while it runs (issue 28)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import training.data as data
from training.background_verify import DatasetWatch
from training.data import DatasetError
from training.synth import SynthSpec
from training.synth_run import synthesize


@pytest.fixture()
def dataset(tmp_path):
    root = tmp_path / "ds"
    synthesize(root, SynthSpec(num_nodes=2000, num_edges=30000, feature_dim=16))
    return root


def _damage(path, at_fraction=0.5):
    raw = bytearray(path.read_bytes())
    i = int(len(raw) * at_fraction)
    raw[i] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_a_whole_dataset_checks_only_the_arrays_asked_for(dataset):
    with DatasetWatch(dataset, ("indptr", "indices", "labels", "nope")) as watch:
        said = watch.finish()
    assert said.startswith("CRC-32 verified: all") and said.endswith("of 3 file(s)")
    assert watch.checked


def test_a_bad_block_stops_the_run_naming_file_and_block(dataset):
    _damage(dataset / "indices.npy")
    watch = DatasetWatch(dataset, ("indptr", "indices")).start()
    with pytest.raises(DatasetError, match=r"indices\.npy: block \d+ of \d+ .* does not match the CRC-32"):
        watch.finish()
    with pytest.raises(DatasetError, match="indices.npy"):  # and keeps saying so
        watch.raise_if_bad()
    # an array not asked for is not read: the same damage in the features goes unseen here
    _damage(dataset / "features.npy")
    with DatasetWatch(dataset, ("labels",)) as other:
        assert other.finish().endswith("of 1 file(s)")


def test_closing_stops_a_check_that_has_not_ended(dataset, monkeypatch):
    gate, entered = threading.Event(), threading.Event()
    real = data.bad_blocks

    def slow(path, sums, which):
        entered.set()
        gate.wait(5)
        return real(path, sums, which)

    monkeypatch.setattr(data, "bad_blocks", slow)
    watch = DatasetWatch(dataset, ("indptr", "indices", "features")).start()
    assert entered.wait(5)
    watch.raise_if_bad()  # nothing found yet: no error
    assert not watch.checked
    watch._stop.set()
    gate.set()
    watch.close()
    assert not watch.checked  # stopped before the end: it never claims the whole check


def test_a_missing_file_is_an_error_of_the_check(dataset):
    (dataset / "labels.npy").unlink()
    with DatasetWatch(dataset, ("labels",)) as watch, pytest.raises(DatasetError, match="labels"):
        watch.finish()
    assert np.load(dataset / "indptr.npy").size == 2001
