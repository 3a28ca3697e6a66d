"""The distributed world of a run: ranks, devices, process groups, timeouts, DistributedDataParallel.

:func:`open_world` joins the ``torchrun`` group (``gloo`` on CPU, ``nccl`` on
CUDA) with a second group of short timeout for the per-step collectives, so
that a dead or hung peer stops a step with one clear error
(:class:`~training.sharded.exchange.PeerLostError`) instead of torch's 30-minute wait;
:func:`data_parallel` wraps the model in
:class:`~torch.nn.parallel.DistributedDataParallel` on that group.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from iostack.transfer import DeviceMemory
from momentbase.errors import MomentError
from training.devices import bus_address_in, partition_of_rank, rank_devices
from training.launcher import Launcher, bind_to_launcher

if TYPE_CHECKING:
    from training.heartbeats import Heartbeats


@dataclass(frozen=True)
class World:
    """This process in the run: its rank of ``size``, its device, its place on the node, its groups."""

    rank: int
    size: int
    device: torch.device
    owns_group: bool
    local_rank: int = 0
    local_size: int = 1
    #: the placement's GPU bins this rank holds on its device (None: all of them)
    gpu_bins: tuple[int, ...] | None = None
    #: the group of the per-step collectives (short timeout); None: the default group
    group: Any = None
    #: the process that launched the ranks, which they do not outlive (None: one process, or not bound)
    launcher: Launcher | None = None
    #: this rank's heartbeat in the job's store (:class:`training.heartbeats.Heartbeats`): a lost-peer error
    #: names the dead rank (None: one process)
    beats: Heartbeats | None = None

    def end(self) -> None:
        """Stop the heartbeat, and destroy the default group when :func:`open_world` started it."""
        if self.beats is not None:
            self.beats.close()
        if self.owns_group:
            import torch.distributed as dist

            with contextlib.suppress(RuntimeError, ValueError):  # a broken group (a dead peer) goes anyway
                dist.destroy_process_group()

    def whole(self) -> bool:
        """Whether the job is still whole: its launcher lives (a killed launcher's ranks are orphans)."""
        return self.launcher is None or self.launcher.alive()

    def all_reduce(self, t: Tensor, op: str = "sum", during: str = "an all-reduce") -> Tensor:
        if self.size > 1:
            import torch.distributed as dist

            with peer_errors(during):
                dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
                                       "min": dist.ReduceOp.MIN}[op], group=self.group)
        return t

    def barrier(self) -> None:
        """Every rank here (the default group: its long timeout covers slow start-ups)."""
        if self.size > 1:
            import torch.distributed as dist

            with peer_errors("waiting for the other ranks"):
                dist.barrier()

    def gather_objects(self, obj: Any, during: str = "gathering from every rank") -> list[Any]:
        """``obj`` of every rank, in rank order (every rank calls it)."""
        if self.size <= 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.size
        with peer_errors(during):
            dist.all_gather_object(out, obj)
        return out


@contextlib.contextmanager
def peer_errors(during: str) -> Iterator[None]:
    """A collective that fails (a peer died, or hung past the timeout) as one clear error."""
    try:
        yield
    except RuntimeError as exc:
        from training.sharded.exchange import PeerLostError

        raise PeerLostError.of(exc, during) from None


def data_parallel(model: torch.nn.Module, world: World) -> torch.nn.Module:
    """``model`` under :class:`~torch.nn.parallel.DistributedDataParallel` on several ranks, else itself.

    On the world's step group (its short timeout: a dead peer fails a step,
    not torch's 30 minutes). DDP broadcasts rank 0's parameters on
    construction (and would sync buffers before each forward, but the models
    hold none). Checkpoints keep saving ``model``'s own state
    (no ``module.`` prefix), so they resume with or without DDP.
    """
    if world.size <= 1:
        return model
    from torch.nn.parallel import DistributedDataParallel

    with peer_errors("setting up DistributedDataParallel"):
        return DistributedDataParallel(model, device_ids=[world.device] if world.device.type == "cuda" else None,
                                       process_group=world.group)


def _partitions(placement_dir: str | None, local_size: int
                ) -> list[tuple[tuple[int, ...] | None, str | None]]:
    """For each local rank: the GPU bins it holds and, for one partition of a partitioned cache, its planned
    GPU's bus address (every rank's, so that each rank can place the others too)."""
    if placement_dir is None:
        return [(None, None)] * local_size
    from iostack.placement import load_placement

    try:
        bins = [b for b in load_placement(placement_dir).bins if b.kind == "gpu"]
    except (OSError, MomentError):
        return [(None, None)] * local_size  # open_features reports what is wrong with the placement
    try:  # the plan's GPU of each partition, from the report `moment place` wrote
        report = json.loads((Path(placement_dir) / "place.json").read_text())["bins"]
    except (OSError, ValueError, KeyError, TypeError):
        report = None
    out: list[tuple[tuple[int, ...] | None, str | None]] = []
    for rank in range(local_size):
        mine = partition_of_rank([b.device for b in bins], rank, local_size)
        bus = None
        if len(bins) >= 2 and len(mine) == 1 and report is not None:
            try:
                stores = report[bins[mine[0]].id].get("stores") or ()
                bus = next((a for a in map(bus_address_in, stores) if a), None)
            except (KeyError, IndexError, TypeError, AttributeError):
                bus = None
        out.append((tuple(bins[i].id for i in mine), bus))
    return out


def open_world(placement_dir: str | None = None, memory: DeviceMemory | None = None, timeout_s: float | None = None
               ) -> World:
    """This process's rank, its device (see :mod:`training.devices`) and its process groups.

    ``timeout_s``: the timeout of the per-step collectives' group (the
    default group keeps torch's, for start-up and checkpoints).
    """
    size = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", size))
    parts = _partitions(placement_dir, max(local_size, local + 1))
    gpu_bins = parts[local][0]
    cuda = memory is None and torch.cuda.is_available()
    if memory is not None:
        device = memory.device
    elif cuda:  # every local rank's GPU, decided alike in each: a plain rank never takes a planned one's GPU
        device = rank_devices([bus for _, bus in parts])[local]
        torch.cuda.set_device(device)  # before NCCL starts, and for every allocation that says just "cuda"
    else:
        device = torch.device("cpu")
    if size <= 1:
        return World(0, 1, device, False, 0, 1, None)
    import torch.distributed as dist

    launcher = bind_to_launcher()  # a kill -9 of torchrun must not leave the ranks running on as orphans
    owns = False
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
        owns = True
    if device.type == "cpu":  # ranks on one host share its cores; oversubscribed OpenMP pools crawl
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_size))
    group = None
    if timeout_s is not None:  # a dead or hung peer fails a step within the timeout, not torch's 30 minutes
        from datetime import timedelta

        group = dist.new_group(timeout=timedelta(seconds=float(timeout_s)))
    from training.heartbeats import Heartbeats

    # every multi-rank job beats, so that whichever collective meets a death names the rank (not only a
    # partitioned job's sampler): a thread adding to a store key twice a second
    beats = Heartbeats.for_job()
    return World(dist.get_rank(), dist.get_world_size(), device, owns, local, local_size, gpu_bins, group, launcher,
                 beats)


def param_spread(params: Sequence[Tensor], world: World, epoch: int = 0) -> float:
    """Largest difference between ranks of any parameter tensor's sum (0.0: the ranks agree)."""
    fp = torch.stack([p.detach().double().sum() for p in params])
    during = f"epoch {epoch}: comparing the ranks' parameters"
    hi, lo = world.all_reduce(fp.clone(), "max", during), world.all_reduce(fp.clone(), "min", during)
    return float((hi - lo).abs().max())


__all__ = ["World", "data_parallel", "open_world", "param_spread", "peer_errors"]
