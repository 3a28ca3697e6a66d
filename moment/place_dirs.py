"""``moment place``'s directories: create them, clean up (the "SSDs are one drive" warnings: training.place.run).

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


__all__ = ["make_dirs", "remove_created"]
