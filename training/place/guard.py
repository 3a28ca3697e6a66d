"""One writer per placement: a placement's writer locks its output and sweeps what a killed writer left.

:func:`writing_placement` wraps a placement writer (:func:`training.place.run.place_dataset`):
it takes the dataset writers' lock (:func:`training.writer.output_lock`: ``flock`` on
``.<name>.lock`` beside the output, naming the holder's process, start and host; the
kernel drops it when its process dies) on ``out``, so a second writer of the same
placement fails at once naming the first, instead of the two overwriting each other's
bins (bins in an SSD directory other than ``out`` carry a digest of ``out`` in their
names, :func:`training.place.bins.build_bins`, so placements sharing it never meet).
Holding the lock, it removes what a killed writer of this placement left
(:func:`placement_leftovers`): its temporary files (``*.dat.tmp``, ``*.dat.tmp.json``,
``.<file>.tmp``, the staged ``*.dat.new`` bins of a replacement) and, while ``out`` holds
no placement index, the whole bins written for ``out`` (their manifests name it,
:func:`iostack.bins.write_bin_file`): a killed run's, since the index is written last.
Each removal is named through ``warn``.

The placement itself appears atomically already: its index (``placement.json``,
or ``shards.json`` over several nodes) is written last, by rename.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import ParamSpec, TypeVar

from iostack.placement import MANIFEST
from iostack.shards import SHARDS
from training.writer import output_lock

#: temporary files of a bin and its manifest (:func:`iostack.bins.write_bin_file`), after the bin's name prefix,
#: and the staged bins of a replacement (:func:`iostack.bins.write_bins` ``staged``: ``.new``, its ``.tmp``s)
BIN_TEMP_PATTERNS = ("bin*.dat.tmp", "bin*.dat.tmp.json", "bin*.dat.new", "bin*.dat.new.json", "bin*.dat.new.tmp",
                     "bin*.dat.new.tmp.json")
#: and in the placement directory, ``save_npy``/``save_json``'s and ``place.json``'s
TEMP_PATTERNS = (*BIN_TEMP_PATTERNS, ".*.npy.tmp", ".*.json.tmp")

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")


def _with_nodes(tops: Iterable[Path]) -> list[Path]:
    """Each of ``tops`` that is a directory, with its node directories (a placement over several nodes)."""
    tops = list(dict.fromkeys(tops))
    return [x for d in tops if d.is_dir() for x in (d, *sorted(p for p in d.glob("node*") if p.is_dir()))]


def _ssd_prefix(placement_dir: Path) -> str:
    """What the names of ``placement_dir``'s bins in another directory start with (as
    :func:`training.place.bins.build_bins` names them: the directory's name and a digest of its path)."""
    where = placement_dir.resolve()
    return f"{where.name}-{hashlib.sha1(str(where).encode()).hexdigest()[:8]}-"


def _indexed(d: Path) -> bool:
    return (d / MANIFEST).exists() or (d / SHARDS).exists()


def placement_leftovers(out: str | os.PathLike[str], ssd_dirs: Iterable[str | os.PathLike[str]] = ()) -> list[Path]:
    """What killed writers of the placement ``out`` left in ``out`` and ``ssd_dirs``: temporary files, and
    bins (with their manifests) written for a placement directory that holds no index. Call it holding
    the locks (:func:`writing_placement`): no live writer's files are then among them."""
    out = Path(os.path.abspath(out))
    found: list[Path] = []
    mine = _with_nodes([out])
    dirs = _with_nodes([out, *(Path(os.path.abspath(d)) for d in ssd_dirs)])
    # an SSD directory holds other placements' bins too: there, only the temporary bins named for ours
    nodes = [out / d.name for d in dirs if d.name.startswith("node")]
    prefixes = dict.fromkeys(_ssd_prefix(d) for d in (*mine, *nodes))
    theirs = [pre + pat for pre in prefixes for pat in BIN_TEMP_PATTERNS]
    for d in dirs:
        pats = TEMP_PATTERNS if d in mine else theirs
        found += [p for pat in pats for p in d.glob(pat) if p.is_file() or p.is_symlink()]
    if _indexed(out):
        return sorted(set(found))
    # a bin whose manifest names ``out`` (or one of its node directories) while that holds no index
    owners = {str(d.resolve()) for d in (out, *out.glob("node*")) if not _indexed(d)} | {str(out.resolve())}
    for d in dirs:
        for man in d.glob("*.dat.json"):
            try:
                owner = json.loads(man.read_text()).get("placement_dir")
            except (OSError, ValueError, AttributeError):
                continue
            if owner in owners:
                found += [man, man.with_name(man.name[:-len(".json")])]
    return sorted({p for p in found if p.exists() or p.is_symlink()})


@contextlib.contextmanager
def writing_placement(out: str | os.PathLike[str], ssd_dirs: Iterable[str | os.PathLike[str]] = (), *,
                      warn: Callable[[str], None] | None = None) -> Iterator[list[Path]]:
    """Hold the lock of a placement's writer on ``out`` and sweep what killed writers left in ``out`` and
    ``ssd_dirs`` (named through ``warn``); the value is the paths removed.

    Raises
    ------
    DatasetError
        When another writer holds a lock (naming its process, start time and host), or a lock file cannot be
        created.
    """
    out = Path(os.path.abspath(out))
    ssd = [Path(os.path.abspath(d)) for d in ssd_dirs]
    with contextlib.suppress(OSError):  # where the lock goes (a path under a file is refused later, in one line)
        out.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(out):
        swept = placement_leftovers(out, ssd)
        for p in swept:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
            if warn is not None:
                warn(f"removed {p}, left by a placement writer of {out} that was killed")
        yield swept


def holds_placement_lock(fn: Callable[P, R]) -> Callable[P, R]:
    """Run a placement writer ``fn(..., out, spec, ..., warn=...)`` inside :func:`writing_placement` of
    ``out`` and ``spec.tiers.ssd_dirs`` (``warn`` None: this module's logger)."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def locked(*args: P.args, **kwargs: P.kwargs) -> R:
        given = sig.bind(*args, **kwargs).arguments
        warn = given.get("warn")
        ssd_dirs = getattr(getattr(given.get("spec"), "tiers", None), "ssd_dirs", ())
        with writing_placement(given["out"], ssd_dirs, warn=warn if callable(warn) else log.warning):
            return fn(*args, **kwargs)

    return locked


__all__ = ["BIN_TEMP_PATTERNS", "TEMP_PATTERNS", "holds_placement_lock", "placement_leftovers",
           "writing_placement"]
