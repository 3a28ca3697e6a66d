"""Heartbeats (training.heartbeats): who stopped beating, and every multi-rank job naming its dead rank."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.conftest import graph_fixture


def test_a_rank_whose_beat_stops_is_named_and_a_beating_one_is_not():
    import torch.distributed as dist

    from training.heartbeats import Heartbeats

    store = dist.HashStore()
    me, peer = Heartbeats(store, 0, 3, every_s=0.05), Heartbeats(store, 1, 3, every_s=0.05)
    try:
        assert me.stopped() == [2]  # rank 2 never beat; rank 1 beats on its thread
        peer.close()
        time.sleep(0.1)
        assert me.stopped() == [1, 2]
    finally:
        me.close()
        peer.close()


@pytest.fixture(scope="module")
def cora_ds(tmp_path_factory) -> Path:
    from training.importers import import_dataset

    return import_dataset(graph_fixture("cora"), tmp_path_factory.mktemp("cora") / "cora")


@pytest.mark.heavy  # two rank processes that import torch, one killed mid-epoch (~25 s)
def test_a_rank_that_dies_in_plain_data_parallel_training_is_named_with_the_resume_path(cora_ds, tmp_path):
    """No partition, no sharded store: the job's heartbeats (started with the world) still name the dead rank."""
    from tests.nodes_launch import kill_mid_run

    m, ck = tmp_path / "m.jsonl", tmp_path / "ck"
    argv = ["train", "--dataset", str(cora_ds), "--fanouts", "5,5", "--hidden", "16", "--batch-size", "7",
            "--epochs", "3", "--eval-every", "0", "--metrics", str(m), "--checkpoint", str(ck)]
    last = kill_mid_run(argv, m, tmp_path / "a")
    assert re.match(r"moment train: error: epoch \d+(, step \d+)?: .*rank 1 died or stopped answering", last), last
    assert "--resume" in last
