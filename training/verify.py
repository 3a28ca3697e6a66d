"""Check every byte of a placement and of its dataset against their checksums, and say which files are bad.

``moment place --verify DIR`` and ``moment data info --verify DIR`` call these:
:func:`verify_placement` reads every block of every SSD bin of a placement
(every node's, for a placement over several nodes) and of every array of the
dataset it was placed from; :func:`verify_dataset` the dataset's arrays alone.
Unlike the checks made while reading (:mod:`iostack.binverify`), they do not
stop at the first bad block: the :class:`VerifyReport` lists every bad file and
block. Files written before Moment recorded per-block sums are checked as a
whole where a whole-file CRC-32 exists, and the report says so.

>>> import tempfile
>>> from pathlib import Path
>>> from training.synth import SynthSpec
>>> from training.synth_run import synthesize
>>> root = Path(tempfile.mkdtemp()) / "ds"
>>> _ = synthesize(root, SynthSpec(num_nodes=300, num_edges=2000, feature_dim=8))
>>> rep = verify_dataset(root)
>>> rep.ok, len(rep.files) > 3
(True, True)
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from iostack.bins import open_bin
from iostack.binverify import FIX, check_bin
from iostack.checksums import BlockSums, bad_blocks
from iostack.errors import StoreError
from iostack.npysums import bad_blocks_of
from iostack.placement import MANIFEST, load_placement
from iostack.shards import SHARDS
from momentbase.jsontypes import JsonObject, JsonValue
from planner.progress import Progress
from training.data import open_dataset

#: blocks read between two progress reports of a dataset array
_PROGRESS_BLOCKS = 64

_DATASET_FIX = "re-import or regenerate the dataset"


@dataclass(frozen=True)
class FileCheck:
    """One file checked: ``blocks`` checked (0: as a whole), the ``bad_blocks`` among them, a ``problem``
    with the whole file (missing, wrong size, whole-file CRC) and a ``note`` (e.g. no per-block sums)."""

    path: str
    what: str
    blocks: int
    bad_blocks: tuple[int, ...] = ()
    problem: str | None = None
    note: str | None = None

    @property
    def ok(self) -> bool:
        return not self.bad_blocks and self.problem is None

    def to_dict(self) -> JsonObject:
        return {"path": self.path, "what": self.what, "ok": self.ok, "blocks": self.blocks,
                "bad_blocks": list(self.bad_blocks), "problem": self.problem, "note": self.note}


@dataclass(frozen=True)
class VerifyReport:
    """What a full check found: every file checked, and notes on the whole (e.g. a dataset not found)."""

    directory: str
    files: tuple[FileCheck, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.files)

    @property
    def bad(self) -> list[FileCheck]:
        return [f for f in self.files if not f.ok]

    def to_dict(self) -> JsonObject:
        return {"directory": self.directory, "ok": self.ok, "files": [f.to_dict() for f in self.files],
                "notes": list(self.notes)}


def placement_dirs(directory: str | os.PathLike[str]) -> list[Path]:
    """The directories holding a placement index under ``directory``: itself, or each node's of a sharded one.

    Raises
    ------
    StoreError
        When ``directory`` holds no placement.
    """
    d = Path(directory)
    if (d / SHARDS).exists() and not (d / MANIFEST).exists():
        try:
            nodes = json.loads((d / SHARDS).read_text()).get("nodes")
        except (OSError, ValueError, AttributeError):
            nodes = None
        names = nodes if isinstance(nodes, list) else sorted(p.name for p in d.glob("node*") if p.is_dir())
        return [d / str(n) for n in names]
    if not (d / MANIFEST).exists():
        raise StoreError(f"{d}: holds no placement ({MANIFEST} or {SHARDS}); "
                           "write one with `moment place`")
    return [d]


def _bin_checks(directory: Path, progress: Progress | None) -> list[FileCheck]:
    placement = load_placement(directory)
    checks = []
    for b in placement.bins:
        if b.kind != "ssd":
            continue
        what = f"bin {b.id}" + (f" of {directory.name}" if directory.name.startswith("node") else "")
        try:
            info = open_bin(directory, b, first_block=False)
        except StoreError as exc:
            checks.append(FileCheck(str(directory / (b.path or "")), what, 0, problem=str(exc)))
            continue
        found = check_bin(info, progress)
        if info.block_sums is None:
            checks.append(FileCheck(
                info.path, what, 0,
                problem=None if found.whole_file_ok else f"{info.path}: its CRC-32 does not match its manifest; {FIX}",
                note="placed before Moment recorded a checksum per block: the whole file's CRC-32 was checked; "
                     "re-run `moment place` to add them"))
        else:
            checks.append(FileCheck(info.path, what, found.blocks, found.bad_blocks))
    return checks


def _node_rows_check(directory: Path) -> list[FileCheck]:
    """A sharded placement's node directory: its ``rows.npy`` (what its caches fill from), every block."""
    rows = directory / "rows.npy"
    if not rows.exists():
        return []
    what = f"rows of {directory.name}"
    try:
        found = bad_blocks_of(rows)
    except StoreError as exc:
        return [FileCheck(str(rows), what, 0, problem=str(exc))]
    if found is None:
        return [FileCheck(str(rows), what, 0, note="placed before Moment recorded its checksums: not checked; "
                                                    "re-run `moment place` to add them")]
    return [FileCheck(str(rows), what, found[0], tuple(found[1]))]


def verify_placement(directory: str | os.PathLike[str], *, dataset: bool = True,
                     progress: Progress | None = None) -> VerifyReport:
    """Check every block of every SSD bin of the placement in ``directory`` and, with ``dataset``, every
    block of every array of the dataset it was placed from (``place.json`` names it).

    Raises
    ------
    StoreError
        When ``directory`` holds no placement, or its index cannot be read.
    DatasetError
        When the dataset named is there but not a dataset this Moment reads.
    """
    checks: list[FileCheck] = []
    notes: list[str] = []
    for d in placement_dirs(directory):
        checks += _bin_checks(d, progress)
        checks += _node_rows_check(d)
    if dataset:
        src = _dataset_of(Path(directory))
        if src is None:
            notes.append("the placement names no dataset (place.json): only its bins were checked")
        elif not src.exists():
            notes.append(f"its dataset {src} is not there: only the bins were checked")
        else:
            sub = verify_dataset(src, progress=progress)
            checks += sub.files
            notes += sub.notes
    return VerifyReport(str(directory), tuple(checks), tuple(notes))


def _dataset_of(directory: Path) -> Path | None:
    try:
        rep = json.loads((directory / "place.json").read_text())
    except (OSError, ValueError):
        return None
    path = rep.get("dataset") if isinstance(rep, dict) else None
    return Path(path) if isinstance(path, str) else None


def verify_dataset(directory: str | os.PathLike[str], *, progress: Progress | None = None) -> VerifyReport:
    """Check every block of every array of the dataset in ``directory`` against its ``meta.json`` CRC-32s.

    Raises
    ------
    DatasetError
        When ``directory`` is not a dataset this Moment reads (schema, missing files, shapes).
    """
    ds = open_dataset(directory, validate=False, verify="none")
    root = Path(ds.path)
    sums_meta = ds.meta.get("checksums")
    entries = sums_meta.get("files") if isinstance(sums_meta, Mapping) else None
    if not isinstance(entries, Mapping):
        return VerifyReport(str(root), (), (f"{root}: no checksums: written before Moment recorded them (nothing "
                                            f"to verify; {_DATASET_FIX} to add them)",))
    checks = [_array_check(root, key, entry, progress) for key, entry in entries.items()
              if key in ds.meta["files"]]
    return VerifyReport(str(root), tuple(checks))


def _array_check(root: Path, key: str, entry: JsonValue, progress: Progress | None) -> FileCheck:
    path = root / f"{key}.npy"
    what = f"dataset {key}"
    try:
        if not isinstance(entry, Mapping):
            raise ValueError("not a table")
        sums = BlockSums.from_json(entry)
    except ValueError as exc:
        return FileCheck(str(path), what, 0, problem=f"{root / 'meta.json'}: checksums of {key}: {exc}; {_DATASET_FIX}")
    size = path.stat().st_size
    if size != sums.size_bytes:
        return FileCheck(str(path), what, 0, problem=f"{path}: {size:,} bytes, but meta.json recorded "
                                                     f"{sums.size_bytes:,}; {_DATASET_FIX}")
    bad: list[int] = []
    for at in range(0, sums.blocks, _PROGRESS_BLOCKS):
        bad += bad_blocks(path, sums, range(at, min(sums.blocks, at + _PROGRESS_BLOCKS)))
        if progress is not None:
            progress(f"verifying {key}", min(sums.blocks, at + _PROGRESS_BLOCKS), sums.blocks)
    return FileCheck(str(path), what, sums.blocks, tuple(bad))


def describe(check: FileCheck) -> str:
    """One line on a bad file: its problem, or its bad blocks (the first few)."""
    if check.problem is not None:
        return check.problem
    shown = ", ".join(map(str, check.bad_blocks[:8])) + (" ..." if len(check.bad_blocks) > 8 else "")
    return (f"{check.path}: {len(check.bad_blocks)} of {check.blocks} blocks do not match their CRC-32 "
            f"(block {shown})")


__all__ = ["FileCheck", "VerifyReport", "describe", "placement_dirs", "verify_dataset", "verify_placement"]
