"""Every block of the dataset arrays training reads, checked against its CRC-32 while training runs.

:func:`training.data.open_dataset` checks a sample of blocks, and an SSD bin checks
each block the first time it is read (:mod:`iostack.binverify`). The dataset's own
arrays that training reads in place (the CSR, labels and splits; the features too
when no placement holds them) are memory-mapped: a check per read would be a CRC
per page fault. Instead a :class:`DatasetWatch` reads each of them once, block by
block, on a background thread at the lowest CPU priority, and keeps the first bad
block it finds. The trainer asks at every epoch's end, before that epoch's
checkpoint (:meth:`DatasetWatch.raise_if_bad`), and waits for the whole check before
its results are final (:meth:`DatasetWatch.finish`): a run over a corrupt dataset
stops with the file and block named instead of ending with exit 0. What it costs
is one sequential read of those arrays during the first epoch (they are then in
the page cache, where sampling wants them); ``tools/bench_integrity.py`` measures it.

>>> import tempfile
>>> from pathlib import Path
>>> from training.synth import SynthSpec
>>> from training.synth_run import synthesize
>>> root = Path(tempfile.mkdtemp()) / "ds"
>>> _ = synthesize(root, SynthSpec(num_nodes=300, num_edges=2000, feature_dim=8))
>>> with DatasetWatch(root, ("indptr", "indices", "labels")) as watch:
...     watch.finish()
'CRC-32 verified: all 3 block(s) of 3 file(s)'
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

from training.data import DatasetError, read_meta, verify_checksums


class _Stopped(Exception):
    """Raised inside the check to end it early (the run ended first)."""


class DatasetWatch:
    """A background check of ``keys`` (``meta.json`` file keys: ``"indptr"``, ``"features"`` ...) of
    the dataset at ``root``; a context manager that starts it and, on leaving, stops it.

    ``keys`` the dataset does not hold are skipped. A dataset written before Moment
    recorded checksums has nothing to check: :meth:`finish` says so.
    """

    def __init__(self, root: str | os.PathLike[str], keys: Iterable[str]) -> None:
        self.root = Path(root)
        self.keys = tuple(dict.fromkeys(keys))
        self._stop = threading.Event()
        self._error: DatasetError | None = None
        self._done: str | None = None
        self._thread = threading.Thread(target=self._run, name="moment-dataset-verify", daemon=True)

    def start(self) -> DatasetWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        # the lowest priority for this thread alone (Linux schedules threads as tasks): the
        # check must not take a core from the sampler or the model
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)

        def stop_if_asked(_what: str, _done: int, _total: int | None, /) -> None:
            if self._stop.is_set():
                raise _Stopped

        try:
            meta = read_meta(self.root)
            self._done = verify_checksums(self.root, meta, "full", stop_if_asked, keys=self.keys)
        except _Stopped:
            pass
        except DatasetError as exc:
            self._error = exc
        except OSError as exc:  # the file went away or became unreadable during the run
            where = exc.filename or self.root
            self._error = DatasetError(f"{where}: cannot read it to check the dataset ({exc.strerror or exc}); "
                                       "a file of the dataset went away during the run")

    @property
    def checked(self) -> bool:
        """Whether the whole check has ended (with or without finding damage)."""
        return not self._thread.is_alive() and (self._done is not None or self._error is not None)

    def raise_if_bad(self) -> None:
        """Raise the :class:`~training.data.DatasetError` of the first bad block found so far, if any.

        Raises
        ------
        DatasetError
            Naming the file and block that does not match its recorded CRC-32.
        """
        if self._error is not None:
            raise self._error

    def finish(self, timeout_s: float | None = None) -> str:
        """Wait for the whole check (at most ``timeout_s``); what was checked, as a sentence.

        Raises
        ------
        DatasetError
            When a block does not match its CRC-32, or the check did not end within ``timeout_s``.
        """
        if not self._thread.is_alive() and self._done is None and self._error is None:
            self.start()
        self._thread.join(timeout_s)
        self.raise_if_bad()
        if self._done is None:
            raise DatasetError(f"{self.root}: the dataset check did not end within {timeout_s} s; "
                               "its results are not final")
        return self._done

    def close(self) -> None:
        """Stop the check (it ends within one 256 MiB step) and wait for its thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def __enter__(self) -> DatasetWatch:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


__all__ = ["DatasetWatch"]
