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

Each backend is a :class:`ReadBackend` subclass named in :data:`READ_BACKENDS`; what a
caller may rely on is said by flags on the class (``device_reads``, ``needs_cuda``,
``direct``), never by its name.

>>> get_backend("posix", processes=0).name
'posix'
>>> choose_backend("auto", cuda=False).name
'posix'
>>> backend_choices()
('auto', 'posix', 'kvikio')
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from iostack.errors import StoreError
from momentbase.registry import Registry

if TYPE_CHECKING:
    from iostack.backends.base import BinHandle, ReadBackend
    from planner.capacities import Capacities, ReadMeasurement

#: the read backends by name: each a :class:`ReadBackend` subclass, imported when first built
#: (listing the names, as ``--backend``'s choices do, imports neither torch nor KvikIO)
READ_BACKENDS: Registry[type[ReadBackend]] = Registry("read backend", StoreError)
READ_BACKENDS.register("posix", "iostack.backends.posix:PosixBackend")
READ_BACKENDS.register("kvikio", "iostack.backends.kvikio_backend:KvikioBackend")

#: ``auto``: not a backend but the choice :func:`choose_backend` makes among them
AUTO = "auto"


def backend_choices() -> tuple[str, ...]:
    """What a ``backend`` option accepts: ``auto`` and every registered backend."""
    return (AUTO, *READ_BACKENDS.names())


def tool_to_gpu(name: str) -> str:
    """The capacities-file tool of backend ``name``'s measured random reads into GPU memory."""
    return f"moment-{name}-to-gpu"


#: tools of the capacities-file measurements ``auto`` compares: random rows into GPU memory
TOOL_POSIX_TO_GPU = tool_to_gpu("posix")
TOOL_KVIKIO_TO_GPU = tool_to_gpu("kvikio")

# the base classes load on first use (PEP 562): they import torch
_LAZY = {"BinHandle": "iostack.backends.base", "ReadBackend": "iostack.backends.base"}


def __getattr__(name: str) -> Any:  # Any: lazily imported names and each backend's own options
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _check_name(name: str) -> str:
    if name != AUTO and name not in READ_BACKENDS:
        raise StoreError(f"unknown read backend {name!r} (known: {', '.join(backend_choices())})")
    return name


@dataclass(frozen=True)
class BackendChoice:
    """The backend to use and why (said in the trainer's start record)."""

    name: str
    reason: str


def _best(measurements: Iterable[ReadMeasurement], tool: str) -> float | None:
    """The best figure of ``tool`` taken with a cold page cache (a warm one times a buffered reader on memory)."""
    rates = [m.read_bytes_per_s for m in measurements if m.tool == tool and m.page_cache == "cold"]
    return max(rates) if rates else None


def _host_default() -> str:
    """The backend ``auto`` falls back on: the first registered (``posix``), whose reads run anywhere."""
    return READ_BACKENDS.names()[0]


def _device_candidates() -> list[str]:
    """The registered backends ``auto`` may prefer on a CUDA machine: those whose reads land on the device."""
    return [n for n in READ_BACKENDS.names()[1:] if READ_BACKENDS.get(n).device_reads]


def choose_backend(name: str = "auto", *, cuda: bool, capacities: Capacities | None = None,
                   paths: Iterable[str] = (), sys_root: str = "/sys") -> BackendChoice:
    """The read backend for bins at ``paths``: ``name`` itself unless it is ``auto``.

    ``auto``: the host default (``posix``) without CUDA (reads go to host
    memory anyway), else a backend with ``device_reads`` (``kvikio``) only if
    ``capacities`` (a :class:`planner.capacities.Capacities`) holds its and the
    default's into-GPU measurements (:func:`tool_to_gpu`), taken with a cold
    page cache (``page_cache: cold``; KvikIO's compatibility mode reads
    buffered, so a warm figure times memory against posix's O_DIRECT), for the SSD of every
    path and it is the faster on each (of several such, the one ahead by the
    largest least margin); otherwise the default, saying why.
    """
    if _check_name(name) != AUTO:
        return BackendChoice(name, "asked for")
    default = _host_default()
    if not cuda:
        return BackendChoice(default, "no CUDA device: rows are read into host memory")
    hint = "run `moment profile --ssd DIR --out caps.yaml` on this machine and pass --capacities caps.yaml"
    candidates = _device_candidates()
    if capacities is None or not candidates:
        return BackendChoice(default, f"no measurement says {' or '.join(candidates) or 'another backend'} is "
                                      f"faster here ({hint})")
    from planner.hostinfo import block_device_of

    verdicts = []  # (disk, {backend: bytes/s}) per path
    for path in paths:
        disk = block_device_of(path, sys_root).name
        dev = next((d for d in capacities.devices if disk and d.block_device == disk), None)
        if dev is None:
            return BackendChoice(default, f"{path}: the capacities have no figures for its disk {disk or '?'} ({hint})")
        rates = {n: _best(dev.measurements(), tool_to_gpu(n)) for n in (*candidates, default)}
        if rates[default] is None or all(rates[c] is None for c in candidates):
            return BackendChoice(default, f"{disk}: reads into GPU memory were not measured for both "
                                          f"{' or '.join(candidates)} and {default} with a cold page cache ({hint})")
        verdicts.append((disk, rates))
    if not verdicts:
        return BackendChoice(default, "no SSD bins")
    figures = "cold page cache; " + "; ".join(
        f"{d}: " + ", ".join(f"{n} {r / 1e9:.2f} GB/s" for n, r in rates.items() if r is not None)
        for d, rates in verdicts)
    # r[default] is measured in every verdict (checked above); `or 0.0` only tells mypy so
    margins = {c: min((r[c] or 0.0) / max(r[default] or 0.0, 1e-9) for _, r in verdicts) for c in candidates}
    best = max(candidates, key=lambda c: margins[c])
    if margins[best] <= 1.0:
        return BackendChoice(default, f"measured into GPU memory, {default} is as fast or faster ({figures})")
    return BackendChoice(best, f"measured into GPU memory, {best} is faster ({figures})")


# Any: lazily imported names and each backend's own options
def get_backend(name: str = "auto", **options: Any) -> ReadBackend:
    """The backend called ``name``; ``auto`` here is ``posix`` (use :func:`choose_backend` to measure).

    ``options`` go to the backend's constructor (e.g. ``queue_depth``,
    ``processes``, ``direct`` for ``posix``; ``device``, ``threads`` for
    ``kvikio``); ``device`` only to a backend with ``device_reads`` (the others
    read into host memory). Raises :class:`StoreError` for an unknown name or a
    backend this machine cannot run.
    """
    cls = READ_BACKENDS.get(_host_default() if _check_name(name) == AUTO else name)
    if not cls.device_reads:
        options = {k: v for k, v in options.items() if k != "device"}
    return cls(**options)


__all__ = ["AUTO", "READ_BACKENDS", "TOOL_KVIKIO_TO_GPU", "TOOL_POSIX_TO_GPU", "BackendChoice", "BinHandle",
           "ReadBackend", "backend_choices", "choose_backend", "get_backend", "tool_to_gpu"]
