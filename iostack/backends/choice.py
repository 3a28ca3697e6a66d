"""Which asynchronous read engine the ``posix`` backend uses for O_DIRECT bins: measured, per device.

Native AIO and io_uring both keep the whole queue depth in flight from one thread;
which is faster depends on the kernel and the device (on the 2-core virtual
machines this project is measured on they are within noise of each other, at
0.90-0.92 of fio). So ``engine="auto"`` follows a measurement when there is one: ``moment bench
io raw --engine all`` (and ``tools/bench_io.py``) measure every engine against fio
on the device of ``--dir`` and record the one with the best median ratio here, in
``$MOMENT_CACHE_DIR/io-engines.json`` (default ``~/.cache/moment``), keyed by the
device number of the file system. Without a record for a bin's device, ``auto``
takes :data:`DEFAULT_ORDER`, the first engine that works.

>>> import tempfile, os
>>> with tempfile.TemporaryDirectory() as d:
...     os.environ["MOMENT_CACHE_DIR"] = d
...     before = recorded_engine(d)
...     _ = record_engine(d, "uring", {"uring": 1.01, "aio": 0.99})
...     before, recorded_engine(d)
(None, 'uring')
>>> del os.environ["MOMENT_CACHE_DIR"]
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

#: ``auto`` without a record: the first of these that works here. Measured here, 42 runs each
#: paired with fio io_uring over four sessions: native AIO 0.92, io_uring 0.90 (pooled medians;
#: the same CPU time). Again on 2026-11-25 with the cheaper per-call sort, each engine and fio in
#: the same rounds (load 3-7, shared machine): ``tools/bench_io.py --runs 10 --seconds 5`` three
#: times, AIO 0.88, 0.92 and 1.02, io_uring 0.88, 0.81 and 0.88; 16 interleaved 2 s rounds three
#: times, AIO 1.00, 1.03 and 1.04, io_uring 0.91, 0.98 and 0.95. Native AIO stays first: it measured no slower in
#: any of them, and it works where io_uring is switched off (``kernel.io_uring_disabled``,
#: container seccomp profiles). A device measured otherwise gets its own record.
DEFAULT_ORDER = ("aio", "uring")


def record_file() -> Path:
    """Where engine measurements are kept (``$MOMENT_CACHE_DIR``, else ``$XDG_CACHE_HOME/moment``, else
    ``~/.cache/moment``)."""
    base = os.environ.get("MOMENT_CACHE_DIR")
    if not base:
        base = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "moment")
    return Path(base) / "io-engines.json"


def device_key(path: str | os.PathLike[str]) -> str:
    """``"MAJOR:MINOR"`` of the file system holding ``path`` (a file or directory)."""
    st = os.stat(path)
    return f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"


def _load() -> dict:
    try:
        data = json.loads(record_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def recorded_engine(path: str | os.PathLike[str]) -> str | None:
    """The engine measured fastest on ``path``'s device, or None when none was recorded."""
    try:
        entry = _load().get(device_key(path))
    except OSError:
        return None
    engine = entry.get("engine") if isinstance(entry, dict) else None
    return engine if engine in DEFAULT_ORDER else None


def record_engine(path: str | os.PathLike[str], engine: str, ratios: dict[str, float]) -> Path:
    """Record ``engine`` as the one to use on ``path``'s device (``ratios``: median ours/fio of each
    engine measured, kept for the reader). Returns the record file. Written atomically."""
    if engine not in DEFAULT_ORDER:
        raise ValueError(f"engine {engine!r} is not one of {', '.join(DEFAULT_ORDER)}")
    f = record_file()
    data = _load()
    data[device_key(path)] = {"engine": engine, "median_ratio_to_fio": {k: round(v, 3) for k, v in ratios.items()},
                              "measured_on": str(Path(path).resolve()),
                              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    f.parent.mkdir(parents=True, exist_ok=True)
    tmp = f.with_name(f".{f.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, f)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return f
