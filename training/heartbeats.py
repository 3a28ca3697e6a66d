"""Every rank's heartbeat in the job's key-value store: what names the rank that died when a collective fails.

Gloo's error for a lost peer names a socket (``Connection closed by peer [127.0.0.1]:6560``), NCCL's a
timeout; neither says which rank is gone. Each rank of a multi-rank job beats into the store its
process group was made from (:meth:`Heartbeats.for_job`, started by :func:`training.distributed.open_world`
for every job of more than one rank: plain DDP, sharded feature stores, partitioned graphs alike), and
after a failure the survivors read who stopped beating: every
:class:`~training.sharded.exchange.PeerLostError` of the job then names the dead rank in its one line,
whichever collective met the death first (the gradient all-reduce, the feature exchange, the sampler's).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from training.sharded.exchange import name_lost_peers_with

__all__ = ["Heartbeats", "job_heartbeats"]

#: the job's heartbeats while :meth:`Heartbeats.for_job` runs them (one per process)
_JOB: list[Heartbeats] = []


def job_heartbeats() -> Heartbeats | None:
    """The heartbeats :meth:`Heartbeats.for_job` started in this process and not yet closed, else None."""
    return _JOB[0] if _JOB else None


class Heartbeats:
    """Every rank's beat in a key-value store, to name the ranks that died when a collective fails.

    A daemon thread sets ``moment/beat/<rank>`` to a counter every ``every_s`` seconds; after a
    failure, :meth:`stopped` reads every peer's counter twice, ``3 × every_s`` apart: a rank whose
    counter did not move is gone (or frozen). ``store``: a ``torch.distributed.Store`` (the
    group's: torchrun's agent store or the ``init_method``'s).
    """

    def __init__(self, store: Any, rank: int, size: int, every_s: float = 0.5) -> None:  # Any: a c10d Store
        self.store, self.rank, self.size, self.every_s = store, rank, size, float(every_s)
        self._stop = threading.Event()
        self._names_job = False
        self._beat()
        self._thread = threading.Thread(target=self._run, name="moment-beat", daemon=True)
        self._thread.start()

    @classmethod
    def for_job(cls, every_s: float = 0.5) -> Heartbeats:
        """Beats in the job's store (torchrun's agent store, or the ``init_method``'s) for this rank.

        The store is torch's private ``_get_default_store()``: torch exposes no public handle to the
        store the default group was made from.
        """
        import torch.distributed as dist

        prev = job_heartbeats()
        if prev is not None:  # one job, one beat: the newer replaces it
            prev.close()
        beats = cls(dist.distributed_c10d._get_default_store(), dist.get_rank(), dist.get_world_size(), every_s)
        name_lost_peers_with(beats.stopped)  # every lost-peer error of the job names the dead, not just ours
        beats._names_job = True
        _JOB[:] = [beats]
        return beats

    def _key(self, rank: int) -> str:
        return f"moment/beat/{rank}"

    def _beat(self) -> None:
        self.store.add(self._key(self.rank), 1)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self._beat()
            except RuntimeError:  # the store's host is gone: nothing left to tell
                return

    def _read(self) -> list[int | None]:
        out: list[int | None] = []
        for r in range(self.size):
            try:
                out.append(self.store.add(self._key(r), 0))  # add 0: a read that never blocks on a missing key
            except RuntimeError:
                out.append(None)
        return out

    def stopped(self) -> list[int]:
        """The ranks (other than this one) whose beat stopped, waiting ``3 × every_s`` to tell."""
        before = self._read()
        if all(b is None for b in before):
            return []  # the store itself is unreachable: no one to name
        time.sleep(3 * self.every_s)
        after = self._read()
        return [r for r in range(self.size) if r != self.rank and (after[r] is None or after[r] == before[r])]

    def close(self) -> None:
        """Stop beating (and, for the job's, stop naming the dead: the group is going)."""
        self._stop.set()
        if self._names_job:
            self._names_job = False
            name_lost_peers_with(None)
            if _JOB and _JOB[0] is self:
                _JOB.clear()
