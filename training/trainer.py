"""The data-parallel training loop: sampled batches, tiered features, pipelined, checkpointed.

:func:`train` runs :class:`TrainConfig` in this process. Under ``torchrun``
(``WORLD_SIZE > 1``) every process is one rank of a ``torch.distributed`` group
(``gloo`` on CPU, ``nccl`` on CUDA); without it a single process trains alone.

Semantics (see :mod:`training.batches`): at step ``s`` the world trains on the
global batch a single process would; rank ``r`` takes part ``r`` of it. Every rank
scales its summed loss by the *global* batch size and the gradients are
all-reduced by sum, by hand, in one flat buffer (a rank with an empty part still
joins with zeros), so ``N`` ranks train on exactly the seeds one process would.
With full neighbourhoods (fan-outs ``-1``) they reproduce one process up to float
rounding; with sampled fan-outs each rank draws its own neighbour samples (its
sampler stream is seeded per rank), so runs agree in distribution, not bit for bit.

Pipelining: a background thread samples the next batches and gathers their
feature rows (from a :class:`~iostack.store.FeatureStore` or an in-memory
tensor) into a bounded queue of ``prefetch`` batches while the current batch
trains. Each step's time is split into sample, gather (rows and bytes per tier,
from the store's counter deltas), compute, all-reduce and I/O wait (the time the
trainer blocked on the queue).

Evaluation: validation and test vertices are sampled with ``eval_fanouts``
(default: the training fan-outs; ``-1`` = full neighbourhoods), split over the
ranks, counts all-reduced. Train accuracy is measured on the training steps'
own outputs (dropout on).

Records (dicts) go to ``progress`` on every rank and, from rank 0, as JSON lines
to ``metrics_path``: ``kind`` ``"start"``, ``"step"``, ``"epoch"``. Times are
seconds, sizes bytes.

Checkpoints (``checkpoint_dir/checkpoint.pt``, written by rank 0 to a temporary
file then renamed) hold the model, the optimizer, the position (epoch, step),
the epoch's running sums, the RNG states and the config; with ``resume`` a run
continues from there exactly: batches depend only on ``(seed, epoch, step)``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from planner.errors import PlannerError
from training.batches import BatchSource, LocalBatchSource, _mix, epoch_seeds
from training.data import Dataset, open_dataset
from training.models import build_model
from training.sampler import NeighborSampler, SampledBatch

__all__ = ["TrainConfig", "TrainError", "TrainResult", "train", "MemoryFeatures", "StoreFeatures",
           "Prefetcher", "CHECKPOINT_NAME"]

CHECKPOINT_NAME = "checkpoint.pt"

#: config fields a resumed run must share with the checkpoint (the rest may change, e.g. epochs)
_IDENTITY = ("model", "fanouts", "batch_size", "seed", "hidden", "heads", "out_heads", "gcn_norm",
             "normalize_features")

Progress = Callable[[dict], None]


class TrainError(PlannerError):
    """A training run that cannot start or continue: bad config, dataset, placement or checkpoint."""


@dataclass(frozen=True)
class TrainConfig:
    """What to train and how. Paths are strings; ``None`` means "not used".

    ``fanouts``: neighbours per hop, hop 1 first (``-1`` = all); one model layer per
    fan-out. ``hidden``/``heads``: ``None`` takes the model's default (SAGE/GCN 256,
    GAT 64 × 8). ``prefetch``: batches prepared ahead (0 = sample and gather inline).
    ``eval_every_epochs``: 0 = only after the last epoch. ``checkpoint_every_steps``:
    0 = only at epoch ends. ``backend``: the SSD read backend of the feature store.
    """

    dataset: str
    placement: str | None = None
    model: str = "sage"
    fanouts: tuple[int, ...] = (25, 10)
    eval_fanouts: tuple[int, ...] | None = None
    batch_size: int = 1024
    eval_batch_size: int = 4096
    epochs: int = 1
    lr: float = 0.003
    weight_decay: float = 0.0
    dropout: float = 0.5
    attn_dropout: float = 0.0
    hidden: int | None = None
    heads: int | None = None
    out_heads: int | None = None
    gcn_norm: str = "local"
    normalize_features: bool = False
    seed: int = 0
    prefetch: int = 2
    eval_every_epochs: int = 1
    metrics_path: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_every_steps: int = 0
    resume: bool = False
    server: str | None = None
    backend: str = "auto"
    server_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "fanouts", tuple(int(f) for f in self.fanouts))
        if self.eval_fanouts is not None:
            object.__setattr__(self, "eval_fanouts", tuple(int(f) for f in self.eval_fanouts))
        for fo, what in ((self.fanouts, "fanouts"), (self.eval_fanouts, "eval_fanouts")):
            if fo is not None and (not fo or any(f < -1 or f == 0 for f in fo)):
                raise TrainError(f"{what}: expected positive integers or -1 (all neighbours), got {list(fo)}")
        if self.eval_fanouts is not None and len(self.eval_fanouts) != len(self.fanouts):
            raise TrainError(f"eval_fanouts: need one per layer ({len(self.fanouts)}), got {list(self.eval_fanouts)}")
        for name in ("hidden", "heads", "out_heads"):
            if getattr(self, name) is not None and int(getattr(self, name)) < 1:
                raise TrainError(f"{name}: expected a positive integer, got {getattr(self, name)}")
        for name in ("batch_size", "eval_batch_size", "epochs"):
            if int(getattr(self, name)) < 1:
                raise TrainError(f"{name}: expected a positive integer, got {getattr(self, name)}")
        for name in ("prefetch", "eval_every_epochs", "checkpoint_every_steps"):
            if int(getattr(self, name)) < 0:
                raise TrainError(f"{name}: expected a non-negative integer, got {getattr(self, name)}")
        if not 0 < self.lr < math.inf or not 0 <= self.weight_decay < math.inf:  # nan fails too
            raise TrainError(f"lr must be > 0 and weight_decay >= 0, got {self.lr} and {self.weight_decay}")
        if self.gcn_norm not in ("local", "global"):
            raise TrainError(f"gcn_norm: expected 'local' or 'global', got {self.gcn_norm!r}")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["fanouts"] = list(self.fanouts)
        d["eval_fanouts"] = None if self.eval_fanouts is None else list(self.eval_fanouts)
        return d


@dataclass(frozen=True)
class TrainResult:
    """What a run did: the trained model, this run's epoch records, where it resumed from."""

    model: torch.nn.Module
    epochs: tuple[dict, ...]
    resumed_from: tuple[int, int] | None
    world_size: int
    rank: int

    @property
    def final(self) -> dict | None:
        """The last epoch record of this run (``None`` if it ran no epoch)."""
        return self.epochs[-1] if self.epochs else None


# ----------------------------------------------------------------------------------------------
# features


class FeatureSource(Protocol):
    """Rows of the feature matrix by vertex id, with cumulative per-tier counters."""

    dim: int

    def gather(self, ids: Tensor) -> Tensor:
        """``[len(ids), dim]`` rows of ``ids`` (int64), in order."""
        ...

    def totals(self) -> dict[str, tuple[int, int]]:
        """Rows and bytes served so far, per tier."""
        ...

    def close(self) -> None: ...


class MemoryFeatures:
    """The whole feature matrix in memory (tier ``"memory"``), indexed directly."""

    def __init__(self, features: np.ndarray) -> None:
        self._x = torch.from_numpy(np.array(features))  # a copy: the memmap's pages read once
        self.dim = int(self._x.shape[1])
        self._row_bytes = self.dim * self._x.element_size()
        self._rows = 0

    def gather(self, ids: Tensor) -> Tensor:
        self._rows += int(ids.numel())
        return self._x.index_select(0, ids)

    def totals(self) -> dict[str, tuple[int, int]]:
        return {"memory": (self._rows, self._rows * self._row_bytes)}

    def close(self) -> None:
        pass


class StoreFeatures:
    """Rows through an :class:`iostack.store.FeatureStore` (tiers ``gpu``, ``cpu``, ``ssd``)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.dim = int(store.dim)

    def gather(self, ids: Tensor) -> Tensor:
        return self.store.gather(ids)

    def totals(self) -> dict[str, tuple[int, int]]:
        return {k: (int(v["rows"]), int(v["bytes"])) for k, v in self.store.tier_stats().items()}

    def close(self) -> None:
        self.store.close()


def _check_placement_is_for(ds: Dataset, placement_dir: Path) -> None:
    """Refuse a placement that ``moment place`` made from another dataset (its ``place.json`` says)."""
    from training.data import fingerprint

    try:
        made_from = json.loads((placement_dir / "place.json").read_text()).get("dataset_fingerprint")
    except (OSError, ValueError, AttributeError):
        return  # a placement written by the library, without the report: nothing to compare
    if not made_from:
        return
    now = fingerprint(ds)
    diff = [k for k in made_from if now.get(k) != made_from[k]]
    if diff:
        raise TrainError(f"{placement_dir}: placed from another dataset than {ds.path} (they differ in "
                         f"{', '.join(diff)}); place this dataset with `moment place`")


def open_features(ds: Dataset, placement_dir: str | None, backend: str = "auto") -> FeatureSource:
    """The dataset's features: through the placement's store, else in memory."""
    if placement_dir is None:
        if ds.features is None:
            raise TrainError(f"{ds.path}: the dataset has no features.npy and no --placement was given; "
                             "import features or pass a placement with SSD bins")
        return MemoryFeatures(ds.features)
    from iostack.placement import load_placement
    from iostack.store import FeatureStore

    if not Path(placement_dir).is_dir():
        raise TrainError(f"{placement_dir}: no such placement directory (write one with `moment place`)")
    placement = load_placement(placement_dir)
    _check_placement_is_for(ds, Path(placement_dir))
    if placement.num_vertices != ds.num_nodes:
        raise TrainError(f"{placement_dir}: the placement holds {placement.num_vertices} vertices but the dataset "
                         f"{ds.path} has {ds.num_nodes}; place this dataset's features")
    store = FeatureStore(placement, placement_dir, features=ds.features, backend=backend)
    if ds.features is not None and store.dim != ds.feature_dim:
        store.close()
        raise TrainError(f"{placement_dir}: bins hold rows of dim {store.dim}, the dataset's features have "
                         f"{ds.feature_dim}; place this dataset's features")
    return StoreFeatures(store)


# ----------------------------------------------------------------------------------------------
# the pipeline


@dataclass
class Prepared:
    """A batch ready to train: sampled, features gathered (float32), labels and degrees looked up."""

    batch: SampledBatch
    x: Tensor
    y: Tensor
    deg: Tensor | None
    sample_s: float
    gather_s: float
    tiers: dict[str, tuple[int, int]]


class Prefetcher:
    """Samples and gathers the batches of ``batches`` ``depth`` ahead on a background thread.

    ``get()`` returns the next :class:`Prepared` (``None`` after the last) and how many
    seconds it blocked. ``depth == 0`` prepares inline in ``get()``. Errors in the
    thread are raised by ``get()``. Always ``close()`` (joins the thread).
    """

    _END = object()

    def __init__(self, batches: Iterator[SampledBatch], prepare: Callable[[SampledBatch, float], Prepared],
                 depth: int) -> None:
        self._it = batches
        self._prepare = prepare
        self._depth = depth
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if depth > 0:
            self._q: queue.Queue = queue.Queue(maxsize=depth)
            self._thread = threading.Thread(target=self._run, name="moment-prefetch", daemon=True)
            self._thread.start()

    def _next(self) -> Prepared | object:
        t0 = time.perf_counter()
        try:
            b = next(self._it)
        except StopIteration:
            return self._END
        return self._prepare(b, time.perf_counter() - t0)

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                item = self._next()
                if not self._put(item) or item is self._END:
                    return
        except BaseException as exc:  # handed to the trainer, which raises it
            self._put(exc)

    def get(self) -> tuple[Prepared | None, float]:
        t0 = time.perf_counter()
        if self._thread is None:
            item = self._next()
            return (None if item is self._END else item), 0.0
        item = self._q.get()
        waited = time.perf_counter() - t0
        if isinstance(item, BaseException):
            raise item
        return (None if item is self._END else item), waited

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        close = getattr(self._it, "close", None)
        if close is not None:
            close()


def _preparer(features: FeatureSource, labels: np.ndarray, indptr: np.ndarray | None,
              normalize: bool, device: torch.device) -> Callable[[SampledBatch, float], Prepared]:
    def prepare(b: SampledBatch, sample_s: float) -> Prepared:
        t0 = time.perf_counter()
        before = features.totals()
        ids = b.n_id.to("cpu", torch.int64)
        x = features.gather(ids)
        after = features.totals()
        gather_s = time.perf_counter() - t0
        x = x.to(device, torch.float32)
        if normalize:  # row-normalised features (Kipf & Welling's preprocessing), per gathered row
            x = x / x.sum(1, keepdim=True).clamp(min=1.0)
        seeds = ids[: b.batch_size].numpy()
        y = torch.from_numpy(np.asarray(labels[seeds], dtype=np.int64)).to(device)
        deg = None
        if indptr is not None:
            nid = ids.numpy()
            deg = torch.from_numpy((indptr[nid + 1] - indptr[nid]).astype(np.float32)).to(device)
        tiers = {k: (r - before.get(k, (0, 0))[0], n - before.get(k, (0, 0))[1]) for k, (r, n) in after.items()}
        return Prepared(b.to(device), x, y, deg, sample_s, gather_s, tiers)

    return prepare


# ----------------------------------------------------------------------------------------------
# distributed helpers


@dataclass(frozen=True)
class _World:
    rank: int
    size: int
    device: torch.device
    owns_group: bool

    def all_reduce(self, t: Tensor, op: str = "sum") -> Tensor:
        if self.size > 1:
            import torch.distributed as dist

            dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
                                   "min": dist.ReduceOp.MIN}[op])
        return t


def _world() -> _World:
    size = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local}" if cuda else "cpu")
    if size <= 1:
        return _World(0, 1, device, False)
    import torch.distributed as dist

    owns = False
    if not dist.is_initialized():
        if cuda:
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if cuda else "gloo")
        owns = True
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", size))
    if not cuda:  # ranks on one host share its cores; oversubscribed OpenMP pools crawl
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_size))
    return _World(dist.get_rank(), dist.get_world_size(), device, owns)


# ----------------------------------------------------------------------------------------------
# checkpoints


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """``torch.save`` to a temporary sibling, fsync, rename: a crash never leaves half a checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict[str, Any]:
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, EOFError, ValueError) as exc:
        raise TrainError(f"{path}: not a readable checkpoint ({exc}); delete it to start over") from None


# ----------------------------------------------------------------------------------------------
# the loop


class JsonlWriter:
    """Appends one JSON object per line, flushed per line (a resumed run continues the file)."""

    def __init__(self, path: str | os.PathLike) -> None:
        p = Path(path)
        if not p.parent.is_dir():
            raise TrainError(f"{path}: directory {p.parent} does not exist; create it or pick another metrics file")
        try:
            self._f = open(p, "a", encoding="utf-8")  # noqa: SIM115 -- closed by close(), lives for the run
        except OSError as exc:
            raise TrainError(f"{path}: cannot write metrics there ({exc.strerror})") from None

    def write(self, record: dict) -> None:
        self._f.write(json.dumps(record) + "\n")
        self._f.flush()

    def rewind(self, epoch: int, step: int) -> None:
        """Drop the step and epoch records at or after ``(epoch, step)``: a run resumed from a
        checkpoint there redoes them, and the file should hold each once (written atomically)."""
        path = Path(self._f.name)
        self._f.close()
        kept = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue  # a line cut short by the crash that made this a resume
            if r.get("kind") == "step" and (r.get("epoch", 0), r.get("step", 0)) >= (epoch, step):
                continue
            if r.get("kind") == "epoch" and r.get("epoch", 0) >= epoch:
                continue
            kept.append(line)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text("".join(ln + "\n" for ln in kept), encoding="utf-8")
        os.replace(tmp, path)
        self._f = open(path, "a", encoding="utf-8")  # noqa: SIM115 -- closed by close()

    def close(self) -> None:
        self._f.close()


def _open_source(config: TrainConfig, ds: Dataset, train_idx: np.ndarray, world: _World) -> BatchSource:
    if config.server:
        from training.serve import RemoteBatchSource  # only with a server: the module pulls in rpc

        return RemoteBatchSource(config.server, rank=world.rank, world_size=world.size,
                                 batch_size=config.batch_size, fanouts=config.fanouts, seed=config.seed,
                                 timeout_s=config.server_timeout_s)
    sampler = NeighborSampler(ds.indptr, ds.indices, config.fanouts, seed=config.seed)
    return LocalBatchSource(sampler, train_idx, config.batch_size, rank=world.rank, world_size=world.size,
                            seed=config.seed)


def _check_dataset(ds: Dataset) -> tuple[np.ndarray, np.ndarray]:
    if ds.labels is None or ds.num_classes < 1:
        raise TrainError(f"{ds.path}: the dataset has no labels.npy; import one with labels to train on it")
    if ds.train_idx is None or ds.train_idx.shape[0] == 0:
        raise TrainError(f"{ds.path}: the dataset has no training split (train_idx.npy); import it with a split")
    train_idx = np.asarray(ds.train_idx, dtype=np.int64)
    if (np.asarray(ds.labels)[train_idx] < 0).any():
        raise TrainError(f"{ds.path}: some training vertices are unlabelled (label -1); fix the split")
    return train_idx, np.asarray(ds.labels)


class _Sums:
    """Running sums of an epoch (saved in mid-epoch checkpoints)."""

    KEYS = ("seeds", "loss_sum", "correct", "sample_s", "gather_s", "compute_s", "allreduce_s", "io_wait_s",
            "step_s", "prior_s")  # prior_s: time the epoch ran before the checkpoint it resumed from

    def __init__(self, state: dict | None = None) -> None:
        self.v: dict[str, float] = {k: 0.0 for k in self.KEYS}
        self.tiers: dict[str, list[int]] = {}
        if state:
            self.v.update(state["v"])
            self.tiers = {k: list(x) for k, x in state["tiers"].items()}

    def state(self) -> dict:
        return {"v": dict(self.v), "tiers": {k: list(x) for k, x in self.tiers.items()}}


def train(config: TrainConfig, progress: Progress | None = None) -> TrainResult:
    """Train ``config`` in this process (one rank under ``torchrun``); see the module doc."""
    ds = open_dataset(config.dataset, validate=False)
    train_idx, labels = _check_dataset(ds)
    world = _world()
    try:
        return _train(config, ds, train_idx, labels, world, progress)
    finally:
        if world.owns_group:
            import torch.distributed as dist

            dist.destroy_process_group()


def _train(config: TrainConfig, ds: Dataset, train_idx: np.ndarray, labels: np.ndarray, world: _World,
           progress: Progress | None) -> TrainResult:
    metrics_file = JsonlWriter(config.metrics_path) if world.rank == 0 and config.metrics_path else None

    def emit(rec: dict) -> None:
        rec = {"rank": world.rank, "world_size": world.size, **rec}
        if metrics_file is not None:
            metrics_file.write(rec)
        if progress is not None:
            progress(rec)

    features: FeatureSource | None = None
    source: BatchSource | None = None
    try:
        features = open_features(ds, config.placement, config.backend)
        source = _open_source(config, ds, train_idx, world)
        if config.model != "gat" and config.attn_dropout:
            raise TrainError("attn_dropout applies to the GAT model only")
        torch.manual_seed(config.seed)  # identical initial parameters on every rank
        model = build_model(config.model, features.dim, ds.num_classes, len(config.fanouts), hidden=config.hidden,
                            heads=config.heads, out_heads=config.out_heads, dropout=config.dropout,
                            attn_dropout=config.attn_dropout if config.model == "gat" else None,
                            norm=config.gcn_norm if config.model == "gcn" else None).to(world.device)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)
        start_epoch, start_step, sums_state, resumed = 0, 0, None, None
        ckpt_path = Path(config.checkpoint_dir) / CHECKPOINT_NAME if config.checkpoint_dir else None
        if config.resume and ckpt_path is None:
            raise TrainError("resume needs a checkpoint directory (--checkpoint DIR)")
        if ckpt_path is not None:
            # a checkpoint directory that cannot be made fails now, not after the first epoch
            try:
                ckpt_path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise TrainError(f"checkpoint directory {ckpt_path.parent}: cannot create it "
                                 f"({exc.strerror or exc}); choose another --checkpoint") from None
        if config.resume and ckpt_path.exists():
            ck = load_checkpoint(ckpt_path)
            if not isinstance(ck, dict) or not {"config", "model", "optimizer", "epoch", "step", "rng"} <= set(ck):
                raise TrainError(f"{ckpt_path}: not a Moment training checkpoint; delete it or choose another "
                                 "--checkpoint directory")
            for key in _IDENTITY:
                was = ck["config"].get(key)
                now = config.to_dict()[key]
                if was != now:
                    raise TrainError(f"{ckpt_path}: written by a run with {key}={was!r}, this run has {now!r}; "
                                     "use the same settings or another checkpoint directory")
            try:
                model.load_state_dict(ck["model"])
                optimizer.load_state_dict(ck["optimizer"])
            except (RuntimeError, ValueError, KeyError) as exc:
                why = next((ln.strip() for ln in str(exc).splitlines() if "mismatch" in ln or "Missing" in ln),
                           str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                raise TrainError(f"{ckpt_path}: does not fit this model and dataset ({why[:160]}); "
                                 "it was written for another dataset? use another --checkpoint directory") from None
            for group in optimizer.param_groups:  # what this run asks for, not what the checkpoint had
                group["lr"], group["weight_decay"] = config.lr, config.weight_decay
            start_epoch, start_step, sums_state = ck["epoch"], ck["step"], ck.get("sums")
            _set_rng_state(ck["rng"])
            resumed = (start_epoch, start_step)
            if metrics_file is not None:
                metrics_file.rewind(start_epoch, start_step)
        elif world.size > 1:
            import torch.distributed as dist

            for p in model.state_dict().values():  # belt and braces: rank 0's initial weights everywhere
                dist.broadcast(p, 0)
        prepare = _preparer(features, labels,
                            np.asarray(ds.indptr) if config.model == "gcn" and config.gcn_norm == "global" else None,
                            config.normalize_features, world.device)
        steps = source.steps(0)
        n_train = int(train_idx.shape[0])
        emit({"kind": "start", "config": config.to_dict(), "steps_per_epoch": steps, "start_epoch": start_epoch,
              "start_step": start_step, "features": type(features).__name__, "num_train": n_train,
              "parameters": sum(p.numel() for p in params)})

        def checkpoint(epoch: int, step: int, sums: _Sums | None) -> None:
            if ckpt_path is None or world.rank != 0:
                return
            save_checkpoint(ckpt_path, {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                        "epoch": epoch, "step": step, "sums": None if sums is None else sums.state(),
                                        "rng": _rng_state(), "config": config.to_dict()})

        eval_sampler = NeighborSampler(ds.indptr, ds.indices, config.eval_fanouts or config.fanouts,
                                       seed=config.seed)
        records: list[dict] = []
        for epoch in range(start_epoch, config.epochs):
            first = start_step if epoch == start_epoch else 0
            sums = _Sums(sums_state if epoch == start_epoch and first else None)
            prior_s = sums.v["prior_s"]
            t_epoch = time.perf_counter()
            pre = Prefetcher(source.batches(epoch, first), prepare, config.prefetch)
            try:
                for step in range(first, steps):
                    rec = _step(model, params, optimizer, pre, world, n_train, config.batch_size, step, sums,
                                epoch=epoch)
                    rec.update(kind="step", epoch=epoch, step=step, steps=steps)
                    emit(rec)
                    if config.checkpoint_every_steps and (step + 1) % config.checkpoint_every_steps == 0 \
                            and step + 1 < steps:
                        sums.v["prior_s"] = prior_s + time.perf_counter() - t_epoch
                        checkpoint(epoch, step + 1, sums)
            finally:
                pre.close()
            epoch_s = prior_s + time.perf_counter() - t_epoch
            rec = _epoch_record(epoch, steps, sums, epoch_s)
            last = epoch == config.epochs - 1
            if last or (config.eval_every_epochs and (epoch + 1) % config.eval_every_epochs == 0):
                t_eval = time.perf_counter()
                for split in ("valid", "test"):
                    idx = getattr(ds, f"{split}_idx")
                    if idx is not None and len(idx):
                        rec[f"{split}_acc"] = _evaluate(model, np.asarray(idx, np.int64), eval_sampler, prepare,
                                                        world, config)
                rec["eval_s"] = time.perf_counter() - t_eval
            if world.size > 1:
                rec["param_spread"] = _param_spread(params, world)
            checkpoint(epoch + 1, 0, None)
            emit(rec)
            records.append(rec)
        return TrainResult(model=model, epochs=tuple(records), resumed_from=resumed, world_size=world.size,
                           rank=world.rank)
    finally:
        if source is not None:
            source.close()
        if features is not None:
            features.close()
        if metrics_file is not None:
            metrics_file.close()


def _step(model: torch.nn.Module, params: Sequence[Tensor], optimizer: torch.optim.Optimizer, pre: Prefetcher,
          world: _World, n_train: int, batch_size: int, step: int, sums: _Sums, *, epoch: int = 0) -> dict:
    t0 = time.perf_counter()
    item, waited = pre.get()
    if item is None:
        raise TrainError(f"the batch source ended before step {step}; it must yield every step of the epoch")
    global_bs = min(batch_size, n_train - step * batch_size)
    t1 = time.perf_counter()
    model.train()
    optimizer.zero_grad(set_to_none=True)
    b = item.batch
    loss_sum = torch.zeros((), device=world.device)
    correct = torch.zeros((), device=world.device)
    if b.batch_size:
        out = model(item.x, b.edge_index_per_layer, b.batch_size, deg=item.deg)
        loss = F.cross_entropy(out, item.y, reduction="sum")
        (loss / global_bs).backward()  # the global batch: N ranks' sum is one process's gradient
        loss_sum = loss.detach()
        correct = (out.detach().argmax(1) == item.y).sum().to(loss_sum.dtype)
    # one flat buffer: every parameter's gradient (zeros if this rank's part was empty), loss, hits
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
                     + [loss_sum.reshape(1).float(), correct.reshape(1).float()])
    if world.device.type == "cuda":
        torch.cuda.synchronize(world.device)
    t2 = time.perf_counter()
    world.all_reduce(flat)
    t3 = time.perf_counter()
    _refuse_non_finite(flat, epoch, step)
    at = 0
    for p in params:
        n = p.numel()
        p.grad = flat[at:at + n].view_as(p)
        at += n
    optimizer.step()
    loss_total, hits = float(flat[-2]), float(flat[-1])
    t4 = time.perf_counter()
    rec = {"seeds": global_bs, "loss": loss_total / global_bs, "train_acc": hits / global_bs,
           "sample_s": item.sample_s, "gather_s": item.gather_s, "compute_s": (t2 - t1) + (t4 - t3),
           "allreduce_s": t3 - t2, "io_wait_s": waited, "step_s": t4 - t0,
           "tiers": {k: {"rows": r, "bytes": n} for k, (r, n) in item.tiers.items()}}
    rec["seeds_per_s"] = global_bs / rec["step_s"] if rec["step_s"] > 0 else 0.0
    v = sums.v
    v["seeds"] += global_bs
    v["loss_sum"] += loss_total
    v["correct"] += hits
    for k in ("sample_s", "gather_s", "compute_s", "allreduce_s", "io_wait_s", "step_s"):
        v[k] += rec[k]
    for k, (r, n) in item.tiers.items():
        acc = sums.tiers.setdefault(k, [0, 0])
        acc[0] += r
        acc[1] += n
    return rec


def _refuse_non_finite(flat: Tensor, epoch: int, step: int) -> None:
    """Stop before the update when the summed loss or any gradient is NaN or infinite.

    ``flat`` is the all-reduced buffer, the same on every rank, so every rank
    stops at the same step (none waits in a collective). Raising here leaves
    the model as the last good step made it and writes no checkpoint: the one
    on disk stays the last good one.
    """
    if bool(torch.isfinite(flat).all()):
        return
    loss = float(flat[-2])
    what = f"the loss is {loss}" if not math.isfinite(loss) else "a gradient is NaN or infinite"
    raise TrainError(
        f"epoch {epoch}, step {step}: {what}; training stopped before updating the model, and the last "
        "checkpoint is left as it was. Corrupt features (check them with `moment data info --verify "
        "DATASET`) or too high a learning rate (--lr) are the usual causes")


def _epoch_record(epoch: int, steps: int, sums: _Sums, epoch_s: float) -> dict:
    v = sums.v
    seeds = v["seeds"] or 1
    return {"kind": "epoch", "epoch": epoch, "steps": steps, "seeds": int(v["seeds"]), "epoch_s": epoch_s,
            "seeds_per_s": v["seeds"] / epoch_s if epoch_s > 0 else 0.0, "loss": v["loss_sum"] / seeds,
            "train_acc": v["correct"] / seeds, "io_wait_share": v["io_wait_s"] / epoch_s if epoch_s > 0 else 0.0,
            **{k: v[k] for k in ("sample_s", "gather_s", "compute_s", "allreduce_s", "io_wait_s")},
            "tiers": {k: {"rows": r, "bytes": n} for k, (r, n) in sums.tiers.items()}}


@torch.no_grad()
def _evaluate(model: torch.nn.Module, idx: np.ndarray, sampler: NeighborSampler,
              prepare: Callable[[SampledBatch, float], Prepared], world: _World, config: TrainConfig) -> float:
    """Accuracy on ``idx``, every rank evaluating its share; the same sample whatever the epoch."""
    model.eval()
    parts = epoch_seeds(idx, 0, config.eval_batch_size, rank=world.rank, world_size=world.size, shuffle=False)

    def batches() -> Iterator[SampledBatch]:
        for i, part in enumerate(parts):
            sampler.reseed(_mix(config.seed, 0x5EED, world.rank, i))
            yield sampler.sample(part)

    hits = torch.zeros(2, dtype=torch.float64, device=world.device)
    pre = Prefetcher(batches(), prepare, config.prefetch)
    try:
        while True:
            item, _ = pre.get()
            if item is None:
                break
            if item.batch.batch_size:
                out = model(item.x, item.batch.edge_index_per_layer, item.batch.batch_size, deg=item.deg)
                hits[0] += float((out.argmax(1) == item.y).sum())
                hits[1] += item.batch.batch_size
    finally:
        pre.close()
    world.all_reduce(hits)
    return float(hits[0] / hits[1]) if hits[1] else 0.0


def _param_spread(params: Sequence[Tensor], world: _World) -> float:
    """Largest difference between ranks of any parameter tensor's sum (0.0: the ranks agree)."""
    fp = torch.stack([p.detach().double().sum() for p in params])
    hi, lo = world.all_reduce(fp.clone(), "max"), world.all_reduce(fp.clone(), "min")
    return float((hi - lo).abs().max())
