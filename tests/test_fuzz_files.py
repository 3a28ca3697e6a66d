"""Binary files damaged byte by byte: a result or the project's own error, nothing else (issue 28).

tests/test_fuzz_slow.py damages the text formats line by line; the files here are
binary or are read as a set: the importers' sources (Planetoid pickles, gnn-benchmark
``.npz``, HDF5), a dataset directory's ``meta.json`` and ``.npy`` arrays, a training
checkpoint and an SSD bin's manifest. Each example damages one real file
(:func:`damaged`: bytes flipped, zeroed, cut, dropped or inserted) and runs the
command's reader on it; a refusal must be a ``MomentError`` (``DatasetError``,
``StoreError``, ``TrainError`` ...), any other exception is a bug. The default run
tries :data:`QUICK` examples per format; the slow set
(``python3 -m pytest -m slow tests/test_fuzz_files.py``) 10,000 (``MOMENT_FUZZ_EXAMPLES``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from momentbase.errors import MomentError
from tests.conftest import GRAPH_FIXTURES

#: per format in the default run, and in the slow set
QUICK = 25
EXAMPLES = int(os.environ.get("MOMENT_FUZZ_EXAMPLES", "10000"))
_HEALTH = list(HealthCheck)

#: the ways a file gets damaged
BYTE_MUTATIONS = ("flip", "zero", "truncate", "drop", "insert")


@st.composite
def damaged(draw, data: bytes) -> bytes:
    """``data`` with one to three byte-level mutations, mostly near the start (headers live there)."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        if not out:
            break
        hi = len(out) - 1
        at = draw(st.one_of(st.integers(0, min(hi, 511)), st.integers(0, hi)))
        op = draw(st.sampled_from(BYTE_MUTATIONS))
        n = draw(st.integers(1, 16))
        if op == "flip":
            out[at] ^= draw(st.integers(1, 255))
        elif op == "zero":
            out[at:at + n] = bytes(len(out[at:at + n]))
        elif op == "truncate":
            del out[at:]
        elif op == "drop":
            del out[at:at + n]
        else:
            out[at:at] = draw(st.binary(min_size=1, max_size=n))
    return bytes(out)


@cache
def _scratch() -> Path:
    return Path(tempfile.mkdtemp(prefix="moment-fuzzfiles-"))


def _fresh(name: str) -> Path:
    d = _scratch() / name
    shutil.rmtree(d, ignore_errors=True)
    return d


# -- the formats: (the real files by name, the check given a directory holding them) ----------------------------

def _planetoid() -> tuple[dict[str, bytes], Callable[[Path], object]]:
    from training.importers import import_dataset
    src = GRAPH_FIXTURES / "cora"
    files = {p.name: p.read_bytes() for p in sorted(src.glob("ind.cora.*"))}
    return files, lambda d: import_dataset(d, _fresh("planetoid-out"), format="planetoid")


def _npz() -> tuple[dict[str, bytes], Callable[[Path], object]]:
    from training.importers import import_dataset
    return ({"cora.npz": (GRAPH_FIXTURES / "cora" / "cora.npz").read_bytes()},
            lambda d: import_dataset(d / "cora.npz", _fresh("npz-out"), format="npz"))


def _small_dataset() -> Path:
    from training.synth import SynthSpec
    from training.synth_run import synthesize
    d = _scratch() / "synth-src"
    if not (d / "meta.json").exists():
        synthesize(d, SynthSpec(num_nodes=200, num_edges=1500, feature_dim=8))
    return d


def _hdf5() -> tuple[dict[str, bytes], Callable[[Path], object]]:
    import h5py

    from training.data import open_dataset
    from training.importers import import_dataset
    ds = open_dataset(_small_dataset())
    path = _scratch() / "g.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("graph/indptr", data=np.asarray(ds.indptr))
        f.create_dataset("graph/indices", data=np.asarray(ds.indices), chunks=(256,))
        f.create_dataset("features", data=np.asarray(ds.features), chunks=(50, ds.feature_dim), compression="gzip")
        f.create_dataset("labels", data=np.asarray(ds.labels))
    return {"g.h5": path.read_bytes()}, lambda d: import_dataset(d / "g.h5", _fresh("h5-out"), format="hdf5")


def _opened(d: Path) -> object:
    """Open a dataset directory as training does, and read what training reads first."""
    from training.data import open_dataset
    ds = open_dataset(d)
    return int(np.asarray(ds.indptr)[-1]), np.asarray(ds.features[:5]).sum(), int(np.asarray(ds.labels).max())


def _dataset_meta() -> tuple[dict[str, bytes], Callable[[Path], object]]:
    src = _small_dataset()
    return {p.name: p.read_bytes() for p in src.iterdir() if p.is_file()}, _opened


def _checkpoint() -> tuple[dict[str, bytes], Callable[[Path], object]]:
    import torch

    from training.checkpoint import load_checkpoint, save_checkpoint
    path = _scratch() / "ckpt-src" / "last.pt"
    model = torch.nn.Linear(4, 3)
    save_checkpoint(path, {"model": model.state_dict(), "epoch": 2, "config": {"model": "sage"}})
    return {"last.pt": path.read_bytes()}, lambda d: load_checkpoint(d / "last.pt")


def _bin_manifest() -> tuple[dict[str, bytes], Callable[[Path], object]]:
    from iostack.bins import open_bin, write_bins
    from iostack.placement import load_placement, simple_placement
    src = _scratch() / "bin-src"
    if not (src / "placement.json").exists():
        p = simple_placement(300, [("cpu", 100), ("ssd", 200)])
        write_bins(np.arange(300 * 4, dtype=np.float32).reshape(300, 4), p, src, fsync=False)
        p.save(src)
    files = {f.name: f.read_bytes() for f in src.iterdir() if f.is_file() and f.name.endswith(".dat.json")}

    def check(d: Path) -> object:
        for name in ("placement.json", *(f.name for f in src.iterdir() if f.suffix in (".dat", ".npy"))):
            if not (d / name).exists():
                shutil.copy(src / name, d / name)
        placement = load_placement(d)
        ssd = next(b for b in placement.bins if b.kind == "ssd")
        return open_bin(d, ssd)
    return files, check


FORMATS: dict[str, Callable[[], tuple[dict[str, bytes], Callable[[Path], object]]]] = {
    "planetoid": _planetoid, "npz": _npz, "hdf5": _hdf5, "dataset directory": _dataset_meta,
    "checkpoint": _checkpoint, "bin manifest": _bin_manifest,
}


@cache
def _format(name: str) -> tuple[dict[str, bytes], Callable[[Path], object]]:
    if name in ("planetoid", "npz") and not (GRAPH_FIXTURES / "cora").is_dir():
        pytest.skip(f"{name}: the real inputs are not here (../shared?)")
    return FORMATS[name]()


def _one_damaged(name: str, data: st.DataObject) -> None:
    files, check = _format(name)
    target = data.draw(st.sampled_from(sorted(files)))
    bad = data.draw(damaged(files[target]))
    d = _fresh(f"case-{name.replace(' ', '-')}")
    d.mkdir(parents=True)
    for fname, content in files.items():
        (d / fname).write_bytes(bad if fname == target else content)
    with contextlib.suppress(MomentError):
        check(d)


@pytest.mark.parametrize("name", list(FORMATS))
@settings(max_examples=QUICK, deadline=None, suppress_health_check=_HEALTH)
@given(data=st.data())
def test_a_damaged_file_gives_a_result_or_a_user_error(name, data):
    _one_damaged(name, data)


@pytest.mark.slow  # 10,000 damaged files per format: minutes each
@pytest.mark.parametrize("name", list(FORMATS))
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=_HEALTH)
@given(data=st.data())
def test_every_file_damaged_10k_ways_gives_a_result_or_a_user_error(name, data):
    _one_damaged(name, data)


def test_the_damage_can_be_refused():
    """The check can fail: a truncated checkpoint is refused with the project's error, not read."""
    from training.checkpoint import load_checkpoint
    files, _ = _format("checkpoint")
    d = _fresh("refused")
    d.mkdir(parents=True)
    (d / "last.pt").write_bytes(files["last.pt"][:100])
    with pytest.raises(MomentError, match="not a readable checkpoint"):
        load_checkpoint(d / "last.pt")
