"""What the profiler's modules share: the progress callback and the date stamp."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable

#: a callable taking one line of progress text (the library never prints)
Progress = Callable[[str], None]


def _say(progress: Progress | None, msg: str) -> None:
    if progress is not None:
        progress(msg)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")

