"""Rich progress bars for the commands: the CLI side of :class:`planner.progress.Progress`.

One :class:`Bars` per command run: it is a ``Progress`` callback (one bar per stage,
on stderr, with done/total, rate, elapsed time and ETA) and prints short notes above
the bars. It stays silent with ``--json`` (``quiet=True``) or when stdout or stderr
is not a terminal, so piped output and logs carry only the results.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING

#: set to a number of seconds to get one progress line per stage at most that often on stderr
#: when it is not a terminal (a run under nohup, logging to a file): done/total, rate and ETA
LOG_ENV = "MOMENT_PROGRESS_LOG"

if TYPE_CHECKING:  # rich is imported when bars are first shown
    from rich.progress import Progress, TaskID


def is_terminal() -> bool:
    """Whether both stdout and stderr are terminals (where bars belong)."""
    return sys.stdout.isatty() and sys.stderr.isatty()


class Bars:
    """A :class:`planner.progress.Progress` that draws rich bars; a context manager.

    ``quiet``: draw nothing (``--json``, ``--quiet``). ``unit``: what the counts count,
    shown in the rate column ("rows", "steps"). ``transient``: remove the bars when done.
    ``log_every_s``: where no bars are drawn (not a terminal), a progress line that often
    anyway (for work long enough that silence looks like a hang); :data:`LOG_ENV` overrides it.
    """

    def __init__(self, *, quiet: bool = False, unit: str = "", transient: bool = False,
                 log_every_s: float | None = None) -> None:
        self.enabled = not quiet and is_terminal()
        self.unit = unit
        self.transient = transient
        self.progress: Progress | None = None
        self.tasks: dict[str, TaskID] = {}
        every = os.environ.get(LOG_ENV, "")
        # asked for by name, so even with --json or --quiet (the lines go to stderr, not stdout)
        self.log_every_s = None if self.enabled else float(every) if every else None if quiet else log_every_s
        self._logged: dict[str, tuple[float, float, int]] = {}  # stage -> (started, last line, first done)

    def _log(self, stage: str, done: int, total: int | None) -> None:
        """One line now and then for a log file: the stage, done/total, rate and time left."""
        now = time.monotonic()
        started, last, first = self._logged.setdefault(stage, (now, 0.0, done))
        final = total is not None and done >= total
        if now - last < (self.log_every_s or 0.0) and not final:  # set whenever _log is called
            return
        self._logged[stage] = (started, now, first)
        # from the first count seen: a resumed run starts part-way and must not claim that part
        rate = (done - first) / (now - started) if now > started else 0.0
        eta = f", eta {(total - done) / rate:,.0f} s" if total is not None and rate > 0 else ""
        of = f" / {total:,}" if total is not None else ""
        shown = f"{rate:,.0f}" if rate >= 10 else f"{rate:.2g}"  # a few buckets a second is not "0/s"
        sys.stderr.write(f"{time.strftime('%H:%M:%S')} {stage}: {done:,}{of} ({shown}/s, "
                         f"{now - started:,.0f} s{eta})\n")
        sys.stderr.flush()

    def __enter__(self) -> Bars:
        if self.enabled and self.progress is None:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            console = Console(stderr=True, highlight=False, emoji=False, force_terminal=True)  # checked above
            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TaskProgressColumn(), TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                                     TextColumn("eta"), TimeRemainingColumn(), console=console,
                                     transient=self.transient)
            self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def __call__(self, stage: str, done: int, total: int | None, info: str = "") -> None:
        if self.log_every_s is not None:
            self._log(stage, done, total)
        if self.progress is None:
            return
        if total is None and done == 0 and stage not in self.tasks:
            self.note(stage)  # an announced step: a line, not a bar
            return
        if stage in self.tasks:
            was = self.progress.tasks[self.tasks[stage]]
            if was.finished and done < was.completed:  # the stage runs again (place's second pre-sample):
                del self.tasks[stage]                  # a bar of its own, the finished one stays as it ended
        if stage not in self.tasks:
            self.tasks[stage] = self.progress.add_task(stage, total=total, info=info)
        task = self.tasks[stage]
        if not info:  # the rate, in the stage's own units (rows, batches, steps)
            elapsed = self.progress.tasks[task].elapsed or 0.0
            info = f"{done / elapsed:,.0f}{' ' + self.unit if self.unit else ''}/s" if elapsed > 0 else ""
        self.progress.update(task, completed=done, total=total, info=info)

    def reset(self, stage: str) -> None:
        """Start ``stage``'s bar again from zero (its clock too): the next epoch."""
        if self.progress is not None and stage in self.tasks:
            self.progress.reset(self.tasks[stage])

    def note(self, text: str) -> None:
        """A dim line above the bars (nothing when quiet)."""
        if self.progress is not None:
            self.progress.console.print(f"… {text}", style="dim", markup=False, highlight=False)

    def print(self, text: str) -> None:
        """A plain line above the bars (nothing when quiet)."""
        if self.progress is not None:
            self.progress.console.print(text, markup=False, highlight=False)
