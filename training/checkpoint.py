"""Checkpoints of a run: model, optimizer, position, the epoch's sums and every rank's random streams.

Written by rank 0 to a temporary file, fsynced and renamed
(:func:`save_checkpoint`); the model's own ``state_dict`` (never DDP's
``module.`` prefixed one), so a checkpoint resumes with or without DDP and on
any number of ranks. :func:`resume` checks that a checkpoint belongs to this
run's settings and loads it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from training.errors import TrainError

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from training.distributed import World

CHECKPOINT_NAME = "checkpoint.pt"

#: config fields a resumed run must share with the checkpoint (the rest may change, e.g. epochs)
IDENTITY = ("model", "fanouts", "batch_size", "seed", "hidden", "heads", "out_heads", "gcn_norm",
            "normalize_features")




# Any: a checkpoint's torch.save record (states of torch, numpy, random)
def rng_state(device: torch.device) -> dict[str, Any]:
    """This process's random streams (dropout draws from torch's; CUDA's on a GPU)."""
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


# Any: a checkpoint's torch.save record (states of torch, numpy, random)
def _set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    cuda = state.get("cuda")
    if device.type == "cuda" and isinstance(cuda, torch.Tensor):
        torch.cuda.set_rng_state(cuda, device)


# Any: the RNG states of torch, numpy and random, as their own get_state functions return them
def restore_rng(saved: list[dict[str, Any]] | dict[str, Any], world: World) -> str:
    """Each rank's own streams from a checkpoint's ``rng`` (a list, one per rank; older ones hold rank 0's).

    Returns how: ``per-rank``, or why not (another world size restarts every rank from rank 0's).
    """
    if isinstance(saved, list):
        if len(saved) == world.size:
            _set_rng_state(saved[world.rank], world.device)
            return "per-rank"
        _set_rng_state(saved[0], world.device)
        return f"the checkpoint has {len(saved)} rank(s), this run {world.size}: every rank took rank 0's streams"
    _set_rng_state(saved, world.device)
    return "per-rank" if world.size == 1 else "an older checkpoint with rank 0's streams only"


# Any: a checkpoint's torch.save record (states of torch, numpy, random)
def save_checkpoint(path: Path, state: dict[str, Any], whole: Callable[[], bool] | None = None) -> None:
    """``torch.save`` to a temporary sibling, fsync, rename: a crash never leaves half a checkpoint.

    ``whole``: asked right before the rename; when it answers False (the job lost its launcher
    meanwhile) the temporary file is removed and nothing replaces the previous checkpoint.

    Raises
    ------
    TrainError
        When the file cannot be written (full disk, read-only directory); the temporary file is
        removed and the previous checkpoint, if any, is kept.
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        if whole is not None and not whole():
            tmp.unlink()
            raise TrainError(f"checkpoint {path}: not written, the job is no longer whole (its launcher is gone)")
        os.replace(tmp, path)
    except (OSError, RuntimeError) as exc:  # torch.save reports a failed write as a RuntimeError
        with contextlib.suppress(OSError):
            tmp.unlink()
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0]
        kept = "the previous checkpoint is kept" if path.exists() else "no checkpoint was written"
        raise TrainError(f"checkpoint {path}: cannot write it ({why}); {kept}; free space or choose another "
                         "`checkpoint_dir`") from None


# Any: a checkpoint's torch.save record (states of torch, numpy, random)
def load_checkpoint(path: Path) -> dict[str, Any]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    # Exception: a damaged file makes torch's zip reader and unpickler raise assorted errors
    # (UnpicklingError, KeyError, AttributeError, struct.error, ...; tests/test_fuzz_files.py)
    except Exception as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TrainError(f"{path}: not a readable checkpoint ({why}); delete it to start over") from None
    if not isinstance(state, dict):
        raise TrainError(f"{path}: not a checkpoint (it holds a {type(state).__name__}, not a dict); "
                         "delete it to start over")
    return state


@contextlib.contextmanager
def checkpoint_lock(checkpoint_dir: str | None, rank: int) -> Iterator[None]:
    """Rank 0 holds the writer's lock on ``checkpoint_dir`` for the whole run (the other ranks write none).

    Two runs writing checkpoints into one directory used to both exit 0, each replacing the other's
    checkpoint: a resume then mixed two runs. The second now fails at its start naming the first
    (:func:`training.writer.output_lock`: ``flock``, dropped by the kernel when its process dies).

    Raises
    ------
    TrainError
        The directory's parent cannot be made.
    DatasetError
        Another run holds the lock (naming its process and start time).
    """
    if checkpoint_dir is None or rank != 0:
        yield
        return
    from training.writer import output_lock

    d = Path(checkpoint_dir)
    try:
        d.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TrainError(f"checkpoint directory {d}: cannot create it ({exc.strerror or exc}); choose another "
                         "`checkpoint_dir`") from None
    with output_lock(d):
        yield


def checkpoint_path(checkpoint_dir: str | None, resume: bool, need_bytes: int = 0) -> Path | None:
    """``checkpoint_dir/checkpoint.pt`` (None without a directory), the directory made now.

    A directory that cannot be made, or whose disk has less than ``need_bytes`` free (about
    a checkpoint's size), fails here, not after the first epoch.
    """
    if checkpoint_dir is None:
        if resume:
            raise TrainError("`resume` needs a checkpoint directory (`checkpoint_dir`)")
        return None
    path = Path(checkpoint_dir) / CHECKPOINT_NAME
    where = path.parent.absolute()
    while not where.exists() and where != where.parent:  # the room is checked before making anything
        where = where.parent
    st = os.statvfs(where)
    free = st.f_bavail * st.f_frsize  # the old checkpoint stays until the new one is whole: no credit for it
    if free < need_bytes:
        from momentbase.units import format_size

        raise TrainError(f"checkpoint directory {path.parent}: {format_size(free)} free, a checkpoint needs about "
                         f"{format_size(need_bytes)}; free space or choose another `checkpoint_dir`")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TrainError(f"checkpoint directory {path.parent}: cannot create it "
                         f"({exc.strerror or exc}); choose another `checkpoint_dir`") from None
    from training.writer import sweep_leftovers

    for left in sweep_leftovers(path):  # a killed run's half-written checkpoint (.checkpoint.pt.tmp-PID)
        log.warning("removed %s, the leftover of a run that was killed while writing its checkpoint", left)
    return path


def checkpoint_bytes(params: Iterable[torch.Tensor]) -> int:
    """About the size of a checkpoint of a model with ``params`` under Adam: the parameters and the
    optimizer's two moments (the positions, sums and RNG states are small beside them), plus 1 MiB."""
    return 3 * sum(p.numel() * p.element_size() for p in params) + (1 << 20)


@dataclass(frozen=True)
class Resumed:
    """Where a resumed run starts: ``(epoch, step)``, the epoch's saved sums, how the RNG streams came back."""

    epoch: int
    step: int
    sums: dict | None
    rng_note: str


# Any: a checkpoint's torch.save record (states of torch, numpy, random)
def resume(path: Path, config: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer,
           world: World) -> Resumed:
    """Load the checkpoint at ``path`` into ``model`` and ``optimizer``; refuse one of other settings.

    ``config``: this run's :meth:`~training.specs.TrainSpec.to_dict` (the flat record); the
    fields of :data:`IDENTITY` must match the checkpoint's. The learning rate
    and weight decay are this run's.
    """
    ck = load_checkpoint(path)
    if not isinstance(ck, dict) or not {"config", "model", "optimizer", "epoch", "step", "rng"} <= set(ck):
        raise TrainError(f"{path}: not a Moment training checkpoint; delete it or choose another "
                         "`checkpoint_dir`")
    for key in IDENTITY:
        was, now = ck["config"].get(key), config[key]
        if was != now:
            raise TrainError(f"{path}: written by a run with {key}={was!r}, this run has {now!r}; "
                             "use the same settings or another checkpoint directory")
    try:
        model.load_state_dict(ck["model"])
        optimizer.load_state_dict(ck["optimizer"])
    except (RuntimeError, ValueError, KeyError) as exc:
        why = next((ln.strip() for ln in str(exc).splitlines() if "mismatch" in ln or "Missing" in ln),
                   str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        raise TrainError(f"{path}: does not fit this model and dataset ({why[:160]}); "
                         "it was written for another dataset? use another `checkpoint_dir`") from None
    for group in optimizer.param_groups:  # what this run asks for, not what the checkpoint had
        group["lr"], group["weight_decay"] = config["lr"], config["weight_decay"]
    return Resumed(ck["epoch"], ck["step"], ck.get("sums"), restore_rng(ck["rng"], world))


__all__ = ["CHECKPOINT_NAME", "IDENTITY", "Resumed", "checkpoint_path", "load_checkpoint", "restore_rng", "resume",
           "rng_state", "save_checkpoint"]
