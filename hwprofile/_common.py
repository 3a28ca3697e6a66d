"""What the profiler's modules share: the progress callback and the date stamp."""

from __future__ import annotations

import datetime as _dt

__all__ = ["_now"]


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
