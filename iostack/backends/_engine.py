"""The read loop of the ``posix`` backend and its worker processes. Standard library only.

A *job* is a list of reads ``(file offset, bytes, staging offset)`` stored as
int64 triples in a shared control buffer; every read lands at its offset in a
shared, page-aligned staging buffer (a ``memfd`` mapped by the parent and by
each worker). Plain Python issuing one ``preadv`` per read is bound by per-call
overhead and the GIL, not the device (``shared/notes/io-baseline.md``), so the
backend runs several worker processes, each with a few threads (``moment
profile`` measures SSDs with this same reader, :mod:`hwprofile.ssd`). Workers are fresh
interpreters (``python -m iostack.backends._engine``): forking a process with
threads is unsafe and importing numpy there would cost more than it saves.

Protocol, one JSON line each way on the worker's stdin/stdout:
``{"op": "open", "fid": 3, "path": ..., "direct": true}`` → ``{"ok": true}``;
``{"op": "read", "fid": 3, "start": i, "end": j}`` (reads ``i..j-1`` of the
control buffer) → ``{"ok": true}`` or ``{"ok": false, "error": ...}``;
``{"op": "close", "fid": 3}``; end of stdin ends the worker.
"""

from __future__ import annotations

import json
import mmap
import os
import queue
import sys
import threading


class ReadFailed(Exception):
    """A read failed or hit the end of the file before its last byte."""


def open_for_read(path: str, direct: bool) -> int:
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
    if direct:
        flags |= os.O_DIRECT
    return os.open(path, flags)


def read_range(fd: int, ctl: memoryview, staging: memoryview, start: int, end: int) -> None:
    """Do reads ``start..end-1`` of ``ctl`` (int64 triples) into ``staging``.

    ``os.preadv`` retries by itself on EINTR (PEP 475); a short read, which a
    regular file gives only at its end or under memory pressure, is continued
    from where it stopped, and a read that returns 0 bytes early is an error.
    """
    preadv = os.preadv
    for i in range(3 * start, 3 * end, 3):
        off, n, so = ctl[i], ctl[i + 1], ctl[i + 2]
        got = preadv(fd, [staging[so:so + n]], off)
        while got < n:  # short read: go on from where it stopped
            if got <= 0:
                raise ReadFailed(f"read of {n} bytes at offset {off} hit the end of the file")
            more = preadv(fd, [staging[so + got:so + n]], off + got)
            if more <= 0:
                raise ReadFailed(f"read of {n} bytes at offset {off} hit the end of the file")
            got += more


class ThreadReader:
    """``threads`` persistent threads that split each job's range between them."""

    def __init__(self, threads: int) -> None:
        self._inbox: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(threads)]
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._loop, args=(q,), daemon=True) for q in self._inbox]
        for t in self._threads:
            t.start()

    def _loop(self, inbox: queue.SimpleQueue) -> None:
        while True:
            job = inbox.get()
            if job is None:
                return
            fd, ctl, staging, a, b = job
            try:
                read_range(fd, ctl, staging, a, b)
                self._done.put(None)
            except (OSError, ReadFailed) as exc:
                self._done.put(str(exc) if isinstance(exc, ReadFailed) else f"read failed: {exc.strerror or exc}")

    def run(self, fd: int, ctl: memoryview, staging: memoryview, start: int, end: int) -> str | None:
        """Do reads ``start..end-1``; the first error message, or None."""
        n = end - start
        if n <= 0:
            return None
        k = min(len(self._inbox), n)
        bounds = [start + n * i // k for i in range(k + 1)]
        for i in range(k):
            self._inbox[i].put((fd, ctl, staging, bounds[i], bounds[i + 1]))
        errors = [self._done.get() for _ in range(k)]
        return next((e for e in errors if e), None)

    def close(self) -> None:
        for q in self._inbox:
            q.put(None)
        for t in self._threads:
            t.join(timeout=5)


def _send(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def worker_main(cfg: dict) -> int:
    """A worker process: map the shared buffers, then serve jobs until stdin closes."""
    ctl_map = mmap.mmap(cfg["ctl_fd"], cfg["ctl_bytes"])
    stg_map = mmap.mmap(cfg["staging_fd"], cfg["staging_bytes"])
    ctl = memoryview(ctl_map).cast("q")
    staging = memoryview(stg_map)
    reader = ThreadReader(cfg["threads"])
    fds: dict[int, int] = {}
    try:
        for line in sys.stdin:
            msg = json.loads(line)
            op = msg["op"]
            if op == "open":
                try:
                    fds[msg["fid"]] = open_for_read(msg["path"], msg["direct"])
                    _send({"ok": True})
                except OSError as exc:
                    _send({"ok": False, "error": f"cannot open {msg['path']}: {exc.strerror or exc}"})
            elif op == "close":
                fd = fds.pop(msg["fid"], None)
                if fd is not None:
                    os.close(fd)
            elif op == "read":
                err = reader.run(fds[msg["fid"]], ctl, staging, msg["start"], msg["end"])
                _send({"ok": err is None, "error": err})
        return 0
    finally:
        reader.close()
        for fd in fds.values():
            os.close(fd)
        ctl.release()
        staging.release()
        ctl_map.close()
        stg_map.close()


if __name__ == "__main__":
    sys.exit(worker_main(json.loads(sys.argv[1])))
