"""The bins of a plan: the plan's traffic targets (for the caches given) -> the bins a policy fills.

The glue between the planner (which store should serve which share of the
reads: :attr:`planner.flow.FlowResult.store_bytes`) and the placement policy
(:mod:`training.place.policy`, DDAK or a baseline, which knows nothing of
plans): the bins, their capacities and targets, the targets capped at what
the caches can serve (:func:`feasible_targets`), the room the SSD bins need
(:func:`check_free_space`).

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
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from iostack.bins import file_bytes_for
from iostack.placement import Placement
from planner.handoff import PlanHandoff, PlanTargets, StoreTarget
from training.errors import TrainingError
from training.vocab import GPU_MODES

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


def _top_sums(h: np.ndarray, ks: Sequence[int]) -> np.ndarray:
    """Sum of the ``k`` largest values of ``h`` for each ``k`` in ``ks`` (float64).

    One ``np.partition`` at the few cut points instead of a full sort: O(n) time, one copy.
    """
    n = h.size
    cuts = sorted({n - k for k in ks if 0 < k < n})
    part = np.partition(h, cuts) if cuts else h
    return np.array([float(part[n - k:].sum(dtype=np.float64)) if k > 0 else 0.0 for k in ks])


def _held(h: np.ndarray, ends: Sequence[int], size: np.ndarray | None) -> np.ndarray:
    """Share of all reads (of all bytes read, with ``size``) the hottest rows up to each end serve.

    ``ends``: rows, or with ``size`` (each row's bytes) bytes: the hottest rows, hottest first, that
    fit in them.
    """
    if size is None:
        return _top_sums(h, [min(h.size, e) for e in ends]) / float(h.sum(dtype=np.float64))
    order = np.argsort(-h.astype(np.float64), kind="stable")
    cum_bytes = np.cumsum(size[order])
    cum_read = np.cumsum(h[order].astype(np.float64) * size[order])
    k = np.searchsorted(cum_bytes, np.asarray(ends, dtype=np.int64), side="right")
    return np.where(k > 0, cum_read[np.maximum(k, 1) - 1], 0.0) / float(cum_read[-1])


def feasible_targets(hotness: np.ndarray, bins: Sequence[BinPlan],
                     item_size: np.ndarray | None = None) -> tuple[list[BinPlan], list[str]]:
    """``bins`` with each cache bin's target capped at what its capacity can serve, and why.

    ``item_size`` (each row's bytes, ``[num_rows]``): capacities are bytes and targets shares of
    the bytes read (rows of several widths: :func:`training.hetero.place.place_hetero`).

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
    out, notes = list(bins), list[str]()
    if total <= 0 or not any(b.kind in ("gpu", "cpu") for b in bins):
        return out, notes
    t_sum = sum(b.target_share for b in bins) or 1.0
    visit = []  # cache bins in the order they take the hottest rows
    for tier in ("gpu", "cpu"):
        idx = sorted((i for i, b in enumerate(out) if b.kind == tier), key=lambda i: -out[i].target_share)
        if tier == "gpu" and idx and out[idx[0]].device == "cuda":
            idx = idx[:1]  # a replicated cache: one copy of the hottest rows
        visit += idx
    ends = np.cumsum([out[i].capacity_rows for i in visit]).tolist()
    held = _held(h, ends, item_size)  # share of the reads the hottest rows up to each end serve
    prev, spill = 0.0, 0.0
    for i, upto in zip(visit, held, strict=True):
        b = out[i]
        want = b.target_share / t_sum + spill
        can = float(upto - prev)
        got = min(want, can)
        if want > can * (1 + 1e-9) and b.target_share / t_sum > ZERO_TARGET_SHARE:
            notes.append(f"{b.kind} bin {b.device}: the plan asks {b.target_share / t_sum:.2%} of reads"
                         + (f" (+{spill:.2%} passed on)" if spill > 0 else "")
                         + f", its {b.capacity_rows:,} {'rows' if item_size is None else 'bytes'} can serve "
                         f"{can:.2%}")
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


def check_free_space(placement: Placement, row_bytes: int, out_dir: str | os.PathLike[str], *,
                     keep_existing: bool = False) -> None:
    """Raise :class:`PlacingError` if the SSD bin files will not fit their file systems.

    Sums the files per file system (bins in one directory, or several on
    one device, share its free space); existing files of the same names
    count as free (they are replaced), unless ``keep_existing``: the new
    files are written beside them first (a placement replaced whole).
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
        entry[2] += p.stat().st_size if p.exists() and not keep_existing else 0
    for d, nbytes, old in need.values():
        free = shutil.disk_usage(d).free + old
        if nbytes > free:
            raise PlacingError(f"{d}: the SSD bins need {nbytes / 1e9:.2f} GB, the file system has "
                               f"{free / 1e9:.2f} GB free; free space or give more `ssd_dirs` directories")


__all__ = [
    "ZERO_TARGET_SHARE", "BinPlan", "PlacingError", "bin_split", "build_bins", "cache_shares",
    "check_free_space", "feasible_targets", "reader_sockets", "ssd_bin_path", "targets_for_caches",
]
