"""Read backends behind one interface: :class:`ReadBackend`, picked by :func:`get_backend`.

* ``posix``: ``os.preadv`` / native AIO / io_uring, O_DIRECT where allowed; runs anywhere.
  Reads land in host memory (on a GPU machine: pinned staging, then one copy up).
* ``kvikio``: KvikIO ``CuFile.pread`` straight into GPU memory (GPUDirect Storage when
  the driver has it); needs CUDA, imported only when asked for.

``auto`` is decided by measurement, not by what is installed
(:func:`choose_backend`): ``moment profile --ssd DIR`` on a CUDA machine times
both backends reading random rows into GPU memory
(:data:`TOOL_POSIX_TO_GPU`, :data:`TOOL_KVIKIO_TO_GPU`), and ``kvikio`` is
chosen only where it measured faster on every SSD holding bins.

>>> get_backend("posix", processes=0).name
'posix'
>>> choose_backend("auto", cuda=False).name
'posix'
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from iostack.backends.base import BinHandle, ReadBackend
from iostack.errors import StoreError

BACKENDS = ("auto", "posix", "kvikio")

#: tools of the capacities-file measurements ``auto`` compares: random rows into GPU memory
TOOL_POSIX_TO_GPU = "moment-posix-to-gpu"
TOOL_KVIKIO_TO_GPU = "moment-kvikio-to-gpu"


@dataclass(frozen=True)
class BackendChoice:
    """The backend to use and why (said in the trainer's start record)."""

    name: str
    reason: str


def _best(measurements: Iterable[Any], tool: str) -> float | None:
    rates = [m.read_bytes_per_s for m in measurements if m.tool == tool]
    return max(rates) if rates else None


def choose_backend(name: str = "auto", *, cuda: bool, capacities: Any = None,
                   paths: Iterable[str] = (), sys_root: str = "/sys") -> BackendChoice:
    """The read backend for bins at ``paths``: ``name`` itself unless it is ``auto``.

    ``auto``: ``posix`` without CUDA (reads go to host memory anyway), else
    ``kvikio`` only if ``capacities`` (a :class:`planner.capacities.Capacities`)
    holds both backends' into-GPU measurements for the SSD of every path and
    KvikIO's is the faster on each; otherwise ``posix``, saying why.
    """
    if name not in BACKENDS:
        raise StoreError(f"unknown read backend {name!r}: choose one of {', '.join(BACKENDS)}")
    if name != "auto":
        return BackendChoice(name, "asked for")
    if not cuda:
        return BackendChoice("posix", "no CUDA device: rows are read into host memory")
    hint = "run `moment profile --ssd DIR --out caps.yaml` on this machine and pass --capacities caps.yaml"
    if capacities is None:
        return BackendChoice("posix", f"no measurement says KvikIO is faster here ({hint})")
    from planner.hostinfo import block_device_of

    paths = list(paths)
    verdicts = []
    for path in paths:
        disk = block_device_of(path, sys_root).name
        dev = next((d for d in capacities.devices if disk and d.block_device == disk), None)
        if dev is None:
            return BackendChoice("posix", f"{path}: the capacities have no figures for its disk {disk or '?'} ({hint})")
        kv, px = _best(dev.measurements(), TOOL_KVIKIO_TO_GPU), _best(dev.measurements(), TOOL_POSIX_TO_GPU)
        if kv is None or px is None:
            return BackendChoice("posix", f"{disk}: reads into GPU memory were not measured for both backends "
                                          f"({hint})")
        verdicts.append((disk, kv, px))
    if not verdicts:
        return BackendChoice("posix", "no SSD bins")
    slower = [(d, kv, px) for d, kv, px in verdicts if kv <= px]
    figures = "; ".join(f"{d}: kvikio {kv / 1e9:.2f} GB/s, posix {px / 1e9:.2f} GB/s" for d, kv, px in verdicts)
    if slower:
        return BackendChoice("posix", f"measured into GPU memory, posix is as fast or faster ({figures})")
    return BackendChoice("kvikio", f"measured into GPU memory, KvikIO is faster ({figures})")


def get_backend(name: str = "auto", **options: Any) -> ReadBackend:
    """The backend called ``name``; ``auto`` here is ``posix`` (use :func:`choose_backend` to measure).

    ``options`` go to the backend's constructor (e.g. ``queue_depth``,
    ``processes``, ``direct`` for ``posix``; ``device``, ``threads`` for
    ``kvikio``). Raises :class:`StoreError` for an unknown name or a backend
    this machine cannot run.
    """
    if name not in BACKENDS:
        raise StoreError(f"unknown read backend {name!r}: choose one of {', '.join(BACKENDS)}")
    if name == "kvikio":
        from iostack.backends.kvikio_backend import KvikioBackend

        return KvikioBackend(**options)
    from iostack.backends.posix import PosixBackend

    options = {k: v for k, v in options.items() if k != "device"}  # a posix read goes to host memory
    return PosixBackend(**options)


__all__ = ["BACKENDS", "TOOL_KVIKIO_TO_GPU", "TOOL_POSIX_TO_GPU", "BackendChoice", "BinHandle", "ReadBackend",
           "choose_backend", "get_backend"]
