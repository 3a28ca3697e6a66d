"""How much host memory a CPU feature cache may take: ``moment place --cpu-cache auto``.

The memory a job may use (:func:`available_memory`: the cgroup's limit where one
applies, else the machine's ``MemAvailable``, the smaller of the two, or the
user's ``--memory-limit``) less what training itself holds
(:class:`TrainingReserve`, itemised from the dataset's real sizes by
:func:`training_reserve`), split evenly over the plan's host memories (NUMA
nodes; the cache is one per node) and rounded down to whole rows:
:func:`size_cpu_cache`. :func:`check_training_memory` is the same sum turned
round for ``moment train``: does a placement's cache plus the reserve fit now?

The sizing itself is pure (typed inputs, a typed :class:`CacheSizing`); only
:func:`read_cgroup_limit` and :func:`read_mem_available` read files, and their
paths are arguments, so tests hand them fake ``/proc`` and ``/sys`` trees.
How close the reserve comes to measured peak RSS is in docs/design-notes.md
("Placement", ``--cpu-cache auto``).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from momentbase.units import format_size
from training.errors import TrainingError

if TYPE_CHECKING:  # the specs pull in torch's models: only for the annotations
    import numpy as np

    from iostack.placement import Placement
    from training.data import Dataset
    from training.specs import IOSpec, SamplingSpec

log = logging.getLogger(__name__)

MIB = 1 << 20
#: RSS of an idle ``moment train`` process: the interpreter, torch, PyG and Moment's
#: modules imported, one autograd step of a tiny layer run, no dataset opened. Measured
#: (3 runs: 388-389 MiB; torch 2.13.0+cpu, PyG 2.8.1, Python 3.11) as VmRSS in
#: /proc/self/status after ``import moment.cli, training.trainer, torch_geometric.nn`` and
#: ``torch.nn.Linear(8, 8)(torch.ones(4, 8)).sum().backward()``; rounded up. A CUDA build's
#: context adds more.
RUNTIME_BYTES = 400 * MIB
#: the posix backend's staging buffer (``iostack.backends.posix.PosixBackend(staging_bytes=)``)
READ_STAGING_BYTES = 32 << 20
#: idle gather buffers the store's ``AlignedPool`` keeps for reuse (``AlignedPool(keep=2)``)
POOL_KEEP = 2
#: the safety margin: this share of the itemised reserve, and at least MARGIN_MIN_BYTES
MARGIN_SHARE = 0.10
MARGIN_MIN_BYTES = 64 * MIB
#: what the model estimate assumes (``moment train``'s defaults: GraphSAGE, hidden 256)
HIDDEN = 256
#: the activations a training step holds, and the same again as their gradients in backward
ACTIVATION_FACTOR = 2
#: ``moment train --eval-batch-size``'s default: evaluation batches pass through the same buffers
EVAL_BATCH_SIZE = 4096
#: cgroup v1 writes "no limit" as the largest page-aligned counter; anything above this is none
_NO_LIMIT = 1 << 60


class MemoryPlanError(TrainingError):
    """The memory left for a cache is not enough, or a figure given for it is not usable."""


@dataclass(frozen=True)
class MemoryLimit:
    """The memory a job may use, in bytes, and where the figure came from.

    ``source``: ``"cgroup memory.max"``, ``"cgroup memory.high"``, ``"cgroup
    memory.limit_in_bytes"``, ``"MemAvailable"`` or ``"--memory-limit"``;
    ``detail``: the file it was read from (or the text given).
    """

    bytes: int
    source: str
    detail: str = ""


@dataclass(frozen=True)
class GraphSizes:
    """The sizes of a dataset that training's memory depends on.

    >>> GraphSizes(num_nodes=10, num_edges=40, indptr_bytes=88, indices_bytes=160, feature_dim=4,
    ...            stored_row_bytes=16, label_bytes=80, num_classes=3, split_ids=10).feature_bytes
    160
    """

    num_nodes: int
    num_edges: int
    indptr_bytes: int
    indices_bytes: int
    feature_dim: int
    #: one feature row as the bins hold it (the codec's when ``--feature-dtype`` is given)
    stored_row_bytes: int
    label_bytes: int
    num_classes: int
    #: training, validation and test ids together
    split_ids: int
    #: training ids, and the larger of validation and test (a batch holds no more seeds); 0: unknown
    num_train: int = 0
    num_eval: int = 0

    @property
    def feature_bytes(self) -> int:
        return self.num_nodes * self.stored_row_bytes

    @classmethod
    def of(cls, ds: Dataset, stored_row_bytes: int | None = None) -> GraphSizes:
        """The sizes of an open :class:`training.data.Dataset` (arrays memory-mapped, nothing read)."""
        def nbytes(a: np.ndarray | None) -> int:
            return int(a.nbytes) if a is not None else 0

        n = [int(a.shape[0]) if a is not None else 0 for a in (ds.train_idx, ds.valid_idx, ds.test_idx)]
        return cls(num_nodes=int(ds.num_nodes), num_edges=int(ds.num_edges), indptr_bytes=nbytes(ds.indptr),
                   indices_bytes=nbytes(ds.indices), feature_dim=int(ds.features.shape[1]),
                   stored_row_bytes=int(stored_row_bytes or ds.row_bytes), label_bytes=nbytes(ds.labels),
                   num_classes=max(1, int(ds.num_classes)), split_ids=sum(n), num_train=n[0],
                   num_eval=max(n[1:]))


@dataclass(frozen=True)
class TrainingReserve:
    """What one ``moment train`` process holds besides the CPU cache, item by item (bytes).

    ``csr_bytes``: indptr + indices (memory-mapped, resident while sampling);
    ``sampler_bytes``: the training and evaluation samplers' vertex maps (int64 each);
    ``labels_bytes``: the labels file, its int64 copy and the split ids (int64);
    ``batch_bytes``: the batches in flight (prefetched, training, being prepared)
    and the gather buffers the store's pool keeps; ``model_bytes``: parameters,
    gradients, Adam's two moments and a batch's activations; ``runtime_bytes``:
    the idle process (:data:`RUNTIME_BYTES`); ``read_buffer_bytes``: the SSD
    reader's staging; ``margin_bytes``: the safety margin.
    """

    csr_bytes: int
    sampler_bytes: int
    labels_bytes: int
    batch_bytes: int
    model_bytes: int
    runtime_bytes: int
    read_buffer_bytes: int
    margin_bytes: int

    @property
    def total_bytes(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))

    def items(self) -> list[tuple[str, int]]:
        """``(name without _bytes, bytes)`` per item, in field order."""
        return [(f.name.removesuffix("_bytes"), getattr(self, f.name)) for f in fields(self)]


@dataclass(frozen=True)
class CacheSizing:
    """The CPU cache ``--cpu-cache auto`` chose, and why.

    ``per_node_bytes``: the cache per host memory (NUMA node), whole rows;
    ``capped``: True when the dataset's features fit whole and the cache was
    held to them; ``note``: one line saying how the figure came about.
    """

    limit: MemoryLimit
    reserve: TrainingReserve
    numa_nodes: int
    row_bytes: int
    feature_bytes: int
    per_node_bytes: int
    capped: bool
    note: str

    @property
    def total_bytes(self) -> int:
        return self.per_node_bytes * self.numa_nodes

    def to_dict(self) -> dict[str, Any]:
        """The JSON form ``place.json`` records (``cpu_cache_sizing``)."""
        d = asdict(self)
        d["reserve"]["total_bytes"] = self.reserve.total_bytes
        return d


def batch_rows(batch_size: int, fanouts: Sequence[int], num_nodes: int) -> list[int]:
    """Distinct rows of a batch up to each hop for ``batch_size`` seeds, the seeds first.

    Hop ``h`` adds ``rows * f`` draws of neighbours; among ``n`` vertices, ``k`` draws
    hit ``n (1 - exp(-k/n))`` distinct ones on average when every vertex is as likely
    (skewed draws hit fewer), so that bounds the new rows. A fan-out of ``-1`` (all
    neighbours) is taken as reaching every vertex.

    >>> batch_rows(1000, (25, 10), 10**9), batch_rows(1000, (-1,), 5000), batch_rows(1000, (10,), 10**4)
    ([1000, 26000, 285967], [1000, 5000], [1000, 7322])
    """
    rows = [min(int(batch_size), num_nodes)]
    for f in fanouts:
        r = rows[-1]
        new = num_nodes * -math.expm1(-r * f / num_nodes) if f >= 0 else num_nodes
        rows.append(min(num_nodes, r * (1 + f) if f >= 0 else num_nodes, math.ceil(r + new)))
    return rows


def training_reserve(
    g: GraphSizes,
    *,
    batch_size: int,
    fanouts: Sequence[int],
    prefetch: int = 2,
    workers: int = 1,
    hidden: int = HIDDEN,
    eval_batch_size: int = EVAL_BATCH_SIZE,
    runtime_bytes: int = RUNTIME_BYTES,
    read_buffer_bytes: int = READ_STAGING_BYTES,
) -> TrainingReserve:
    """The host memory a ``moment train`` process of these sizes holds besides its CPU cache.

    Parameters
    ----------
    g : GraphSizes
        The dataset's sizes (:meth:`GraphSizes.of`).
    batch_size, fanouts, prefetch : int, sequence of int, int
        The training batch (seeds), its fan-outs and the batches prefetched (``moment train --prefetch``).
    workers : int
        Threads preparing batches (:func:`training.pipeline.prefetch_workers`: 2 with node-shared reads).
    hidden : int
        Hidden units of the model (GraphSAGE, ``moment train``'s default 256).
    eval_batch_size : int
        Seeds of an evaluation batch (``moment train``'s default 4096).
    runtime_bytes, read_buffer_bytes : int
        The idle process and the SSD reader's staging (defaults measured / the backend's).

    Examples
    --------
    >>> g = GraphSizes(10**5, 10**6, 8 * (10**5 + 1), 4 * 10**6, 128, 512, 8 * 10**5, 10, 10**4)
    >>> r = training_reserve(g, batch_size=1000, fanouts=(10, 5))
    >>> r.csr_bytes, r.runtime_bytes == RUNTIME_BYTES, r.total_bytes > r.runtime_bytes
    (4800008, True, True)
    """
    if batch_size < 1 or prefetch < 0 or workers < 1:
        raise MemoryPlanError(f"batch size {batch_size} / prefetch {prefetch} / workers {workers}: "
                              "expected >= 1 / >= 0 / >= 1")
    # a batch holds at most its split's seeds; the larger of a training and an evaluation batch
    # passes through the same buffers
    batch_size = min(batch_size, g.num_train) if g.num_train else batch_size
    eval_batch_size = min(eval_batch_size, g.num_eval) if g.num_train else eval_batch_size
    rows = batch_rows(max(batch_size, eval_batch_size), fanouts, g.num_nodes)
    gather = rows[-1] * g.stored_row_bytes  # the pool's buffers are powers of two, but untouched pages stay free
    decoded = rows[-1] * g.feature_dim * 4 if g.stored_row_bytes != g.feature_dim * 4 else 0
    sampled = sum(rows[1:]) * 2 * 8 + sum(rows) * 8 * 2  # edge_index int64 (an edge per neighbour), node lists
    # in flight: `prefetch` queued, one training, one per worker being prepared while the queue is full
    batch = (prefetch + 1 + workers) * (gather + decoded + sampled) + POOL_KEEP * gather
    return TrainingReserve(**_rest(g, batch_rows(batch_size, fanouts, g.num_nodes), fanouts, hidden, batch,
                                   runtime_bytes, read_buffer_bytes))


def _rest(g: GraphSizes, rows: list[int], fanouts: Sequence[int], hidden: int, batch: int, runtime_bytes: int,
          read_buffer_bytes: int) -> dict[str, int]:
    """Every reserve item from the batch's working set on (the model from a training batch's ``rows``)."""
    widths = [g.feature_dim, *([hidden] * (len(rows) - 2)), g.num_classes]
    params = sum(
        2 * a * b + b for a, b in zip(widths, widths[1:], strict=False)
    )  # SAGEConv: lin_l (with bias) and lin_r
    activ = 0
    for h in range(len(rows) - 1, 0, -1):  # the layer from hop h's rows to hop h-1's, outermost first
        w_in, w_out = widths[len(rows) - 1 - h], widths[len(rows) - h]
        edges = min(g.num_edges, rows[h - 1] * fanouts[h - 1]) if fanouts[h - 1] >= 0 else g.num_edges
        # the gathered messages (edges x w_in, transient), per target: mean and own row (2 w_in), the
        # two linear outputs, ReLU and dropout (3 w_out); float32
        activ += 4 * (edges * w_in + rows[h - 1] * (2 * w_in + 3 * w_out))
    items = dict(csr_bytes=g.indptr_bytes + g.indices_bytes, sampler_bytes=2 * 8 * g.num_nodes,
                 labels_bytes=g.label_bytes + 8 * g.num_nodes + 8 * g.split_ids, batch_bytes=batch,
                 # parameters, gradients and Adam's two moments; activations and their gradients
                 model_bytes=params * 4 * 4 + ACTIVATION_FACTOR * activ, runtime_bytes=int(runtime_bytes),
                 read_buffer_bytes=int(read_buffer_bytes))
    margin = max(MARGIN_MIN_BYTES, int(MARGIN_SHARE * sum(items.values())))
    return {**items, "margin_bytes": margin}


def size_cpu_cache(limit: MemoryLimit, reserve: TrainingReserve, *, numa_nodes: int, row_bytes: int,
                   feature_bytes: int) -> CacheSizing:
    """The CPU cache per NUMA node that fits in ``limit`` beside ``reserve``.

    ``(limit - reserve) / numa_nodes``, rounded down to whole rows of
    ``row_bytes``, and at most ``feature_bytes`` (all rows; more would hold
    nothing). Raises :class:`MemoryPlanError` when the limit is below the reserve.

    >>> r = TrainingReserve(100, 0, 0, 0, 0, 0, 0, 0)
    >>> s = size_cpu_cache(MemoryLimit(1100, "--memory-limit"), r, numa_nodes=2, row_bytes=64,
    ...                    feature_bytes=10**6)
    >>> s.per_node_bytes, s.total_bytes, s.capped
    (448, 896, False)
    """
    if numa_nodes < 1 or row_bytes < 1:
        raise MemoryPlanError(f"numa_nodes {numa_nodes}, row_bytes {row_bytes}: expected at least 1 each")
    left = limit.bytes - reserve.total_bytes
    if left < 0:
        raise MemoryPlanError(
            f"`cpu_cache_sizing`: the memory limit {format_size(limit.bytes)} ({limit.source}) is below what "
            f"training itself needs, {format_size(reserve.total_bytes)}; give a larger `memory_limit`, a "
            "smaller `batch_size` or fewer `fanouts`, or pass `cpu_cache_bytes=0`")
    per_node = left // numa_nodes // row_bytes * row_bytes
    whole = -(-feature_bytes // row_bytes) * row_bytes
    capped = per_node >= whole
    per_node = min(per_node, whole)
    note = (f"{format_size(limit.bytes)} ({limit.source}) - {format_size(reserve.total_bytes)} reserved for "
            f"training = {format_size(left)}, over {numa_nodes} NUMA node(s)")
    if capped:
        note += f"; capped at the dataset's features ({format_size(whole)}): every row fits in one node's cache"
    return CacheSizing(limit, reserve, numa_nodes, row_bytes, feature_bytes, per_node, capped, note)


def check_training_memory(cache_bytes: int, reserve: TrainingReserve, available: MemoryLimit, ranks: int = 1
                          ) -> str | None:
    """A warning when ``cache_bytes`` of host cache plus ``ranks`` × ``reserve`` exceed ``available``; else None.

    ``ranks``: the training processes of this node (each holds its own reserve; the cache is one per node).

    >>> r = TrainingReserve(0, 0, 0, 0, 0, 100 * MIB, 0, 0)
    >>> check_training_memory(50 * MIB, r, MemoryLimit(1 << 30, "MemAvailable")) is None
    True
    >>> print(check_training_memory(1 << 30, r, MemoryLimit(1 << 30, "MemAvailable")))  # doctest: +ELLIPSIS
    the placement's CPU cache (1 GiB) plus training's own 100 MiB need 1.1 GiB, more than the 1 GiB ...
    """
    own = reserve.total_bytes * max(1, ranks)
    need = cache_bytes + own
    if need <= available.bytes:
        return None
    return (f"the placement's CPU cache ({format_size(cache_bytes)}) plus training's own "
            f"{format_size(own)}{f' ({ranks} ranks)' if ranks > 1 else ''} need {format_size(need)}, more than the "
            f"{format_size(available.bytes)} available ({available.source}); the run may swap or be killed: "
            "place again with `moment place --cpu-cache auto` (or a smaller --cpu-cache SIZE)")


def host_cache_bytes(placement: Placement, row_bytes: int, *, gpu_bins_on_host: bool) -> int:
    """Bytes of host memory a placement's caches take: the rows its CPU bins hold (and its GPU bins',
    which live in host memory when training runs without a GPU).

    >>> from iostack.placement import simple_placement
    >>> host_cache_bytes(simple_placement(10, [("cpu", 4), ("ssd", 10)]), 64, gpu_bins_on_host=False)
    256
    """
    import numpy as np

    kinds = ("cpu", "gpu") if gpu_bins_on_host else ("cpu",)
    counts = np.bincount(np.asarray(placement.bin_of), minlength=len(placement.bins))
    return int(sum(int(counts[b.id]) for b in placement.bins if b.kind in kinds)) * int(row_bytes)


def cpu_cache_for(ds: Dataset, numa_nodes: int, *, batch_size: int, fanouts: Sequence[int],
                  feature_dtype: str | None = None, memory_limit: int | None = None) -> CacheSizing:
    """``moment place --cpu-cache auto``: the cache per NUMA node for dataset ``ds`` (a
    :class:`training.data.Dataset` with features) placed over ``numa_nodes`` host memories.

    ``feature_dtype``: the rows' stored type when the placement converts them
    (``moment place --feature-dtype``); ``memory_limit``: bytes to size for instead
    of this machine's (:func:`available_memory`).
    """
    from iostack.codec import stored_row_bytes

    if ds.features is None:
        raise MemoryPlanError(f"dataset {ds.path}: has no features to place; import it with features")
    row = stored_row_bytes(feature_dtype, int(ds.features.shape[1])) if feature_dtype else ds.row_bytes
    g = GraphSizes.of(ds, stored_row_bytes=row)
    reserve = training_reserve(g, batch_size=batch_size, fanouts=fanouts)
    return size_cpu_cache(available_memory(memory_limit), reserve, numa_nodes=max(1, numa_nodes), row_bytes=row,
                          feature_bytes=g.feature_bytes)


def check_host_memory(io: IOSpec, sampling: SamplingSpec, ds: Dataset, *, hidden: int | None, gpu_bins_on_host: bool,
                      ranks: int = 1) -> str | None:
    """Warn (log, never refuse) when a run's placement's host caches plus training's reserve exceed the
    memory available now; the warning, or None. ``io``: the run's placement, prefetch and node-shared
    reads; ``sampling``: its batch sizes and fan-outs; ``hidden``: the model's hidden units (``None``:
    the default). Sharded and in-memory runs are not checked."""
    from iostack.placement import load_placement

    if not io.placement or ds.features is None or not (Path(io.placement) / "placement.json").exists():
        return None
    available = available_now()
    if available is None:
        return None
    placement = load_placement(io.placement)
    row = placement.codec.row_bytes if placement.codec is not None else ds.row_bytes
    # node-shared reads (on by default with several local ranks) prepare batches on two threads
    # (training.pipeline.prefetch_workers; one on a GPU, where this reserves a batch too many)
    workers = 2 if ranks > 1 and io.node_shared_reads else 1
    reserve = training_reserve(GraphSizes.of(ds, stored_row_bytes=row), batch_size=sampling.batch_size,
                               fanouts=sampling.fanouts, prefetch=io.prefetch, workers=workers,
                               hidden=hidden or HIDDEN,
                               eval_batch_size=sampling.eval_batch_size)
    note = check_training_memory(host_cache_bytes(placement, row, gpu_bins_on_host=gpu_bins_on_host), reserve,
                                 available, ranks=ranks)
    if note is not None:
        log.warning("memory: %s", note)
    return note


#: ``moment train`` takes the memory available from this variable when set (a size, e.g. 2GiB):
#: for tests, and to check a placement against another machine's memory
MEMORY_LIMIT_ENV = "MOMENT_MEMORY_LIMIT"


def available_now(environ: Mapping[str, str] | None = None,
                  **paths: str | os.PathLike[str]) -> MemoryLimit | None:
    """The memory available to this job now (:func:`available_memory`), ``$MOMENT_MEMORY_LIMIT`` first;
    None where it cannot be told (logged: the check is advice, never a reason to stop)."""
    from momentbase.units import SizeError, parse_size

    text = (os.environ if environ is None else environ).get(MEMORY_LIMIT_ENV)
    override = None
    if text:
        try:
            override = parse_size(text)
        except SizeError as exc:
            log.warning("$%s: %s; checking against this machine's memory instead", MEMORY_LIMIT_ENV, exc)
    try:
        limit = available_memory(override, **paths)
    except MemoryPlanError as exc:
        log.debug("memory check skipped: %s", exc)
        return None
    if override is not None:
        return MemoryLimit(limit.bytes, f"${MEMORY_LIMIT_ENV}", text)
    return limit


def _read_number(path: Path) -> int | None:
    """A cgroup limit file: its number, or None for ``max``, an unset v1 limit, or no file."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text or text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if 0 < value < _NO_LIMIT else None


def read_cgroup_limit(proc_cgroup: str | os.PathLike[str] = "/proc/self/cgroup",
                      cgroup_root: str | os.PathLike[str] = "/sys/fs/cgroup") -> MemoryLimit | None:
    """The memory limit of this process's cgroup and its ancestors, or None where none applies.

    cgroup v2 (the ``0::`` line of ``proc_cgroup``): the smallest ``memory.max``
    or ``memory.high`` from the process's own cgroup up to the root; cgroup v1
    (the ``memory`` controller's line): ``memory.limit_in_bytes`` under
    ``<cgroup_root>/memory``. ``max`` (or v1's huge "unlimited") is no limit.
    In a container the own path may not exist under the mount (a cgroup
    namespace puts the container's cgroup at the mount's root): the root's
    files count then.
    """
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    found: list[MemoryLimit] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        controllers, rel = parts[1].split(","), parts[2].lstrip("/")
        if parts[0] == "0" and parts[1] == "":
            base, names = Path(cgroup_root), ("memory.max", "memory.high")
            if not (base / "cgroup.controllers").exists() and (base / "unified").is_dir():
                base = base / "unified"  # hybrid hierarchy: v2 mounted beside the v1 controllers
        elif "memory" in controllers:
            base, names = Path(cgroup_root) / "memory", ("memory.limit_in_bytes",)
        else:
            continue
        found += _limits_up(base, Path(rel), names)
    return min(found, key=lambda m: m.bytes) if found else None


def _limits_up(base: Path, rel: Path, names: Sequence[str]) -> list[MemoryLimit]:
    """The limits set in ``names`` from ``base/rel`` up to ``base`` (the parents' limits bind too)."""
    out = []
    d = rel
    while True:
        for name in names:
            value = _read_number(base / d / name)
            if value is not None:
                out.append(MemoryLimit(value, f"cgroup {name}", str(base / d / name)))
        if d == Path(".") or str(d) == "":
            return out
        d = d.parent


def read_mem_available(meminfo: str | os.PathLike[str] = "/proc/meminfo") -> MemoryLimit | None:
    """``MemAvailable`` of ``meminfo`` in bytes, or None where the file or the line is missing."""
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                kib = int(line.split()[1])
                return MemoryLimit(kib * 1024, "MemAvailable", str(meminfo))
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_memory(override: int | None = None, *, proc_cgroup: str | os.PathLike[str] = "/proc/self/cgroup",
                     cgroup_root: str | os.PathLike[str] = "/sys/fs/cgroup",
                     meminfo: str | os.PathLike[str] = "/proc/meminfo") -> MemoryLimit:
    """The memory this job may use: ``override`` (``--memory-limit``), else the smaller of cgroup and MemAvailable.

    Raises :class:`MemoryPlanError` when neither can be read (and no override):
    the fix is ``--memory-limit``.
    """
    if override is not None:
        return MemoryLimit(int(override), "--memory-limit", format_size(override))
    found = [m for m in (read_cgroup_limit(proc_cgroup, cgroup_root), read_mem_available(meminfo)) if m]
    if not found:
        raise MemoryPlanError(f"cannot tell the memory available: no cgroup limit and no MemAvailable in "
                              f"{meminfo}; give it with `memory_limit=SIZE`")
    return min(found, key=lambda m: m.bytes)


__all__ = [
    "CacheSizing",
    "check_host_memory",
    "cpu_cache_for",
    "GraphSizes",
    "MemoryLimit",
    "MemoryPlanError",
    "RUNTIME_BYTES",
    "TrainingReserve",
    "available_memory",
    "available_now",
    "batch_rows",
    "host_cache_bytes",
    "check_training_memory",
    "read_cgroup_limit",
    "read_mem_available",
    "size_cpu_cache",
    "training_reserve",
]
