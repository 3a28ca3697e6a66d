"""The server's hand on torch's dynamic rpc group: removing a member, releasing a wedged join token.

Measured on torch 2.13: a trainer that leaves through ``rpc.shutdown()`` is handled, but
a SIGKILLed one stays in the group — in the server agent's worker list and in the
store's worker list — and the next trainer to join fails (``ECONNREFUSED`` from the dead
peer during the join handshake), then wedges the group's join/leave token in the store,
so every later join hangs. The server therefore owns membership: a member that fails a
ping, or a trainer that unregisters, is removed from the store's list and from the
server agent under the group token (torch's own leave protocol, run by the server on
the member's behalf); a token held by a join for longer than ``2 * trainer_timeout_s``
is released. Trainers never run torch's graceful leave (it would contact every other
trainer, dead ones included). Membership is edited through a store connection of its
own: a TCPStore client holds its lock through a blocking ``wait``, so waiting for the
token on the agent's store stalled a concurrent join until the timeout. A process keeps
its first worker id for life (torch's distributed-autograd container refuses another),
so the server frees an id when it drops the member and a process can join again.

All this leans on torch internals (the dynamic group's store keys
``rpc_prefix_0/names/...`` and ``RpcGroupManagementToken``), pinned by ``tests/test_serve.py``.
"""

from __future__ import annotations

import threading
import time

from training.serve.protocol import first_line

#: torch's dynamic rpc group, as laid out by tensorpipe_agent.cpp / rpc/_utils.py (torch 2.x)
RPC_PREFIX = "rpc_prefix_0"
_TOKEN_KEY = "RpcGroupManagementToken"
_NAMES_PREFIX = "names"
_ALL_WORKERS_KEY = "_ALL_WORKER_INFOS"  # "name-id,name-id,"


def _names_store(store):
    import torch.distributed as dist

    return dist.PrefixStore(_NAMES_PREFIX, store)


def drop_worker_entry(store, name: str, worker_id: int) -> None:
    """Remove ``name-id,`` from the dynamic group's worker list (what a graceful leave does)."""
    names = _names_store(store)
    if not names.check([_ALL_WORKERS_KEY]):
        return
    listed = names.get(_ALL_WORKERS_KEY).decode()
    entry = f"{name}-{worker_id},"
    if entry in listed:
        names.set(_ALL_WORKERS_KEY, listed.replace(entry, "", 1))
    # free the id too (a graceful leave does not): a process can join only ever with one id,
    # because torch's distributed-autograd container keeps the first one for its lifetime
    names.delete_key(str(worker_id))


class GroupMembership:
    """Edits of the rpc group, one at a time, through ``store`` (a PrefixStore of :data:`RPC_PREFIX`)."""

    def __init__(self, store, trainer_timeout_s: float) -> None:
        self.store, self.trainer_timeout_s = store, float(trainer_timeout_s)
        self.lock = threading.Lock()
        self._token_seen: tuple[str, float] = ("", 0.0)

    def remove(self, name: str) -> str | None:
        """Drop member ``name`` from the store's list and the server agent; None, or why it was deferred."""
        from torch.distributed import rpc
        from torch.distributed.rpc._utils import _group_membership_management

        agent = rpc.api._get_current_rpc_agent()
        try:
            worker = agent.get_worker_info(name)
        except Exception:
            return None  # not (or no longer) a member
        try:
            # one membership change at a time: a second one would block the shared store
            # connection waiting for the token the first must release through it
            with self.lock, _group_membership_management(self.store, f"{name}@server", False):
                drop_worker_entry(self.store, name, worker.id)
                agent._update_group_membership(worker, [], {}, False)
        except Exception as exc:  # the token timed out: leave it for the next round
            return f"membership cleanup deferred ({first_line(exc)})"
        return None

    def release_wedged_token(self) -> str | None:
        """A join that failed half-way keeps the group token forever (torch 2.13): release it once it
        has been held past ``2 * trainer_timeout_s``; returns the joiner's name when it did."""
        with self.lock:
            store = self.store
            held = store.compare_set(_TOKEN_KEY, "\0never", "\0never").decode()  # read without blocking
            now = time.monotonic()
            if not held or not held.endswith("_join"):
                self._token_seen = ("", now)
                return None
            if held != self._token_seen[0]:
                self._token_seen = (held, now)
                return None
            if now - self._token_seen[1] < 2 * self.trainer_timeout_s:
                return None
            name = held[len("Token_for_"):-len("_join")]
            names = _names_store(store)
            listed = names.get(_ALL_WORKERS_KEY).decode() if names.check([_ALL_WORKERS_KEY]) else ""
            for entry in filter(None, listed.split(",")):
                if entry.rpartition("-")[0] == name:
                    drop_worker_entry(store, name, int(entry.rpartition("-")[2]))
            store.set(_TOKEN_KEY, "")
            store.set(held, "Done")
            self._token_seen = ("", now)
            return name
