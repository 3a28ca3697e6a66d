"""What the profiler's modules share: the progress callback and the date stamp."""

from __future__ import annotations

import datetime as _dt

from planner.progress import Progress, report


def _say(progress: Progress | None, msg: str) -> None:
    """Announce a step through the project's one progress callback (:mod:`planner.progress`)."""
    report(progress, msg)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")

