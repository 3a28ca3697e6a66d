"""Feature-row placement for a dataset on a planned machine: plan targets -> DDAK bins -> iostack Placement.

The glue between the planner (which store should serve which share of the
reads: :attr:`planner.flow.FlowResult.store_bytes`), DDAK
(:mod:`planner.ddak`, which knows nothing of graphs) and the feature store
(:class:`iostack.placement.Placement`).

Bins from a plan (:func:`build_bins`):

* **GPU caches.** ``replicate`` (default): one logical GPU bin whose
  capacity is one GPU's cache; the trainers each hold a copy on their own
  device (``device="cuda"``), so it serves the plan's whole GPU-cache share
  with no interconnect traffic. ``partition``: one bin per GPU
  (``cuda:<i>``, the plan's GPUs in id order), the tier's target split
  equally, for GPUs joined by NVLink (refused without NVLink: a peer's cache
  would then be read over PCIe, through the sockets).
* **CPU caches.** One bin per host memory (NUMA node) of the plan, each of
  the given size, target the plan's bytes for that memory.
* **SSDs.** One bin per SSD of the plan, in id order, each with its own
  ``--ssd`` directory; the counts must match (the same directory may be
  given several times: the bin files have distinct names). Their capacity
  is "enough" (every row); :func:`check_free_space` checks the files fit.

A store with a zero target in the plan still gets its bin, with a target
of :data:`ZERO_TARGET_SHARE` of the total: it takes at most one pool of hot
rows while the targets are being met, then only the overflow.

The report (:class:`PlacementReport`) says what a placement does to the
reads: each bin's share of the hotness against its target, the SSDs'
share and bytes per epoch, and the cross-socket share of the bytes the GPUs
receive. Data-parallel GPUs each read the same distribution, so every bin's
traffic reaches every GPU; a byte crosses sockets when its bin sits on
another socket than the GPU reading it (GPU caches never: a replicated
cache is local, a partitioned one is reached over NVLink).

>>> t = PlanTargets("toy", gpus=(("gpu0", "socket0"),),
...     stores=(StoreTarget("cache:gpu0", "gpu", "gpu0", "socket0", 1.0),
...             StoreTarget("ssd0", "ssd", "ssd0", "socket0", 3.0)))
>>> bins = build_bins(t, num_rows=100, row_bytes=400, gpu_cache_bytes=4000, cpu_cache_bytes=0,
...                   ssd_dirs=["/tmp"], out_dir="/tmp")
>>> [(b.kind, b.capacity_rows, b.target_share) for b in bins]
[('gpu', 10, 0.25), ('ssd', 100, 0.75)]
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from iostack.bins import file_bytes_for
from iostack.placement import Bin, Placement
from planner.affinity import Affinity
from planner.baselines import hash_placement
from planner.handoff import (
    PlanHandoff,
    PlanTargets,
    StoreTarget,
)
from planner.placement import DdakBin, DdakResult
from planner.policies import place_items
from planner.progress import Progress
from training.errors import TrainingError
from training.vocab import GPU_MODES

if TYPE_CHECKING:
    from iostack.codec import FeatureCodec

#: target share given to a plan store whose target is 0 (DDAK needs positive targets)
ZERO_TARGET_SHARE = 1e-9

class PlacingError(TrainingError):
    """A placement request that cannot be honoured (the message names the input and the fix)."""


def cache_shares(hotness: np.ndarray, targets: PlanTargets, *, gpu_rows: int, cpu_rows: int,
                 gpu_mode: str = "replicate") -> tuple[float, float]:
    """The shares of the reads that caches of these sizes serve: ``(GPU cache, host memory)``.

    The GPU-cache share is what the ``gpu_rows`` hottest rows hold (``gpu_rows`` × GPUs
    with ``partition``); the host-memory share what the next ``cpu_rows`` × memories
    hold. Clipped below 1 so that some reads are left for the SSDs' tier to be
    planned at all.
    """
    from training.hotness import hot_share

    n_gpus = len(targets.gpus)
    n_mem = len(targets.of_kind("cpu"))
    g_rows = gpu_rows * (n_gpus if gpu_mode == "partition" else 1) if n_gpus else 0
    g_share, c_share = hot_share(hotness, [g_rows, cpu_rows * n_mem])
    g_share = min(g_share, 0.999)
    c_share = min(c_share, 0.999 - g_share) if n_mem else 0.0
    return float(g_share), float(c_share)


def targets_for_caches(handoff: PlanHandoff, hotness: np.ndarray, *, gpu_rows: int, cpu_rows: int,
                       gpu_mode: str = "replicate") -> tuple[PlanTargets, str | None]:
    """The plan's targets for the caches really given (see :meth:`PlanHandoff.resolve`), and a note
    when they had to be solved again."""
    g, c = cache_shares(hotness, handoff.targets, gpu_rows=gpu_rows, cpu_rows=cpu_rows, gpu_mode=gpu_mode)
    return handoff.resolve(g, c)


def plan_now(topology, *, spec: str | None = None, model: str = "maxflow", nvlink_pairs=(),
             unknown_link_bytes_per_s: float | None = None, capacities=None, source: str = "") -> PlanHandoff:
    """The hand-off of a plan made now, exactly as ``moment plan`` makes it by default (demand 1 GB per
    GPU, cache shares 0), through the plan file's form: the placement made from it equals the one made
    from ``moment plan --json`` output."""
    import json

    from planner.handoff import handoff_from_plan, plan_file_dict, read_plan_file
    from planner.plan import choose_inventory, measured_inventory, plan
    from planner.workload import Demand

    topo, inventory = choose_inventory(topology, spec=spec)
    if capacities is not None:
        inventory, _ = measured_inventory(inventory, capacities)
    result = plan(topo, inventory, Demand(1e9), model=model, top=1, nvlink_pairs=nvlink_pairs,
                  unknown_link_bytes_per_s=unknown_link_bytes_per_s)
    h = handoff_from_plan(result, unknown_link_bytes_per_s=unknown_link_bytes_per_s)
    return read_plan_file(json.loads(json.dumps(plan_file_dict(h))),
                          source=source or f"a plan of {result.machine} made now")


# --- bins --------------------------------------------------------------------------------


@dataclass(frozen=True)
class BinPlan:
    """One bin to fill: kind, capacity (rows), target (share of all reads), where it lives.

    ``device`` is what :class:`iostack.placement.Bin` records (``cuda``,
    ``cuda:1``, ``numa0``, ``ssd3``); ``path`` the SSD bin file (absolute, or
    relative to the output directory); ``stores`` the plan stores it stands for.
    """

    kind: str
    capacity_rows: int
    target_share: float
    device: str
    socket: str | None
    path: str | None = None
    stores: tuple[str, ...] = ()


def ssd_bin_path(ssd_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], name: str) -> str:
    """``name`` under ``ssd_dir``: relative when ``ssd_dir`` is ``out_dir`` (the placement moves with it)."""
    d = Path(ssd_dir).resolve()
    return name if d == Path(out_dir).resolve() else str(d / name)


def build_bins(targets: PlanTargets, *, num_rows: int, row_bytes: int, gpu_cache_bytes: int,
               cpu_cache_bytes: int, ssd_dirs: Sequence[str | os.PathLike[str]],
               out_dir: str | os.PathLike[str], gpu_mode: str = "replicate") -> list[BinPlan]:
    """The bins of a plan (see the module docstring); caches in bytes, per GPU and per host memory.

    Raises :class:`PlacingError` for an SSD count that differs from the
    plan's, ``partition`` without NVLink, no room for every row.
    """
    if gpu_mode not in GPU_MODES:
        raise PlacingError(f"GPU cache mode {gpu_mode!r}: expected one of {', '.join(GPU_MODES)}")
    if row_bytes <= 0:
        raise PlacingError("the dataset has no feature rows to place (row size 0); import it with features")
    total = sum(max(0.0, s.target_bytes) for s in targets.stores)
    if total <= 0:
        raise PlacingError(f"{targets.source}: the plan's stores serve no bytes; re-run the plan")

    def share(stores: Sequence[StoreTarget]) -> float:
        return max(sum(s.target_bytes for s in stores) / total, ZERO_TARGET_SHARE)

    bins: list[BinPlan] = []
    gpu_rows = gpu_cache_bytes // row_bytes
    caches = targets.of_kind("gpu")
    if gpu_rows > 0:
        if not targets.gpus:
            raise PlacingError(f"{targets.source}: a GPU cache was asked for, but the plan has no GPU")
        if gpu_mode == "replicate":
            bins.append(BinPlan("gpu", gpu_rows, share(caches), "cuda", None, stores=tuple(s.id for s in caches)))
        else:
            if not targets.nvlink_joins_all_gpus():
                raise PlacingError(
                    f"{targets.source}: partitioned GPU caches need NVLink between the GPUs, and "
                    f"{'there is one GPU' if len(targets.gpus) < 2 else 'the plan has none joining them all'}; "
                    "use the default `gpu_mode` replicate")
            each = share(caches) / len(targets.gpus)
            for i, (g, sock) in enumerate(targets.gpus):
                bins.append(BinPlan("gpu", gpu_rows, max(each, ZERO_TARGET_SHARE), f"cuda:{i}", sock,
                                    stores=tuple(s.id for s in caches if s.node == g)))
    cpu_rows = cpu_cache_bytes // row_bytes
    if cpu_rows > 0:
        mems = targets.of_kind("cpu")
        if not mems:
            raise PlacingError(f"{targets.source}: a CPU cache was asked for, but the plan names no host memory")
        for s in mems:
            dev = f"numa{s.numa_node}" if s.numa_node is not None else s.node
            bins.append(BinPlan("cpu", cpu_rows, share([s]), dev, s.socket, stores=(s.id,)))
    ssds = targets.of_kind("ssd")
    if len(ssd_dirs) != len(ssds):
        raise PlacingError(
            f"{len(ssd_dirs)} `ssd_dirs` path(s) given, the plan ({targets.source}) has {len(ssds)} SSD(s): "
            f"give one `ssd_dirs` per SSD, in the order {', '.join(s.id for s in ssds) or '(none)'} "
            "(a directory may be repeated)")
    first = len(bins)
    for i, (s, d) in enumerate(zip(ssds, ssd_dirs, strict=True)):
        name = f"bin{first + i}-{s.id}.dat"
        if Path(d).resolve() != Path(out_dir).resolve():
            # placements sharing SSD directories must not collide: the name carries a digest of
            # the placement's full path (two placements both called "pl" stay apart)
            where = Path(out_dir).resolve()
            digest = hashlib.sha1(str(where).encode()).hexdigest()[:8]
            name = f"{where.name}-{digest}-{name}"
        path = ssd_bin_path(d, out_dir, name)
        bins.append(BinPlan("ssd", num_rows, share([s]), s.node, s.socket, path, (s.id,)))
    room = sum(b.capacity_rows for b in bins)
    if room < num_rows:
        raise PlacingError(f"the caches hold {room} of {num_rows} rows and the plan has no SSD for the rest; "
                           "plan with SSDs or give larger `gpu_cache_bytes` / `cpu_cache_bytes`")
    return bins


# --- placing -----------------------------------------------------------------------------


@dataclass(frozen=True)
class BinReport:
    """What one bin serves: rows, its share of the reads against its target (shares of all reads)."""

    id: int
    kind: str
    device: str
    socket: str | None
    rows: int
    capacity_rows: int
    traffic_share: float
    target_share: float

    @property
    def deviation(self) -> float:
        """``|traffic - target| / target``."""
        return abs(self.traffic_share - self.target_share) / self.target_share


@dataclass(frozen=True)
class PlacementReport:
    """A placement's expected effect on the reads.

    ``max_relative_deviation`` over the bins whose target is not the
    zero-target stand-in; ``ssd_share`` the share of reads the SSD bins
    serve; ``ssd_bytes_per_epoch`` those reads in bytes per epoch (``None``
    when the hotness is not a read count, e.g. degree or PageRank);
    ``cross_socket_share`` the share of the bytes delivered to the GPUs that
    cross sockets; ``seconds`` the time the placer took. ``socket_reads``:
    ``(reader socket, bin socket, share of all reads)`` for every pair with
    reads (a GPU cache counts on the reader's socket: it is local), from the
    reads per socket when :func:`place` had them, else every GPU reading alike.
    """

    strategy: str
    bins: tuple[BinReport, ...]
    max_relative_deviation: float
    ssd_share: float
    ssd_bytes_per_epoch: float | None
    cross_socket_share: float
    seconds: float
    socket_reads: tuple[tuple[str | None, str | None, float], ...] = ()


def reader_sockets(targets: PlanTargets) -> tuple[str | None, ...]:
    """The GPUs' sockets, each once, in the order of the plan's GPUs (the reader groups of a placement)."""
    return tuple(dict.fromkeys(s for _, s in targets.gpus))


def bin_split(targets: PlanTargets, bins: Sequence[BinPlan]) -> np.ndarray:
    """How the plan routes each bin's bytes to the readers' sockets: ``(len(bins), len(reader_sockets))``.

    Sums the ``bytes_by_socket`` of the plan stores a bin stands for (the
    flow solution's routing); a bin whose stores have none (no target)
    splits like the GPUs over the sockets. Rows sum to 1.
    """
    socks = list(reader_sockets(targets))
    gpus_per = np.array([sum(1 for _, s in targets.gpus if s == k) for k in socks], dtype=np.float64)
    by_id = {s.id: s for s in targets.stores}
    out = np.zeros((len(bins), len(socks)))
    for j, b in enumerate(bins):
        for sid in b.stores:
            for k, v in by_id[sid].bytes_by_socket if sid in by_id else ():
                if k in socks:
                    out[j, socks.index(k)] += v
        if out[j].sum() <= 0:
            out[j] = gpus_per
    return out / out.sum(axis=1, keepdims=True)


def socket_reads(result: DdakResult, bins: Sequence[BinPlan], targets: PlanTargets,
                 group_reads: np.ndarray | None = None) -> np.ndarray:
    """Reads by (reader socket, bin): ``(len(reader_sockets), len(bins))``, shares of all reads.

    ``group_reads`` (``[num_rows, len(reader_sockets)]``) are the reads of
    each socket's GPUs; without them every GPU reads the bins' traffic alike
    (data-parallel training: each rank takes a random part of every batch).
    """
    socks = list(reader_sockets(targets))
    m = len(bins)
    if group_reads is None:
        traffic = np.asarray(result.traffic_per_bin, dtype=np.float64)
        per = np.array([sum(1 for _, s in targets.gpus if s == k) for k in socks], dtype=np.float64)
        out = np.outer(per / per.sum(), traffic)
    else:
        out = np.stack([np.bincount(result.bin_of, weights=group_reads[:, g], minlength=m)
                        for g in range(len(socks))])
    total = out.sum()
    return out / total if total > 0 else out


def report_for(result: DdakResult, bins: Sequence[BinPlan], targets: PlanTargets, *, strategy: str,
               row_bytes: int, reads_per_epoch: float | None, seconds: float = 0.0,
               group_reads: np.ndarray | None = None) -> PlacementReport:
    """The :class:`PlacementReport` of ``result`` (``reads_per_epoch``: all reads of an epoch, or ``None``;
    ``group_reads``: reads per socket, see :func:`socket_reads`)."""
    traffic = np.asarray(result.traffic_per_bin, dtype=np.float64)
    total = float(traffic.sum())
    shares = traffic / total if total > 0 else np.zeros_like(traffic)
    # targets renormalised over the bins there are (a plan store without a bin, e.g. host
    # memory with no CPU cache, leaves its share to the others), as DDAK sees them
    t_sum = sum(b.target_share for b in bins)
    reports = tuple(BinReport(i, b.kind, b.device, b.socket, int(result.items_per_bin[i]), b.capacity_rows,
                              float(shares[i]), b.target_share / t_sum) for i, b in enumerate(bins))
    real = [r for r, b in zip(reports, bins, strict=True) if b.target_share > ZERO_TARGET_SHARE]
    dev = max((r.deviation for r in real), default=0.0) if total > 0 else 0.0
    ssd = float(sum(r.traffic_share for r in reports if r.kind == "ssd"))
    cross = 0.0
    pairs: dict[tuple[str | None, str | None], float] = {}
    if targets.gpus:
        by = socket_reads(result, bins, targets, group_reads)
        for g, gsock in enumerate(reader_sockets(targets)):
            for j, b in enumerate(bins):
                where = gsock if b.kind == "gpu" else b.socket  # a GPU cache is on the reader's side
                pairs[(gsock, where)] = pairs.get((gsock, where), 0.0) + float(by[g, j])
                if where is not None and gsock is not None and where != gsock:
                    cross += float(by[g, j])
    ssd_bytes = ssd * reads_per_epoch * row_bytes if reads_per_epoch is not None else None
    return PlacementReport(strategy, reports, float(dev), ssd, ssd_bytes, float(cross), seconds,
                           tuple((a, b, v) for (a, b), v in pairs.items() if v > 0))


@dataclass(frozen=True)
class PlaceResult:
    """A placement with its report, and the hash baseline's report on the same input."""

    placement: Placement
    bins: tuple[BinPlan, ...]
    report: PlacementReport
    baseline: PlacementReport | None
    #: where the plan's targets were more than the caches can serve (see :func:`feasible_targets`)
    notes: tuple[str, ...] = ()


def _top_sums(h: np.ndarray, ks: Sequence[int]) -> np.ndarray:
    """Sum of the ``k`` largest values of ``h`` for each ``k`` in ``ks`` (float64).

    One ``np.partition`` at the few cut points instead of a full sort: O(n) time, one copy.
    """
    n = h.size
    cuts = sorted({n - k for k in ks if 0 < k < n})
    part = np.partition(h, cuts) if cuts else h
    return np.array([float(part[n - k:].sum(dtype=np.float64)) if k > 0 else 0.0 for k in ks])


def feasible_targets(hotness: np.ndarray, bins: Sequence[BinPlan]) -> tuple[list[BinPlan], list[str]]:
    """``bins`` with each cache bin's target capped at what its capacity can serve, and why.

    A flow model does not know how many rows each store holds: ``maxflow`` may
    ask one host memory for the whole host-memory share although it holds
    half the rows that share needs. Tier by tier (GPU, then CPU), bins taken
    in order of falling target, each bin's target is capped at the hotness of
    the hottest rows it could hold (its capacity, after the rows the bins
    before it took); what it cannot serve passes to the next bin of the tier,
    and what the tier cannot serve to the SSD bins, in proportion to their
    targets. Shares stay shares of all reads; targets that fit are unchanged.

    >>> b = [BinPlan("cpu", 2, 0.6, "numa0", "s0"), BinPlan("cpu", 2, 0.0, "numa1", "s1"),
    ...      BinPlan("ssd", 8, 0.4, "ssd0", "s0", "b.dat")]
    >>> fixed, why = feasible_targets(np.array([4, 3, 1, 1, 1, 0, 0, 0], np.float32), b)
    >>> [round(x.target_share, 2) for x in fixed]
    [0.6, 0.0, 0.4]
    >>> fixed, why = feasible_targets(np.array([3, 2, 2, 1, 1, 1, 0, 0], np.float32), b)
    >>> [round(x.target_share, 2) for x in fixed], len(why)
    ([0.5, 0.1, 0.4], 1)
    """
    h = np.asarray(hotness)
    total = float(h.sum(dtype=np.float64))
    out, notes = list(bins), []
    if total <= 0 or not any(b.kind in ("gpu", "cpu") for b in bins):
        return out, notes
    t_sum = sum(b.target_share for b in bins) or 1.0
    visit = []  # cache bins in the order they take the hottest rows
    for tier in ("gpu", "cpu"):
        idx = sorted((i for i, b in enumerate(out) if b.kind == tier), key=lambda i: -out[i].target_share)
        if tier == "gpu" and idx and out[idx[0]].device == "cuda":
            idx = idx[:1]  # a replicated cache: one copy of the hottest rows
        visit += idx
    ends = np.minimum(h.size, np.cumsum([out[i].capacity_rows for i in visit])).tolist()
    held = _top_sums(h, ends) / total  # share of the reads the k hottest rows serve, k = each end
    prev, spill = 0.0, 0.0
    for i, upto in zip(visit, held, strict=True):
        b = out[i]
        want = b.target_share / t_sum + spill
        can = float(upto - prev)
        got = min(want, can)
        if want > can * (1 + 1e-9) and b.target_share / t_sum > ZERO_TARGET_SHARE:
            notes.append(f"{b.kind} bin {b.device}: the plan asks {b.target_share / t_sum:.2%} of reads"
                         + (f" (+{spill:.2%} passed on)" if spill > 0 else "")
                         + f", its {b.capacity_rows:,} rows can serve {can:.2%}")
        spill = want - got
        out[i] = replace(b, target_share=max(got * t_sum, ZERO_TARGET_SHARE))
        prev = float(upto)
    if spill > 1e-9:
        ssd = [i for i, b in enumerate(out) if b.kind == "ssd"]
        s_sum = sum(out[i].target_share for i in ssd) or 1.0
        for i in ssd:
            out[i] = replace(out[i], target_share=out[i].target_share * (1 + spill * t_sum / s_sum))
        notes.append(f"the caches cannot serve {spill:.2%} of the reads the plan gave them: the SSDs take it")
    return out, notes


def default_pool(num_rows: int, num_bins: int) -> int:
    """The paper's pool of 100 rows, smaller for small inputs: at least 100 pools per bin.

    A bin's traffic can only move in whole pools, so with a few thousand rows
    (Cora) pools of 100 would leave every bin tens of percent off target.

    >>> default_pool(10**9, 10), default_pool(2708, 11)
    (100, 2)
    """
    return max(1, min(100, num_rows // (100 * max(1, num_bins))))


def place(hotness: np.ndarray, bins: Sequence[BinPlan], targets: PlanTargets, *, row_bytes: int,
          strategy: str = "ddak", pool: int | None = None, seed: int = 0, reads_per_epoch: float | None = None,
          baseline: bool = True, codec: FeatureCodec | None = None, progress: Progress | None = None,
          group_reads: np.ndarray | None = None) -> PlaceResult:
    """Place every row: ``hotness`` (``[num_rows]``, any non-negative numbers) into ``bins``.

    ``pool``: DDAK's pool size; ``None`` takes :func:`default_pool`.
    ``row_bytes``: a row as the bins hold it (``codec.row_bytes`` for a
    :class:`iostack.codec.FeatureCodec`, which the placement then carries).
    ``progress``: DDAK's stages (:func:`planner.ddak.ddak`).
    ``group_reads`` (``[num_rows, len(reader_sockets(targets))]``): each
    row's reads by the GPUs of each socket; with two or more sockets DDAK
    puts rows on the bins the plan routes to their readers' socket
    (:class:`planner.affinity.Affinity` with :func:`bin_split`), and the reports
    count cross-socket reads from them.

    Returns the iostack :class:`Placement` (SSD bins' capacity = the rows
    they got, the size of their file) with the report, and the hash
    baseline's report on the same bins and hotness (``baseline=False``: none).
    """
    h = np.asarray(hotness)
    if h.dtype != np.float32:
        h = h.astype(np.float32)  # DDAK's fast path; counts stay exact up to 2**24
    bins, notes = feasible_targets(h, bins)
    dbins = [DdakBin(f"bin{i}", b.kind, b.capacity_rows, b.target_share) for i, b in enumerate(bins)]
    if pool is None:
        pool = default_pool(h.size, len(dbins))
    affinity = None
    if group_reads is not None:
        group_reads = np.asarray(group_reads, dtype=np.float32)
        if group_reads.shape != (h.size, len(reader_sockets(targets))):
            raise PlacingError(f"reads per socket: expected shape ({h.size}, {len(reader_sockets(targets))}), "
                               f"got {group_reads.shape}")
        if group_reads.shape[1] > 1:
            affinity = Affinity(group_reads, bin_split(targets, bins))
    t = time.perf_counter()
    result = place_items(strategy, h, dbins, pool=pool, seed=seed, progress=progress, affinity=affinity)
    sec = time.perf_counter() - t
    rep = report_for(result, bins, targets, strategy=strategy, row_bytes=row_bytes,
                     reads_per_epoch=reads_per_epoch, seconds=sec, group_reads=group_reads)
    base = None
    if baseline:
        t = time.perf_counter()
        hashed = hash_placement(h, dbins) if strategy != "hash" else result
        base = report_for(hashed, bins, targets, strategy="hash", row_bytes=row_bytes,
                          reads_per_epoch=reads_per_epoch, seconds=time.perf_counter() - t,
                          group_reads=group_reads)
        del hashed
    items = result.items_per_bin
    ibins = tuple(Bin(i, b.kind, int(items[i]) if b.kind == "ssd" else b.capacity_rows, path=b.path,
                      device=b.device) for i, b in enumerate(bins))
    placement = Placement(ibins, result.bin_of, result.row_of, codec=codec)
    return PlaceResult(placement, tuple(bins), rep, base, tuple(notes))


def expected_shares(bin_of: np.ndarray, hotness: np.ndarray, num_bins: int) -> list[float]:
    """Each bin's share of the reads under ``hotness`` (``[num_rows]``), for rows placed by ``bin_of``.

    With a hotness the placement was *not* fitted to (an independent pre-sample), this is an
    unbiased estimate of what training will read from each bin: DDAK fitted to one sample
    puts the rows that happened to be hot in it into the caches, and a new epoch reads them
    less often (on a skewed graph with 4 KiB rows here, the in-sample SSD share was 11-21% below
    what training read; python tools/bench_loop.py).

    >>> expected_shares(np.array([0, 1, 1]), np.array([2.0, 1.0, 1.0]), 3)
    [0.5, 0.5, 0.0]
    """
    w = np.bincount(np.asarray(bin_of, np.int64), weights=np.asarray(hotness, np.float64), minlength=num_bins)
    total = float(w.sum())
    return [float(x) / total if total > 0 else 0.0 for x in w[:num_bins]]


def check_free_space(placement: Placement, row_bytes: int, out_dir: str | os.PathLike[str]) -> None:
    """Raise :class:`PlacingError` if the SSD bin files will not fit their file systems.

    Sums the files per file system (bins in one directory, or several on
    one device, share its free space); existing files of the same names
    count as free (they are replaced).
    """
    need: dict[int, list] = {}
    for b in placement.bins:
        if b.kind != "ssd" or b.path is None:
            continue
        p = Path(b.path) if Path(b.path).is_absolute() else Path(out_dir) / b.path
        d = p.parent
        d.mkdir(parents=True, exist_ok=True)
        dev = os.stat(d).st_dev
        entry = need.setdefault(dev, [d, 0, 0])
        entry[1] += file_bytes_for(int(b.capacity_rows), row_bytes)
        entry[2] += p.stat().st_size if p.exists() else 0
    for d, nbytes, old in need.values():
        free = shutil.disk_usage(d).free + old
        if nbytes > free:
            raise PlacingError(f"{d}: the SSD bins need {nbytes / 1e9:.2f} GB, the file system has "
                               f"{free / 1e9:.2f} GB free; free space or give more `ssd_dirs` directories")


__all__ = [
    "BinPlan", "BinReport", "PlaceResult", "PlacementReport",
    "PlacingError", "bin_split", "build_bins", "cache_shares", "check_free_space",
    "expected_shares", "place", "plan_now", "reader_sockets", "report_for", "socket_reads",
    "ssd_bin_path", "targets_for_caches"
]
