"""Random aligned block reads with ``os.preadv``: Moment's own POSIX reader for profiling.

Kept to the standard library on purpose: each worker process is a fresh
interpreter running this module, and importing numpy or networkx there
would cost more than a short measurement lasts.

Plain Python issuing one ``preadv`` per block is limited by per-call overhead
and the GIL, not by the device, and more threads in one process make it
worse past 16 or so (``shared/notes/io-baseline.md``); several processes with
a few threads each get closer to fio. :func:`run_readers` does that.

A test file written by :func:`planner.profile.write_test_file` carries its
own byte offset in the first 8 bytes of every 512-byte sector (XOR
:data:`MAGIC`), so each read can be checked against the offset it was issued
for: a reader that returned the wrong block, or zeros, is caught.

>>> import tempfile, os
>>> with tempfile.TemporaryDirectory() as d:
...     p = os.path.join(d, "f")
...     _ = open(p, "wb").write(bytes(range(256)) * 32)
...     [b[:4] for b in read_blocks(p, [0, 4096], 4096, direct=False)]
[b'\\x00\\x01\\x02\\x03', b'\\x00\\x01\\x02\\x03']
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import random
import selectors
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: XORed with a sector's byte offset to make the header of every 512-byte sector
MAGIC = 0x4D4F4D454E542121  # b"MOMENT!!"

#: granularity of the offset headers, bytes (the smallest O_DIRECT alignment)
SECTOR = 512

#: reads between two looks at the clock
_BATCH = 32


class ReadError(Exception):
    """A read failed, returned too few bytes, or returned the wrong block."""


def open_for_read(path: str, direct: bool) -> int:
    """A read-only descriptor of ``path``, with ``O_DIRECT`` when ``direct``."""
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
    if direct:
        flags |= os.O_DIRECT
    return os.open(path, flags)


def read_blocks(path: str, offsets: Sequence[int], block_bytes: int, direct: bool) -> list[bytes]:
    """The ``block_bytes`` bytes at each of ``offsets``, read as the profiler reads them.

    Same code path as the timed loop (an mmap-allocated, page-aligned buffer
    and ``os.preadv``), so that tests can check what it returns.
    """
    fd = open_for_read(path, direct)
    try:
        buf = mmap.mmap(-1, block_bytes)
        out = []
        for off in offsets:
            n = os.preadv(fd, [buf], off)
            if n != block_bytes:
                raise ReadError(f"{path}: read of {block_bytes} bytes at offset {off} returned {n}")
            out.append(buf[:])
        buf.close()
        return out
    finally:
        os.close(fd)


def _read_loop(fd: int, nblocks: int, block_bytes: int, deadline: float, seed: int,
               verify: bool, out: list[Any], slot: int) -> None:
    """Random reads until ``deadline``; ``out[slot] = (reads, error or None)``."""
    buf = mmap.mmap(-1, block_bytes)  # page-aligned, as O_DIRECT needs
    bufs = [buf]
    randrange = random.Random(seed).randrange
    preadv = os.preadv
    monotonic = time.monotonic
    count = 0
    try:
        while True:
            for _ in range(_BATCH):
                off = randrange(nblocks) * block_bytes
                if preadv(fd, bufs, off) != block_bytes:
                    raise ReadError(f"a read of {block_bytes} bytes at offset {off} came back short")
                if verify and int.from_bytes(buf[:8], "little") ^ MAGIC != off:
                    raise ReadError(f"the block read at offset {off} is not the one written there")
            count += _BATCH
            if monotonic() >= deadline:
                break
        out[slot] = (count, None)
    except (OSError, ReadError) as exc:
        msg = str(exc) if isinstance(exc, ReadError) else f"read failed: {exc.strerror or exc}"
        out[slot] = (count, msg)
    finally:
        buf.close()


def _worker(cfg: dict[str, Any]) -> int:
    """One worker process: ``threads`` threads reading for ``seconds`` after the parent says go.

    Speaks one JSON line per step on stdout: ``{"status": "ready"}`` once the
    file is open, then (after a ``go`` line on stdin) ``{"status": "done",
    "reads": ..., "elapsed": ..., "error": ...}``; ``{"status": "error"}`` if
    the file cannot be opened.
    """
    try:
        fd = open_for_read(cfg["path"], cfg["direct"])
    except OSError as exc:
        _send({"status": "error", "error": f"cannot open {cfg['path']}: {exc.strerror or exc}"})
        return 1
    try:
        _send({"status": "ready"})
        if sys.stdin.readline().strip() != "go":
            return 0
        t0 = time.monotonic()
        threads = cfg["threads"]
        out: list[Any] = [(0, None)] * threads
        workers = [threading.Thread(target=_read_loop,
                                    args=(fd, cfg["nblocks"], cfg["block_bytes"], t0 + cfg["seconds"],
                                          cfg["seed"] * 1009 + i, cfg["verify"], out, i), daemon=True)
                   for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        elapsed = time.monotonic() - t0
        errors = [e for _, e in out if e]
        _send({"status": "done", "reads": sum(n for n, _ in out), "elapsed": elapsed,
               "error": errors[0] if errors else None})
        return 0
    finally:
        os.close(fd)


def _send(msg: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def run_readers(path: str, *, direct: bool, block_bytes: int, nblocks: int, processes: int,
                threads: int, seconds: float, verify: bool, seed: int = 0,
                timeout_s: float = 60.0) -> tuple[int, float]:
    """``processes`` × ``threads`` readers for ``seconds``: ``(reads, elapsed_s)``.

    The workers are fresh interpreters running this module (``python -m
    planner._posixread``), not forks: forking a process that has threads is
    unsafe, and multiprocessing's spawn re-runs the parent's main script,
    which fails from a notebook or stdin. ``elapsed_s`` is the longest
    worker's time from the common start to its last read. Raises
    :class:`ReadError` on any failed or wrong read, or when a worker dies or
    does not answer within ``timeout_s``.
    """
    env = dict(os.environ)
    # the workers must import this very package, installed or not
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    procs: list[subprocess.Popen[str]] = []
    try:
        for k in range(processes):
            cfg = {"path": path, "direct": direct, "block_bytes": block_bytes, "nblocks": nblocks,
                   "threads": threads, "seconds": seconds, "seed": seed * 7919 + k, "verify": verify}
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "planner._posixread", json.dumps(cfg)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, env=env, close_fds=True))
        for p in procs:
            msg = _expect(p, timeout_s, "start")
            if msg.get("status") != "ready":
                raise ReadError(str(msg.get("error") or msg))
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        reads, elapsed, error = 0, 0.0, None
        for p in procs:
            msg = _expect(p, seconds + timeout_s, "finish")
            if msg.get("status") != "done":
                raise ReadError(str(msg.get("error") or msg))
            reads += int(msg["reads"])
            elapsed = max(elapsed, float(msg["elapsed"]))
            error = error or msg.get("error")
        if error:
            raise ReadError(error)
        return reads, elapsed
    finally:
        for p in procs:
            if p.poll() is None:
                if p.stdin is not None:  # a worker still waiting for "go" then exits
                    with contextlib.suppress(OSError):
                        p.stdin.close()
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            for f in (p.stdin, p.stdout, p.stderr):
                if f is not None:
                    with contextlib.suppress(OSError):
                        f.close()


def _expect(p: subprocess.Popen[str], timeout_s: float, what: str) -> dict[str, Any]:
    """The next JSON line from worker ``p``, or :class:`ReadError` if it dies or stays silent."""
    assert p.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(p.stdout, selectors.EVENT_READ)
        if not sel.select(timeout_s):
            raise ReadError(f"a reader process did not {what} within {timeout_s:.0f} s")
    line = p.stdout.readline()
    if not line:
        p.wait(timeout=5)
        tail = (p.stderr.read() if p.stderr else "").strip().splitlines()[-1:]
        raise ReadError(f"a reader process exited ({p.returncode}) before it could {what}"
                        + (f": {tail[0]}" if tail else ""))
    try:
        msg = json.loads(line)
    except ValueError:
        raise ReadError(f"a reader process said {line.strip()!r}") from None
    return msg if isinstance(msg, dict) else {"error": repr(msg)}


if __name__ == "__main__":
    sys.exit(_worker(json.loads(sys.argv[1])))
