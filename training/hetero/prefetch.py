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
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def worker() -> ThreadPoolExecutor:
    """The one background thread :func:`ahead` makes batches on; shut it down when the run ends.

    One for the whole run rather than one an epoch: a thread that ends while torch's OpenMP threads
    wait makes libgomp spin at full length on the rest of the epoch (docs/design-notes.md, the
    prefetch tail), and evaluation follows each epoch.
    """
    return ThreadPoolExecutor(1, thread_name_prefix="moment-hetero-prefetch")


def ahead(make: Callable[[int], T], count: int, depth: int, pool: Executor | None = None) -> Iterator[T]:
    """``make(i)`` for ``i`` in ``range(count)``, in order, each made up to ``depth`` batches ahead on ``pool``.

    ``pool``: one thread (:func:`worker`); ``None``: a thread for this loop alone. Leaving the loop
    early waits for the batch in the making and drops the rest.
    """
    if depth <= 0:
        for i in range(count):
            yield make(i)
        return
    own = pool is None
    pool = pool if pool is not None else worker()
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
        for f in pending:  # one may have started: it must not run on into the next loop's batches
            if not f.cancelled():
                f.exception()
        if own:
            pool.shutdown()


__all__ = ["ahead", "worker"]
