"""A fake ``kvikio`` module: KvikIO's Python API, by version, over plain ``os.pread`` (for CPU tests).

Shapes follow rapidsai/kvikio's sources: ``CuFile(path, flags)``,
``CuFile.pread(buf, size=None, file_offset=0, task_size=None) -> IOFuture``
(``get()`` returns the bytes read, ``done()``), ``kvikio.CompatMode``
(``OFF = 0``, ``ON = 1``, ``AUTO = 2``, from 24.12) and ``kvikio.defaults``:

* ``"24.10"``: ``compat_mode() -> bool``, ``get_num_threads()``, ``task_size()``,
  ``gds_threshold()``, ``*_reset(value)``;
* ``"24.12"``: the same, ``compat_mode()`` returning a ``CompatMode``;
* ``"25.04"``: adds ``get(name)``, ``set(name, value)``, ``is_compat_mode_preferred()``;
* ``"26.02"``: ``get``/``set``/``is_compat_mode_preferred`` only.

The reads really happen (into numpy arrays or CPU tensors), lazily at ``get()``,
so the module can count how many were in flight at once. Device buffers (tensors
that ``tests/fake_cuda.py`` labels device memory) are read as KvikIO's
``FileHandle::pread`` does (rapidsai/kvikio, cpp/src/file_handle.cpp): below
``gds_threshold`` synchronously in the caller and a ready future back; else,
with ``sync_default_stream`` (the default) and cuFile in use, the default
stream synchronised first, then the read split in ``task_size`` tasks for a
pool of ``num_threads``, written outside any stream at ``get()`` (or by a thread
after ``write_delay_s``). A device write is checked by the fake driver: memory
that queued GPU work still reads must not be overwritten.
"""

from __future__ import annotations

import enum
import os
import threading
import types

import numpy as np
import torch

VERSIONS = ("24.10", "24.12", "25.04", "26.02")


class CompatMode(enum.Enum):
    OFF = 0
    ON = 1
    AUTO = 2


def fake_kvikio(version: str = "26.02", compat: str = "AUTO", cufile_available: bool = False,
                num_threads: int = 1, gds_threshold: int = 16 << 10, task_size: int = 4 << 20,
                write_delay_s: float | None = None) -> types.ModuleType:
    """A ``kvikio`` module of ``version``; ``cufile_available`` is what ``AUTO`` resolves to."""
    mod = types.ModuleType("kvikio")
    mod.__version__ = version
    stats = {"preads": [], "in_flight": 0, "max_in_flight": 0, "opened": [], "closed": 0, "gets": 0,
             "device_preads": 0, "sync_reads": 0, "tasks": 0, "default_stream_syncs": 0}
    lock = threading.Lock()
    state = {"num_threads": num_threads, "gds_threshold": gds_threshold, "task_size": task_size,
             "compat_mode": CompatMode[compat]}
    mod.stats, mod.state = stats, state
    ver = tuple(int(x) for x in version.split("."))
    d = types.ModuleType("kvikio.defaults")

    def compat_value():
        m = state["compat_mode"]
        return m != CompatMode.OFF if ver < (24, 12) else m

    if ver >= (24, 12):
        mod.CompatMode = CompatMode
    if ver >= (25, 4):
        def get(name):
            return compat_value() if name == "compat_mode" else state[name]

        def set_(*config):
            items = config[0].items() if len(config) == 1 else [config]
            for k, v in items:
                state[k] = v
        d.get, d.set = get, set_

        def is_compat_mode_preferred():
            m = state["compat_mode"]
            return m == CompatMode.ON or (m == CompatMode.AUTO and not cufile_available)
        d.is_compat_mode_preferred = is_compat_mode_preferred
    if ver < (26, 2):
        d.compat_mode = compat_value
        d.task_size = lambda: state["task_size"]
        d.gds_threshold = lambda: state["gds_threshold"]
        if ver < (25, 4):
            d.get_num_threads = lambda: state["num_threads"]
        else:
            d.num_threads = lambda: state["num_threads"]

        def reset(name):
            def f(value):
                state[name] = CompatMode(value) if name == "compat_mode" and not isinstance(value, bool) else value
            return f
        for name in ("compat_mode", "num_threads", "task_size", "gds_threshold"):
            setattr(d, f"{name}_reset", reset(name))
    mod.defaults = d

    def device_of(buf):
        from tests.fake_cuda import DRIVER

        info = DRIVER.of(buf) if isinstance(buf, torch.Tensor) else None
        return info if info is not None and info.kind == "device" else None

    def write(fd, buf, size, offset):
        data = os.pread(fd, size, offset)
        if device_of(buf) is not None:
            from tests.fake_cuda import DRIVER, _Bypass

            DRIVER.touch([buf], {buf.untyped_storage().data_ptr()}, None, "a KvikIO read into device memory")
            with _Bypass():
                got = torch.frombuffer(bytearray(data), dtype=torch.uint8)
                buf.view(torch.uint8).reshape(-1)[:len(data)].copy_(got)
        else:
            arr = buf.numpy() if isinstance(buf, torch.Tensor) else buf
            np.asarray(arr).reshape(-1)[:len(data)] = np.frombuffer(data, np.uint8)
        return len(data)

    class IOFuture:
        def __init__(self, fd, buf, size, offset, ready=None):
            self._args = (fd, buf, size, offset)
            self._result = ready
            self._thread = None
            if ready is not None:
                return
            with lock:
                stats["in_flight"] += 1
                stats["max_in_flight"] = max(stats["max_in_flight"], stats["in_flight"])
            if write_delay_s is not None:
                def later():
                    threading.Event().wait(write_delay_s)
                    self._done(write(*self._args))
                self._thread = threading.Thread(target=later, daemon=True)
                self._thread.start()

        def _done(self, n):
            self._result = n
            with lock:
                stats["in_flight"] -= 1
                stats["gets"] += 1

        def get(self):
            if self._thread is not None:
                self._thread.join()
            if self._result is None:
                self._done(write(*self._args))
            return self._result

        def done(self):
            return self._result is not None

    class CuFile:
        def __init__(self, file, flags="r"):
            self._fd = os.open(file, os.O_RDONLY)
            stats["opened"].append(str(file))

        def pread(self, buf, size=None, file_offset=0, task_size=None):
            if isinstance(buf, torch.Tensor) and buf.device.type != "cpu":
                raise AssertionError("the fake kvikio reads into host (or fake device) memory only")
            n = (buf.numel() * buf.element_size() if isinstance(buf, torch.Tensor) else np.asarray(buf).nbytes) \
                if size is None else size
            with lock:
                stats["preads"].append((int(file_offset), int(n)))
            info = device_of(buf)
            if info is not None:
                stats["device_preads"] += 1
                if n < state["gds_threshold"]:  # the shortcut: a synchronous read, a ready future
                    stats["sync_reads"] += 1
                    return IOFuture(self._fd, buf, int(n), int(file_offset), ready=write(self._fd, buf, int(n),
                                                                                        int(file_offset)))
                compat = state["compat_mode"] == CompatMode.ON or (state["compat_mode"] == CompatMode.AUTO
                                                                   and not cufile_available)
                if not compat:  # sync_default_stream: once per pread, before cuFile
                    from tests.fake_cuda import DRIVER

                    d = DRIVER.default(info.index)
                    DRIVER.flush(d, d.seq)
                    stats["default_stream_syncs"] += 1
            ts = int(task_size or state["task_size"])
            stats["tasks"] += max(1, -(-int(n) // ts))  # parallel_io's split, run by num_threads threads
            return IOFuture(self._fd, buf, int(n), int(file_offset))

        def close(self):
            os.close(self._fd)
            stats["closed"] += 1

    mod.CuFile = CuFile
    return mod
