"""The one progress callback every long-running library function takes.

The libraries never print. A function that can run for more than a couple of seconds
takes ``progress: Progress | None = None`` and calls it as work advances;
the command line turns the calls into rich progress bars (``moment/bars.py``), a
test records them. It lives at the bottom layer so that planner, iostack and
training share one type.

A call ``progress(stage, done, total)`` says: of the work named ``stage``, ``done``
units of ``total`` are finished (``total`` None: the amount is not known ahead).
``stage`` names one piece of work and stays the same while it advances
("presample", "bin 3"); a call with ``done == 0`` and ``total`` None just
announces a step ("fio: 4 KiB random reads, 5 s").

>>> seen = []
>>> def record(stage: str, done: int, total: int | None) -> None:
...     seen.append((stage, done, total))
>>> report(record, "ddak", 1, 3); report(None, "ddak", 2, 3)
>>> seen
[('ddak', 1, 3)]
"""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    """``progress(stage, done, total)``: ``done`` units of ``stage`` finished, of ``total`` (None: unknown)."""

    def __call__(self, stage: str, done: int, total: int | None, /) -> None: ...


def report(progress: Progress | None, stage: str, done: int = 0, total: int | None = None) -> None:
    """Call ``progress`` when there is one (``report(cb, "fio: ...")`` announces a step)."""
    if progress is not None:
        progress(stage, done, total)
