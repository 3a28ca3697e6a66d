"""Read backends behind one interface: :class:`ReadBackend`, picked by :func:`get_backend`.

* ``posix``: ``os.preadv`` from worker processes, O_DIRECT where allowed; runs anywhere.
* ``kvikio``: KvikIO ``CuFile.pread`` into GPU buffers (GPUDirect Storage when the
  driver has it); needs CUDA, imported only on a CUDA machine.

>>> get_backend("posix", processes=0).name
'posix'
"""

from __future__ import annotations

from typing import Any

from iostack.backends.base import BinHandle, ReadBackend
from iostack.errors import StoreError

BACKENDS = ("auto", "posix", "kvikio")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return bool(torch.cuda.is_available())


def get_backend(name: str = "auto", **options: Any) -> ReadBackend:
    """The backend called ``name``; ``auto`` takes ``kvikio`` on a CUDA machine with KvikIO, else ``posix``.

    ``options`` go to the backend's constructor (e.g. ``queue_depth``,
    ``processes``, ``direct`` for ``posix``). Raises :class:`StoreError` for an
    unknown name or a backend this machine cannot run.
    """
    if name not in BACKENDS:
        raise StoreError(f"unknown read backend {name!r}: choose one of {', '.join(BACKENDS)}")
    if name == "auto":
        if _cuda_available():
            try:
                import kvikio  # noqa: F401
            except ImportError:
                pass
            else:
                name = "kvikio"
        if name == "auto":
            name = "posix"
    if name == "kvikio":
        from iostack.backends.kvikio_backend import KvikioBackend

        return KvikioBackend(**options)
    from iostack.backends.posix import PosixBackend

    return PosixBackend(**options)


__all__ = ["BACKENDS", "BinHandle", "ReadBackend", "get_backend"]
