"""Batches made ahead on one background thread, in order, while the model trains on the current one.

:func:`ahead` runs ``make(0)``, ``make(1)``, ... on a single worker thread (so a stateful sampler
draws them in the order, and from the stream, an inline loop would: the batches are the same),
keeping at most ``depth`` of them made or in the making beyond the one being used. What runs
on the thread (the typed sampler's numba kernels, the feature gathers' reads and copies) releases
the GIL for much of its time, so the model's step runs meanwhile. ``depth`` 0 makes each batch
inline, when asked. An error raised while making a batch is raised where that batch is taken.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def ahead(make: Callable[[int], T], count: int, depth: int) -> Iterator[T]:
    """``make(i)`` for ``i`` in ``range(count)``, in order, each made up to ``depth`` batches ahead.

    Leaving the loop early waits for the batches in the making and drops them.
    """
    if depth <= 0:
        for i in range(count):
            yield make(i)
        return
    with ThreadPoolExecutor(1, thread_name_prefix="moment-hetero-prefetch") as pool:
        pending: deque[Future[T]] = deque()
        nxt = 0
        try:
            for _ in range(count):
                while nxt < count and len(pending) <= depth:  # the one to use now, and depth more
                    pending.append(pool.submit(make, nxt))
                    nxt += 1
                yield pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()


__all__ = ["ahead"]
