"""``moment place``'s directories: create them, warn when "SSDs" are not separate drives, clean up.

The command creates its ``--out`` and ``--ssd`` directories before any work (so that a path it
cannot create fails in a second, not after minutes of pre-sampling); if it then fails, it removes
exactly the directories it created, and after success it removes those left empty. Directories
that existed before are never touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from planner.errors import PlannerError


def make_dirs(paths: Iterable[tuple[str, Path]], created: list[Path]) -> None:
    """``mkdir -p`` each ``(option, path)``; appends what did not exist before to ``created``, parents first.

    A path that cannot be created is a :class:`PlannerError` naming its option.
    """
    for what, d in paths:
        missing = []
        p = Path(os.path.abspath(d))
        while not p.exists() and p != p.parent:
            missing.append(p)
            p = p.parent
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PlannerError(f"{what} {d}: cannot create the directory ({exc.strerror or exc})") from None
        created.extend(x for x in reversed(missing) if x not in created)


def remove_created(created: list[Path], *, only_empty: bool) -> None:
    """Remove the directories ``make_dirs`` created, deepest first: all of them with what this run
    wrote inside (``only_empty=False``, after an error), or only those left empty."""
    for d in reversed(created):
        if only_empty:
            with contextlib.suppress(OSError):  # not empty (it holds the placement), or gone: keep it
                d.rmdir()
        else:
            shutil.rmtree(d, ignore_errors=True)


def _device(st_dev: int) -> str:
    return f"{os.major(st_dev)}:{os.minor(st_dev)}"


def ssd_warnings(ssd_dirs: Iterable[str | os.PathLike[str]], root: str = "/") -> list[str]:
    """Why the ``--ssd`` directories are not separate drives, if they are not (one line each).

    Directories on one file system (the same ``st_dev``) share one drive's bandwidth, so
    the plan's per-SSD targets cannot hold; one on the file system of ``root`` is on the
    system disk. The directories must exist.
    """
    dirs = list(dict.fromkeys(Path(d).resolve() for d in ssd_dirs))
    root_dev = os.stat(root).st_dev
    by_dev: dict[int, list[Path]] = {}
    for d in dirs:
        by_dev.setdefault(os.stat(d).st_dev, []).append(d)
    notes = []
    for dev, ds in by_dev.items():
        names = ", ".join(str(d) for d in ds)
        if dev == root_dev:
            notes.append(f"--ssd {names}: on the root file system (device {_device(dev)}), not a separate drive; "
                         "fine for a trial, but the plan's SSD targets assume one drive per --ssd")
        elif len(ds) > 1:
            notes.append(f"--ssd {names}: all on one device ({_device(dev)}), not separate drives; their bins "
                         "share that drive's bandwidth, so the plan's per-SSD targets will not hold")
    return notes
