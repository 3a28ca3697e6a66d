"""Socket-aware placement from `moment place`: each socket's reads where the plan's GPUs span sockets."""

from __future__ import annotations

import json

import numpy as np
import pytest

from moment.cli import main
from tests.conftest import graph_fixture
from training.data import open_dataset
from training.importers.planetoid import import_planetoid
from training.place.sockets import socket_seed_split


def _place(tmp_path, capsys, ds, plan, name: str, *extra: str) -> dict:
    assert main(["place", "--dataset", str(ds), "--plan", str(plan), "--gpu-cache", "0", "--cpu-cache", "256KiB",
                 *[a for _ in range(8) for a in ("--ssd", str(tmp_path / f"ssd-{name}"))],
                 "--out", str(tmp_path / name), "--json", *extra]) == 0
    capsys.readouterr()
    return json.loads((tmp_path / name / "place.json").read_text())


def test_a_two_socket_plan_places_by_socket_and_crosses_less_than_hash(tmp_path, capsys):
    """Machine A's layout (c) has two GPUs on each socket: `moment place` pre-samples each socket's part of
    the training vertices and keeps their rows on their socket's bins; its cross-socket share is well below
    hash's on the same reads, and below the placement made with `--no-socket-aware`; GPUs on one socket
    (moment-b's plan): not used."""
    cora = open_dataset(import_planetoid(graph_fixture("cora"), tmp_path / "cora"))
    for name, args in (("c", ["--machine", "moment-a", "--layout", "c"]), ("b", ["--machine", "moment-b"])):
        assert main(["plan", "--json", "--top", "1", *args]) == 0
        (tmp_path / f"plan-{name}.json").write_text(capsys.readouterr().out)
    aware = _place(tmp_path, capsys, cora.path, tmp_path / "plan-c.json", "aware")
    s = aware["socket_aware"]
    assert s["used"] and s["sockets"] == ["socket0", "socket1"] and s["gpus_per_socket"] == [2, 2]
    cross, hashed = aware["report"]["cross_socket_share"], aware["baseline"]["cross_socket_share"]
    assert cross < 0.6 * hashed
    # on reads DDAK was not fitted to (an independent pre-sample), still well below hash (not fitted to any)
    assert cross <= s["held_out_cross_socket_share"] < 0.8 * hashed
    # the reads per socket are counted in the report: its (reader, bin) pairs sum to every read
    assert sum(v for _, _, v in aware["report"]["socket_reads"]) == pytest.approx(1.0)
    plain = _place(tmp_path, capsys, cora.path, tmp_path / "plan-c.json", "plain", "--no-socket-aware")
    assert plain["socket_aware"] == {"used": False, "why_not": "turned off (`socket_aware=False`)"}
    assert cross < plain["report"]["cross_socket_share"]
    one = _place(tmp_path, capsys, cora.path, tmp_path / "plan-b.json", "one")  # moment-b's GPUs: one socket
    assert one["socket_aware"] == {"used": False, "why_not": "the plan's GPUs sit on one socket"}


def test_the_seed_split_is_contiguous_and_sized_by_gpus():
    ids = np.random.default_rng(0).permutation(1000)[:101]
    parts = socket_seed_split(ids, [1, 3])
    assert [p.size for p in parts] == [25, 76]
    assert np.array_equal(np.concatenate(parts), np.sort(ids)) and parts[0].max() < parts[1].min()
