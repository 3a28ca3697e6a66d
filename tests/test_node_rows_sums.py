"""A node's rows.npy (what its caches fill from) carries a CRC-32 per block: checked for the rows the caches take
when training opens the node, and in full by `moment place --verify` (issue 28: no checksum covered it)."""

from __future__ import annotations

import numpy as np
import pytest

from iostack.errors import StoreError
from iostack.npysums import read_sums, sums_path
from iostack.placement import load_placement
from iostack.shards import load_layout
from moment.cli import main
from tests.test_nodes import _sharded, cora  # noqa: F401 - the module fixture
from training.sharded.features import Peers, _node_store


@pytest.fixture()
def placed(cora, tmp_path):  # noqa: F811 - the fixture imported above
    return _sharded(cora, tmp_path / "shards", replicas=1)


def _open_node(node_dir):
    layout, man = load_layout(node_dir)
    opened = []

    def open_store(placement, directory, feats, backend, **kw):
        opened.append(np.asarray(feats[:1]))
        return object()

    _node_store(node_dir, layout, int(man["node"]), Peers(0, 1, 0, 1, 0), None, open_store, None, None, "posix",
                None)
    return opened


def _cached_row_offset(node_dir):
    p = load_placement(node_dir)
    cpu = next(b for b in p.bins if b.kind == "cpu")
    row = int(p.vertices_of(cpu.id)[-1])
    arr = np.load(node_dir / "rows.npy", mmap_mode="r")
    return arr.offset + row * arr.shape[1] * arr.dtype.itemsize


def test_node_rows_carry_sums_and_verify(placed, capsys):
    for k in (0, 1):
        rows = placed / f"node{k}" / "rows.npy"
        sums = read_sums(rows)
        assert sums is not None and sums.size_bytes == rows.stat().st_size and sums_path(rows).exists()
    assert _open_node(placed / "node0")  # whole: the store opens
    assert main(["place", "--verify", str(placed)]) == 0
    assert "rows of node0" in capsys.readouterr().out


def test_a_corrupt_cached_row_stops_the_node_and_verify_names_it(placed, capsys):
    node = placed / "node0"
    at = _cached_row_offset(node)
    with open(node / "rows.npy", "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x10]))
    with pytest.raises(StoreError, match=r"rows\.npy: block \d+ of \d+ .* does not match its CRC-32"):
        _open_node(node)
    assert _open_node(placed / "node1")  # the other node is whole
    capsys.readouterr()
    assert main(["place", "--verify", str(placed)]) == 1
    out = capsys.readouterr()
    assert "rows.npy" in out.out + out.err
