"""Several files of a directory replaced as one: staged files renamed into place under a commit record.

A re-placement (:mod:`training.place.replace`) replaces a placement's index
(``bin_of.npy``, ``row_of.npy``, ``placement.json``) and some of its bin files
(each with its manifest): several renames, and a crash between two of them would
leave an index that matches no bins. Here every new file is first written whole
under a staged name in the same directory tree (so a rename moves it); then one
record, :data:`COMMIT`, listing the ``(staged, final)`` pairs, is renamed into
place: from that rename on, the replacement is decided. The renames follow, then
the record is removed. :func:`finish` completes a record a crash left behind
(each staged file still there is renamed; those renamed already are skipped), and
:func:`iostack.placement.load_placement` calls it first: whoever opens the
directory next finds either all the old files or all the new ones.

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> _ = (d / "a").write_text("old a"); _ = (d / "b").write_text("old b")
>>> _ = (d / "a.new").write_text("new a"); _ = (d / "b.new").write_text("new b")
>>> commit(d, [("a.new", "a"), ("b.new", "b")])
>>> (d / "a").read_text(), (d / "b").read_text(), sorted(p.name for p in d.iterdir())
('new a', 'new b', ['a', 'b'])
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

from iostack.errors import StoreError

__all__ = ["COMMIT", "commit", "finish", "pending"]

#: the commit record's name in the directory
COMMIT = ".commit.json"


def _fsync_dir(d: Path) -> None:
    """Make the directory's renames durable (where the file system allows opening a directory)."""
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def commit(directory: str | os.PathLike[str], pairs: Sequence[tuple[str, str]], *, fsync: bool = True) -> None:
    """Rename each staged file of ``pairs`` (``(staged, final)``, relative to ``directory`` or absolute) over
    its final name, all or none: the decision is one rename of the commit record.

    Raises
    ------
    StoreError
        A staged file is missing (nothing is renamed), or the record cannot be written.
    """
    d = Path(directory)
    for staged, _ in pairs:
        if not (d / staged).exists():
            raise StoreError(f"{d / staged}: a staged file is missing; nothing of this replacement was renamed")
    rec, tmp = d / COMMIT, d / (COMMIT + ".tmp")
    try:
        with open(tmp, "w") as f:
            json.dump({"format": "moment-commit", "version": 1, "renames": [list(p) for p in pairs]}, f)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, rec)  # the decision
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise StoreError(f"{rec}: cannot write the commit record: {exc.strerror or exc}") from None
    if fsync:
        _fsync_dir(d)
    finish(d, fsync=fsync)


def pending(directory: str | os.PathLike[str]) -> bool:
    """Whether a commit record waits in ``directory`` (a replacement decided but not finished)."""
    return (Path(directory) / COMMIT).exists()


def finish(directory: str | os.PathLike[str], *, fsync: bool = True) -> bool:
    """Complete the renames of a commit record in ``directory``, if there is one; whether there was.

    Idempotent: a crash while finishing leaves the record, and the next call finishes the rest.

    Raises
    ------
    StoreError
        The record is unreadable, or a rename fails (the record stays for the next try).
    """
    d = Path(directory)
    rec = d / COMMIT
    try:
        data = json.loads(rec.read_text())
    except FileNotFoundError:
        return False
    except (OSError, ValueError) as exc:
        raise StoreError(f"{rec}: cannot read the commit record of a replacement ({exc}); remove it to keep the "
                         "files as they are, or place again") from None
    try:
        for staged, final in data["renames"]:
            if (d / staged).exists():
                os.replace(d / staged, d / final)
        if fsync:
            _fsync_dir(d)
        rec.unlink()
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreError(f"{rec}: not a commit record this Moment reads ({exc}); remove it and place again") from None
    except OSError as exc:
        raise StoreError(f"{rec}: cannot finish the replacement it records: {exc.strerror or exc}") from None
    return True
