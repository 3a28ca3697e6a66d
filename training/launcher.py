"""A rank lives no longer than its launcher (issue 28 item 9).

``torchrun`` (or any launcher) starts the ranks as its children. When the launcher is
killed with ``kill -9`` it cannot stop them: they run on as orphans, keep their process
group alive among themselves (every peer is still there) and go on writing checkpoints of a
job nobody watches, which a new launch then resumes from or races with.

:func:`bind_to_launcher` ties this process to its parent: on Linux the kernel sends
``SIGKILL`` when the parent dies (``prctl(PR_SET_PDEATHSIG)``, through ctypes: nothing to
install), and everywhere a watchdog thread polls :func:`os.getppid` (an orphan is
re-parented) and kills the process itself. :class:`Launcher` answers whether the job is
still whole, which the trainer asks right before a checkpoint is put in place.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass

log = logging.getLogger(__name__)

#: linux/prctl.h
PR_SET_PDEATHSIG = 1
#: seconds between the watchdog's looks at the parent
WATCH_EVERY_S = 0.5


@dataclass(frozen=True)
class Launcher:
    """The process that started this rank: its pid when the rank was bound."""

    pid: int

    def alive(self) -> bool:
        """Whether the launcher is still this process's parent (a dead one's orphans are re-parented)."""
        return os.getppid() == self.pid


def _parent_death_signal(sig: int) -> bool:
    """``prctl(PR_SET_PDEATHSIG, sig)``; whether the kernel took it (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _stop(launcher: Launcher) -> None:
    sys.stderr.write(f"rank process {os.getpid()}: its launcher (process {launcher.pid}) is gone; stopping\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _watch(launcher: Launcher) -> None:
    stop = threading.Event()  # never set: the thread is a daemon and ends with the process
    while not stop.wait(WATCH_EVERY_S):
        if not launcher.alive():
            _stop(launcher)


_bound: Launcher | None = None


def bind_to_launcher() -> Launcher:
    """Make this process end when its parent (the launcher of the ranks) ends; the parent.

    Idempotent: a second call returns the first binding. Call it before the work starts.

    Returns
    -------
    Launcher
        The parent, to ask :meth:`Launcher.alive` before an irreversible step.
    """
    global _bound
    if _bound is not None:
        return _bound
    launcher = Launcher(os.getppid())
    _bound = launcher
    if _parent_death_signal(signal.SIGKILL):
        log.debug("rank %d: SIGKILL when process %d ends", os.getpid(), launcher.pid)
    # the watchdog also where prctl works: a parent that died before prctl was called sends nothing
    threading.Thread(target=_watch, args=(launcher,), name="moment-launcher-watch", daemon=True).start()
    return launcher


__all__ = ["Launcher", "bind_to_launcher"]
