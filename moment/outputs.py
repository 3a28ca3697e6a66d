"""Outputs checked before the work: a file or directory option that cannot be written fails in one line first.

A command that writes a picture or a report after minutes of work used to fail only then, as an
"internal error": an unknown suffix, a directory where a file was wanted, the input named as the
output, a read-only or full disk. :func:`check_file` and :func:`check_dir` say what is wrong
before anything runs. A disk that fills during the work is still possible; the writers
themselves fail cleanly then (and :func:`moment.cli.main` names the path).

>>> import tempfile, os
>>> d = tempfile.mkdtemp()
>>> check_file(os.path.join(d, "p.svg"), "--svg", suffixes=(".svg",)).name
'p.svg'
>>> check_file(d, "--svg")
Traceback (most recent call last):
...
moment.errors.CommandError: --svg ...: is a directory; name a file in it
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from moment.errors import CommandError


def _existing(p: Path) -> Path:
    """``p`` or its nearest ancestor that exists (where a directory would be created)."""
    p = p.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _room(where: Path, what: str, option: str, path: Path) -> None:
    """Can ``where`` (an existing directory) take new files? A one-line error naming ``option`` if not."""
    if not os.access(where, os.W_OK | os.X_OK):  # EROFS answers W_OK even for root
        why = "read-only file system" if _read_only(where) else "no permission to write there"
        raise CommandError(f"{option} {path}: cannot write {what} there ({where}: {why})")
    st = os.statvfs(where)
    if st.f_bavail * st.f_frsize == 0:
        raise CommandError(f"{option} {path}: cannot write {what} there ({where}: no space left on the device); "
                           "free some or choose another place")


def _read_only(where: Path) -> bool:
    return bool(os.statvfs(where).f_flag & os.ST_RDONLY)


def _same(a: Path, inputs: Iterable[str | os.PathLike[str] | None]) -> Path | None:
    for i in inputs:
        if i is not None and a.exists() and Path(i).exists() and os.path.samefile(a, i):
            return Path(i)
    return None


def check_file(path: str | os.PathLike[str], option: str, *, suffixes: Iterable[str] = (),
               inputs: Iterable[str | os.PathLike[str] | None] = (), what: str = "the file") -> Path:
    """``path`` as an output file of ``option``: not a directory, a known suffix (when ``suffixes`` are
    given, lower case with the dot), not one of ``inputs``, in an existing directory that can be
    written and has room.

    Returns
    -------
    Path
        ``path``, checked.

    Raises
    ------
    CommandError
        In one line naming ``option``, when any of the above does not hold.
    """
    p = Path(path)
    if p.is_dir():
        raise CommandError(f"{option} {p}: is a directory; name a file in it")
    known = tuple(suffixes)
    if known and p.suffix.lower() not in known:
        raise CommandError(f"{option} {p}: unknown suffix {p.suffix or '(none)'!r}; expected "
                           f"{', '.join(known)}")
    same = _same(p, inputs)
    if same is not None:
        raise CommandError(f"{option} {p}: is the input {same}; writing there would destroy it, name another file")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise CommandError(f"{option} {p}: cannot write {what} there ({parent}: no such directory)")
    _room(parent, what, option, p)
    return p


def check_dir(path: str | os.PathLike[str], option: str, *,
              inputs: Iterable[str | os.PathLike[str] | None] = (), what: str = "files") -> Path:
    """``path`` as an output directory of ``option`` (made later if missing): not an existing file (nor
    one of ``inputs``), and its nearest existing ancestor can be written and has room.

    Returns
    -------
    Path
        ``path``, checked.

    Raises
    ------
    CommandError
        In one line naming ``option``, when any of the above does not hold.
    """
    p = Path(path)
    same = _same(p, inputs)
    if same is not None:
        raise CommandError(f"{option} {p}: is the input {same}; name a directory for the output")
    if p.exists() and not p.is_dir():
        raise CommandError(f"{option} {p}: is a file, not a directory; name a directory")
    where = _existing(p)
    if not where.is_dir():
        raise CommandError(f"{option} {p}: {where} is a file, not a directory")
    _room(where, what, option, p)
    return p


__all__ = ["check_dir", "check_file"]
