"""Host allocator settings for the training loop: freed batch tensors stay mapped for the next batch.

Every step allocates and frees the same large host tensors (a GraphSAGE batch of
1024 seeds, fan-outs 25,10: hidden activations, their gradients and dropout masks
of ~17 MB each). glibc's ``malloc`` serves such sizes with ``mmap`` or returns
them to the kernel when they are freed at the top of a heap (``M_TRIM_THRESHOLD``,
128 KiB by default, raised only by glibc's own dynamic rule), so the next step
touches fresh pages: each first touch is a page fault that zeroes a page. Profiled
(``tools/bench_train_dgl.py``'s model step, 1 thread, on this machine): 1,000 to
17,000 minor faults and 4-32 ms of kernel time per step; with the settings below,
0-400 faults and 1-5 ms. PyTorch's CPU performance guide gives the same advice
(tcmalloc or jemalloc, or these glibc settings); here it is set in the process,
so ``moment train`` needs no preloaded library or environment.

The cost is resident memory: up to ``trim_bytes`` of freed memory per malloc
arena stays mapped (memory the loop held a moment earlier and will hold again).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

__all__ = ["MMAP_THRESHOLD_BYTES", "TRIM_BYTES", "keep_freed_host_memory"]

#: glibc's ``mallopt`` parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3

#: freed memory an arena keeps before returning its top to the kernel (1 GiB measured like 256 MiB,
#: 64 MiB still faulted thousands of pages per step)
TRIM_BYTES = 256 << 20

#: allocations served from the heap, not by their own mmap: glibc's upper limit on 64-bit (32 MiB)
MMAP_THRESHOLD_BYTES = 32 << 20


def keep_freed_host_memory(trim_bytes: int = TRIM_BYTES, mmap_threshold_bytes: int = MMAP_THRESHOLD_BYTES
                           ) -> str | None:
    """Set glibc's trim and mmap thresholds for this process; what was set, or ``None`` (not glibc).

    Safe to call more than once. Other C libraries (musl, macOS) are left alone.

    >>> keep_freed_host_memory() in (None, "glibc malloc: trim threshold 256 MiB, mmap threshold 32 MiB")
    True
    """
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success, 0 when glibc refuses the value (it caps the mmap threshold)
    if not (mallopt(_M_TRIM_THRESHOLD, int(trim_bytes)) and mallopt(_M_MMAP_THRESHOLD, int(mmap_threshold_bytes))):
        return None
    return f"glibc malloc: trim threshold {trim_bytes >> 20} MiB, mmap threshold {mmap_threshold_bytes >> 20} MiB"
