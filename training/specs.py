"""What a training run is: small frozen specs, one per group of readers, and the run's record of them.

:class:`TrainSpec` is the dataset plus five specs, each read by its own part
of the code:

- :class:`ModelSpec`: the network (:func:`training.models.build_model`) and how
  its input is fed (row normalisation, GCN degrees);
- :class:`SamplingSpec`: fan-outs, batch sizes, where sampling runs, the
  sampling server (:mod:`training.pipeline`, :mod:`training.serve`);
- :class:`IOSpec`: where the feature rows come from and how they travel
  (placement, read backend, prefetch, node-shared reads, a sharded placement's
  exchange and remote cache; :mod:`training.features`, :mod:`training.sharded.features`);
- :class:`DistributedSpec`: how long a rank waits on the others;
- :class:`RunSpec`: epochs, seed, optimiser, evaluation, checkpoints, metrics.

Each spec checks its own fields when made and raises
:class:`~training.errors.TrainError` naming the field and what it expects.

The run's record (the ``config`` of the metrics' start record and of every
checkpoint) stays the flat dict it always was: :meth:`TrainSpec.to_dict` writes
it under the field names of :data:`RECORD_FIELDS`, and :meth:`TrainSpec.from_dict`
reads it back, so checkpoints written before the specs resume as they did.

>>> spec = TrainSpec("cora", model=ModelSpec(arch="gcn", hidden=16), run=RunSpec(epochs=3))
>>> d = spec.to_dict()
>>> d["model"], d["hidden"], d["epochs"], d["fanouts"]
('gcn', 16, 3, [25, 10])
>>> TrainSpec.from_dict(d) == spec
True
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from iostack.backends import backend_choices
from iostack.cachepolicy import CACHE_POLICIES
from momentbase.jsontypes import JsonObject, JsonValue
from training.errors import TrainError
from training.models import MODELS
from training.vocab import (
    DATASET_CHECKS,
    DYNAMIC_CACHE_ON,
    EXCHANGES,
    GRAPH_ON,
    HETERO_MODEL_NAMES,
    PRECISIONS,
    SAMPLE_ON,
)

__all__ = ["RECORD_FIELDS", "DistributedSpec", "IOSpec", "ModelSpec", "RunSpec", "SamplingSpec", "TrainSpec"]

def _positive(spec: object, *names: str) -> None:
    for name in names:
        value = getattr(spec, name)
        if value is not None and int(value) < 1:
            raise TrainError(f"`{name}` {value}: expected a positive integer")


def _non_negative(spec: object, *names: str) -> None:
    for name in names:
        if int(getattr(spec, name)) < 0:
            raise TrainError(f"`{name}` {getattr(spec, name)}: expected a non-negative integer")


def _path(spec: object, *names: str) -> None:
    """Paths kept as strings (the record is JSON); ``None`` stays ``None``."""
    for name in names:
        value = getattr(spec, name)
        if value is not None:
            object.__setattr__(spec, name, os.fspath(value))


@dataclass(frozen=True)
class ModelSpec:
    """The network and its input. ``hidden``/``heads``/``out_heads``: ``None`` takes the model's default
    (SAGE/GCN 256 hidden units, GAT 64 × 8 heads). ``attn_dropout``: GAT only. ``gcn_norm``: GCN's degrees
    from the batch graph (``local``) or the whole graph (``global``). ``normalize_features``: row-normalise
    the gathered rows (Planetoid style)."""

    arch: str = "sage"
    hidden: int | None = None
    heads: int | None = None
    out_heads: int | None = None
    dropout: float = 0.5
    attn_dropout: float = 0.0
    gcn_norm: str = "local"
    normalize_features: bool = False

    def __post_init__(self) -> None:
        if self.arch not in MODELS and self.arch not in HETERO_MODEL_NAMES:
            raise TrainError(f"`arch` {self.arch!r}: expected one of {', '.join((*MODELS, *HETERO_MODEL_NAMES))}")
        _positive(self, "hidden", "heads", "out_heads")
        if self.gcn_norm not in ("local", "global"):
            raise TrainError(f"`gcn_norm` {self.gcn_norm!r}: expected 'local' or 'global'")
        if self.arch != "gat" and self.attn_dropout:
            raise TrainError("`attn_dropout` applies to the GAT model only")

    @property
    def global_degrees(self) -> bool:
        """Whether the model reads every vertex's whole-graph degree (GCN with ``gcn_norm="global"``)."""
        return self.arch == "gcn" and self.gcn_norm == "global"


@dataclass(frozen=True)
class SamplingSpec:
    """The batches. ``fanouts``: neighbours per hop, hop 1 first (``-1`` = all); one model layer each.
    ``eval_fanouts``: evaluation's (``None``: ``fanouts``). ``batch_size``: global seeds per step.
    ``sample_on``: ``auto`` samples on the GPU when the graph fits there, else on the host; ``cpu``;
    ``gpu`` (an error when it cannot). ``server``: ``HOST:PORT`` of a sampling server to take the
    training batches from, waited on for ``server_timeout_s``. ``graph_on``: ``memory`` (the CSR's
    memory maps) or ``disk`` (the sampled neighbour lists read from ``indices.npy`` with direct I/O,
    sampled on the host: :mod:`training.diskcsr`), with an adjacency cache of ``graph_cache_bytes``.
    ``partition``: a ``moment data partition`` output of the dataset: the training batches are sampled
    over it, each rank holding the global ``indptr`` and its own partition's slice of the neighbour
    lists (:mod:`training.distsample`; one rank per partition, sampled on the host)."""

    fanouts: tuple[int, ...] = (25, 10)
    eval_fanouts: tuple[int, ...] | None = None
    batch_size: int = 1024
    eval_batch_size: int = 4096
    sample_on: str = "auto"
    server: str | None = None
    server_timeout_s: float = 30.0
    graph_on: str = "memory"
    graph_cache_bytes: int = 0
    partition: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "fanouts", tuple(int(f) for f in self.fanouts))
        if self.eval_fanouts is not None:
            object.__setattr__(self, "eval_fanouts", tuple(int(f) for f in self.eval_fanouts))
        for fo, what in ((self.fanouts, "fanouts"), (self.eval_fanouts, "eval_fanouts")):
            if fo is not None and (not fo or any(f < -1 or f == 0 for f in fo)):
                raise TrainError(f"`{what}` {list(fo)}: expected positive integers or -1 (all neighbours)")
        if self.eval_fanouts is not None and len(self.eval_fanouts) != len(self.fanouts):
            raise TrainError(f"`eval_fanouts` {list(self.eval_fanouts)}: need one per layer ({len(self.fanouts)})")
        _positive(self, "batch_size", "eval_batch_size")
        if self.sample_on not in SAMPLE_ON:
            raise TrainError(f"`sample_on` {self.sample_on!r}: expected one of {', '.join(SAMPLE_ON)}")
        if not 0 < self.server_timeout_s < math.inf:
            raise TrainError(f"`server_timeout_s` {self.server_timeout_s}: expected a positive number of seconds")
        self._check_graph_on()

    def _check_graph_on(self) -> None:
        if self.graph_on not in GRAPH_ON:
            raise TrainError(f"`graph_on` {self.graph_on!r}: expected one of {', '.join(GRAPH_ON)}")
        _non_negative(self, "graph_cache_bytes")
        if self.graph_on == "disk" and self.server:
            raise TrainError("`graph_on` 'disk' samples in this process: drop `server`, or keep the graph in "
                             "memory (`graph_on` 'memory')")
        if self.partition and (self.server or self.graph_on == "disk" or self.sample_on == "gpu"):
            raise TrainError("`partition` samples over the ranks' partitions on the host: drop `server`, "
                             "`graph_on` 'disk' and `sample_on` 'gpu'")
        if self.graph_on == "disk" and self.sample_on == "gpu":
            raise TrainError("`graph_on` 'disk' samples on the host's CPU: drop `sample_on` 'gpu', or keep the "
                             "graph in memory (`graph_on` 'memory')")

    @property
    def layers(self) -> int:
        """The model's layers: one per fan-out."""
        return len(self.fanouts)

    @property
    def evaluation_fanouts(self) -> tuple[int, ...]:
        """The fan-outs evaluation samples with."""
        return self.eval_fanouts or self.fanouts


@dataclass(frozen=True)
class IOSpec:
    """Where the rows come from. ``placement``: a placement directory (``None``: the dataset's features
    in memory). ``backend``: the SSD read backend (``auto``: chosen by the measurements in
    ``capacities``, a ``moment profile`` file; :func:`iostack.backends.choose_backend`). ``prefetch``:
    batches prepared ahead (0 = inline). ``node_shared_reads``: the ranks of a node read each SSD page
    of a step once, for all of them (:mod:`training.nodeshare`). ``exchange``, ``remote_cache_bytes``
    (0 = none), ``remote_cache_dir`` (an SSD directory for it instead of host memory): a placement
    sharded across nodes (:mod:`training.sharded.features`). ``cache_policy``: ``static`` (the placement's caches
    as filled at start), or a policy of :data:`iostack.cachepolicy.CACHE_POLICIES` for a host cache of
    ``dynamic_cache_bytes`` that fills on access, warm-started with the static fill
    (:mod:`training.cached_features`), its rows in host memory or, ``dynamic_cache_on`` ``gpu``, on the rank's
    accelerator; on a sharded placement it is the remote cache (``remote_cache_bytes``)
    that fills on access (:class:`training.sharded.remote_cache.DynamicRemoteCache`). ``check_dataset``:
    ``background`` (the default) checks every block of the dataset arrays training reads against their CRC-32s
    while it runs
    (:mod:`training.background_verify`); ``open`` only the sample checked on opening. ``replace_every``: re-place
    the placement in the background after every that many epochs (0 = never), on the rows of every
    ``replace_count_every``-th batch, when the caches' predicted share of reads rises by ``replace_min_gain``
    (:mod:`training.place.live`)."""

    placement: str | None = None
    backend: str = "auto"
    capacities: str | None = None
    prefetch: int = 2
    node_shared_reads: bool = True
    exchange: str = "alltoall"
    remote_cache_bytes: int = 0
    remote_cache_dir: str | None = None
    cache_policy: str = "static"
    dynamic_cache_bytes: int = 0
    dynamic_cache_on: str = "host"
    check_dataset: str = "background"
    replace_every: int = 0
    replace_count_every: int = 1
    replace_min_gain: float = 0.01

    def __post_init__(self) -> None:
        _path(self, "placement", "capacities", "remote_cache_dir")
        if self.check_dataset not in DATASET_CHECKS:
            raise TrainError(f"`check_dataset` {self.check_dataset!r}: expected one of {', '.join(DATASET_CHECKS)}")
        if self.cache_policy not in CACHE_POLICIES.names():
            raise TrainError(f"`cache_policy` {self.cache_policy!r}: expected one of "
                             f"{', '.join(CACHE_POLICIES.names())}")
        if self.cache_policy != "static" and int(self.dynamic_cache_bytes) <= 0 and int(self.remote_cache_bytes) <= 0:
            raise TrainError(f"`cache_policy` {self.cache_policy}: give `dynamic_cache_bytes`, the size of the cache "
                             "that fills on access (> 0), or on a sharded placement `remote_cache_bytes`")
        if self.dynamic_cache_on not in DYNAMIC_CACHE_ON:
            raise TrainError(f"`dynamic_cache_on` {self.dynamic_cache_on!r}: expected one of "
                             f"{', '.join(DYNAMIC_CACHE_ON)}")
        if self.dynamic_cache_on != "host" and int(self.dynamic_cache_bytes) <= 0:
            raise TrainError(f"`dynamic_cache_on` {self.dynamic_cache_on}: give `dynamic_cache_bytes`, the size of "
                             "the cache that fills on access (> 0)")
        if self.backend not in backend_choices():
            raise TrainError(f"`backend` {self.backend!r}: expected one of {', '.join(backend_choices())}")
        if self.backend == "kvikio" and self.placement is None:
            # kvikio reads SSD bins into GPU memory; without a placement the rows come from memory
            raise TrainError("`backend=kvikio` reads a placement's SSD bins: give `placement` "
                             "(a `moment place` output), or leave `backend` at auto")
        _non_negative(self, "prefetch", "replace_every")
        if int(self.replace_count_every) < 1 or not 0 <= float(self.replace_min_gain) < 1:
            raise TrainError(f"`replace_count_every` {self.replace_count_every}, `replace_min_gain` "
                             f"{self.replace_min_gain}: expected a whole number >= 1 and a fraction in [0, 1)")
        if self.replace_every and (self.placement is None or self.cache_policy != "static"):
            raise TrainError("`replace_every` re-places a placement's own caches and bins: give `placement`, "
                             "and leave `cache_policy` at static")
        if self.exchange not in EXCHANGES:
            raise TrainError(f"`exchange` {self.exchange!r}: expected one of {', '.join(EXCHANGES)}")
        if int(self.remote_cache_bytes) < 0:
            raise TrainError(f"`remote_cache_bytes` {self.remote_cache_bytes}: expected a size in bytes >= 0")


@dataclass(frozen=True)
class DistributedSpec:
    """The world's waits. ``timeout_s``: how long a rank waits on the others in a step's collectives (and
    the feature exchange) before it stops with an error. The ranks themselves come from the launcher
    (``torchrun``'s environment, :func:`training.distributed.open_world`)."""

    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not 0 < self.timeout_s < math.inf:
            raise TrainError(f"`timeout_s` {self.timeout_s}: expected a positive number of seconds")


@dataclass(frozen=True)
class RunSpec:
    """The run around the steps. ``epochs``: epochs to reach. ``seed``: parameters, shuffling, sampling.
    ``lr``, ``weight_decay``: Adam's. ``eval_every_epochs``: 0 = only after the last epoch.
    ``checkpoint_dir``: write ``checkpoint.pt`` there at every epoch end (and every
    ``checkpoint_every_steps`` steps; 0 = epoch ends only); ``resume``: continue from it.
    ``metrics_path``: JSON lines of the run's records (rank 0). ``precision``: the arithmetic of the steps
    and evaluation (:data:`~training.vocab.PRECISIONS`; :mod:`training.precision`): ``32``, or a mixed
    precision under which float16/bfloat16 rows reach the model in their own type."""

    epochs: int = 1
    seed: int = 0
    lr: float = 0.003
    weight_decay: float = 0.0
    eval_every_epochs: int = 1
    checkpoint_dir: str | None = None
    checkpoint_every_steps: int = 0
    resume: bool = False
    metrics_path: str | None = None
    precision: str = "32"

    def __post_init__(self) -> None:
        _path(self, "checkpoint_dir", "metrics_path")
        if self.precision not in PRECISIONS:
            raise TrainError(f"`precision` {self.precision!r}: expected one of {', '.join(PRECISIONS)}")
        _positive(self, "epochs")
        _non_negative(self, "eval_every_epochs", "checkpoint_every_steps")
        if not 0 < self.lr < math.inf or not 0 <= self.weight_decay < math.inf:  # nan fails too
            raise TrainError(f"`lr` must be > 0 and `weight_decay` >= 0, got {self.lr} and {self.weight_decay}")


#: the run's record (metrics' start record, checkpoints): its field names in order, as they have always been
RECORD_FIELDS = (
    "dataset", "placement", "model", "fanouts", "eval_fanouts", "batch_size", "eval_batch_size", "epochs", "lr",
    "weight_decay", "dropout", "attn_dropout", "hidden", "heads", "out_heads", "gcn_norm", "normalize_features",
    "seed", "prefetch", "eval_every_epochs", "metrics_path", "checkpoint_dir", "checkpoint_every_steps", "resume",
    "server", "backend", "server_timeout_s", "sample_on", "capacities", "timeout_s", "exchange", "remote_cache",
    "remote_cache_dir", "node_shared_reads", "graph_on", "graph_cache", "cache_policy", "dynamic_cache",
    "check_dataset", "precision", "partition", "replace_every", "replace_count_every", "replace_min_gain",
    "dynamic_cache_on")

_GROUPS: dict[str, type] = {"model": ModelSpec, "sampling": SamplingSpec, "io": IOSpec,
                            "distributed": DistributedSpec, "run": RunSpec}
#: record fields whose name in their spec differs
_RENAMED = {"model": "arch", "remote_cache": "remote_cache_bytes", "graph_cache": "graph_cache_bytes",
            "dynamic_cache": "dynamic_cache_bytes"}


def _where() -> dict[str, tuple[str, str]]:
    """Each record field → (the group holding it, its name there)."""
    by_field = {f.name: group for group, cls in _GROUPS.items() for f in dataclasses.fields(cls)}
    return {key: (by_field[_RENAMED.get(key, key)], _RENAMED.get(key, key)) for key in RECORD_FIELDS
            if key != "dataset"}


_WHERE = _where()


@dataclass(frozen=True)
class TrainSpec:
    """A training run: the dataset directory and the five specs (see the module doc)."""

    dataset: str
    model: ModelSpec = field(default_factory=ModelSpec)
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    io: IOSpec = field(default_factory=IOSpec)
    distributed: DistributedSpec = field(default_factory=DistributedSpec)
    run: RunSpec = field(default_factory=RunSpec)

    def __post_init__(self) -> None:
        _path(self, "dataset")
        for group, cls in _GROUPS.items():
            if not isinstance(getattr(self, group), cls):
                raise TrainError(f"`{group}`: expected a {cls.__name__}, got {type(getattr(self, group)).__name__}")

    def to_dict(self) -> JsonObject:
        """The flat record of the run (JSON-ready: lists for fan-outs), fields in :data:`RECORD_FIELDS`' order."""
        d: JsonObject = {"dataset": self.dataset}
        for key, (group, name) in _WHERE.items():
            value = getattr(getattr(self, group), name)
            d[key] = list(value) if isinstance(value, tuple) else value
        return d

    @classmethod
    def from_dict(cls, record: Mapping[str, JsonValue]) -> TrainSpec:
        """The spec of a flat record (:meth:`to_dict`'s, or a subset: the rest default).

        Raises
        ------
        TrainError
            A field that is not one of :data:`RECORD_FIELDS`, a missing ``dataset``, or a bad value.
        """
        unknown = sorted(set(record) - set(RECORD_FIELDS))
        if unknown:
            raise TrainError(f"training settings: unknown field(s) {', '.join(unknown)}; "
                             f"expected some of {', '.join(RECORD_FIELDS)}")
        if "dataset" not in record:
            raise TrainError("training settings: no dataset; name the dataset directory")
        parts: dict[str, JsonObject] = {group: {} for group in _GROUPS}
        for key, value in record.items():
            if key != "dataset":
                group, name = _WHERE[key]
                parts[group][name] = value
        return cls(record["dataset"], **{group: _GROUPS[group](**kw) for group, kw in parts.items()})
