"""DDAK over the feature rows of every node type: one hotness, bins shared across types, byte budgets.

A heterogeneous dataset (:mod:`training.hetero.store`) keeps one feature table per node type,
each of its own width and dtype (ogbn-mag: papers 128 float32, the rest featureless; the
synthetic MAG: 64-, 16- and 4-byte rows). Its rows are placed together: the items are the rows
of every featured type (featureless types have no rows to place: the model learns their
embeddings), each sized by its type's row bytes, and :func:`planner.ddak.ddak` with
``item_size`` fills the plan's bins, whose capacities are bytes. So a paper row and an author row
compete for the GPU by how often training reads them, and a cache of ``B`` bytes holds ``B``
bytes of rows whatever their widths.

The bins are then stored as **per-type sub-bins**: bin ``j`` holds, for each type ``t``, a
homogeneous bin of ``t``'s rows in ``t``'s width and dtype (an SSD bin is one file per type,
``<bin file stem>-<type>.dat``). Each type is then an ordinary :class:`iostack.placement.Placement`
over its local ids, opened by the ordinary :class:`iostack.store.FeatureStore`
(:mod:`training.hetero.tiered`). Chosen over one file per bin with per-row byte offsets: the
SSD reads keep their fixed stride (a row's offset is ``row × stride``, which the page-aligned
layout of :mod:`iostack.bins` and O_DIRECT reads rely on), a gather of one type returns that
type's dtype with no reinterpretation of bytes, and no offset table (8 bytes a row: twice an
institution row of ogbn-mag-like 4-byte rows) is held. The bytes a bin holds are the sum of its
sub-bins', so the byte budget DDAK kept is what the tiers hold.

The baseline ``padded`` places every row as if it had the widest type's bytes, which is what
one table padded to the widest row (the homogeneous path) would do: the caches hold fewer rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from iostack.placement import Bin, Placement
from planner.ddak import ddak
from planner.handoff import PlanTargets
from planner.placement import DdakBin, DdakResult
from planner.progress import Progress
from training.hetero.store import HeteroDataset
from training.place.bins import BinPlan, PlacingError, feasible_targets
from training.place.policy import default_pool

#: how rows are sized for DDAK: their own bytes, or every row the widest type's bytes
SIZINGS = ("bytes", "padded")


@dataclass(frozen=True)
class TypedRows:
    """The rows to place: each featured type's rows as consecutive items, in schema order.

    ``types``: the featured types; ``offset`` their first global id; ``start`` their first item;
    ``count`` their rows; ``row_bytes`` a row's bytes; ``item_type`` (int16, ``[items]``) each
    item's index into ``types``.
    """

    types: tuple[str, ...]
    offset: tuple[int, ...]
    start: tuple[int, ...]
    count: tuple[int, ...]
    row_bytes: tuple[int, ...]
    item_type: np.ndarray

    @property
    def num_items(self) -> int:
        return int(self.item_type.shape[0])

    def sizes(self, sizing: str = "bytes") -> np.ndarray:
        """Each item's size in bytes (int64, ``[items]``): its own row, or the widest (``padded``)."""
        rb = np.array(self.row_bytes, dtype=np.int64)
        if sizing == "padded":
            return np.full(self.num_items, int(rb.max()), dtype=np.int64)
        return rb[self.item_type]

    def item_hotness(self, hotness: np.ndarray) -> np.ndarray:
        """The global ``[num_nodes]`` hotness restricted to the items (float32, ``[items]``)."""
        h = np.asarray(hotness)
        return np.concatenate([h[o:o + c] for o, c in zip(self.offset, self.count, strict=True)]).astype(np.float32)


def typed_rows(data: HeteroDataset) -> TypedRows:
    """The featured types of ``data`` as :class:`TypedRows`.

    Raises
    ------
    PlacingError
        No node type has features.
    """
    feat = [t for t in data.schema.node_types if t.feature_dim]
    if not feat:
        raise PlacingError(f"`dataset` {data.base.path}: no node type has features to place")
    counts = [t.count for t in feat]
    return TypedRows(tuple(t.name for t in feat), tuple(t.offset for t in feat),
                     tuple(int(s) for s in np.cumsum([0, *counts[:-1]])), tuple(counts),
                     tuple(int(t.feature_dim) * np.dtype(str(t.feature_dtype)).itemsize for t in feat),
                     np.repeat(np.arange(len(feat), dtype=np.int16), counts))


def byte_cache_shares(h: np.ndarray, size: np.ndarray, targets: PlanTargets, *, gpu_bytes: int, cpu_bytes: int,
                      gpu_mode: str = "replicate") -> tuple[float, float]:
    """The shares of the bytes read that caches of these sizes hold: ``(GPU cache, host memory)``.

    :func:`training.place.bins.cache_shares` counted in bytes: the hottest rows that fit in
    ``gpu_bytes`` (× GPUs with ``partition``), then in ``cpu_bytes`` × host memories; each row
    weighs its hotness × its bytes. Clipped below 1 as there, so the SSDs keep a share.
    """
    n_gpus, n_mem = len(targets.gpus), len(targets.of_kind("cpu"))
    g_bytes = gpu_bytes * (n_gpus if gpu_mode == "partition" else 1) if n_gpus else 0
    order = np.argsort(-h.astype(np.float64), kind="stable")
    cum_bytes = np.cumsum(size[order])
    cum_read = np.cumsum(h[order].astype(np.float64) * size[order])
    total = float(cum_read[-1]) if cum_read.size else 0.0
    if total <= 0:
        return 0.0, 0.0

    def held(b: int) -> float:
        k = int(np.searchsorted(cum_bytes, b, side="right"))
        return float(cum_read[k - 1]) / total if k else 0.0

    g = min(held(g_bytes), 0.999)
    c = min(held(g_bytes + cpu_bytes * n_mem) - held(g_bytes), 0.999 - g) if n_mem else 0.0
    return g, max(c, 0.0)


@dataclass(frozen=True)
class HeteroPlaceResult:
    """A placement of every type's rows: the shared bins, DDAK's result, each type's sub-placement.

    ``bins``: the plan's bins (capacity in bytes); ``result``: DDAK's over the items of
    ``rows``; ``placements``: each type's :class:`Placement` over its local ids (bin ``j`` of it
    is bin ``j``'s sub-bin of that type; SSD paths carry the type); ``bytes_per_bin``
    (int64, ``[bins]``): the row bytes each bin holds; ``item_reads``: the hotness it was
    placed by, per item (float32, ``[items]``).
    """

    bins: tuple[BinPlan, ...]
    rows: TypedRows
    result: DdakResult
    placements: dict[str, Placement]
    bytes_per_bin: np.ndarray
    item_reads: np.ndarray
    sizing: str
    #: where the plan's cache targets were more than the caches can serve (:func:`feasible_targets`)
    notes: tuple[str, ...] = ()


def sub_bin_path(path: str, node_type: str) -> str:
    """The SSD file of ``node_type``'s rows of the bin whose file is ``path``.

    >>> sub_bin_path("/mnt/nvme0/bin3-ssd0.dat", "paper")
    '/mnt/nvme0/bin3-ssd0-paper.dat'
    """
    p = Path(path)
    return str(p.with_name(f"{p.stem}-{node_type}{p.suffix}"))


def place_hetero(data: HeteroDataset, hotness: np.ndarray, bins: Sequence[BinPlan], *, pool: int | None = None,
                 sizing: str = "bytes", progress: Progress | None = None) -> HeteroPlaceResult:
    """Place the rows of every featured type of ``data`` into ``bins`` (capacities in bytes) by one hotness.

    ``hotness``: ``[num_nodes]`` over global ids (:func:`training.hetero.hotness.hetero_presample_counts`);
    ``sizing``: ``bytes`` (each row its own bytes) or ``padded`` (every row the widest type's:
    the baseline of one padded table). ``pool``: DDAK's (default :func:`default_pool`).

    Raises
    ------
    PlacingError
        ``hotness`` is not one value per node, or ``sizing`` is unknown.
    PlannerError
        The bins cannot hold the rows (from :func:`planner.ddak.ddak`).
    """
    if sizing not in SIZINGS:
        raise PlacingError(f"`sizing` {sizing!r}: expected one of {', '.join(SIZINGS)}")
    if np.shape(hotness) != (data.schema.num_nodes,):
        raise PlacingError(f"`hotness`: expected shape ({data.schema.num_nodes},), got {np.shape(hotness)}")
    rows = typed_rows(data)
    h, size = rows.item_hotness(hotness), rows.sizes(sizing)
    # the flow model does not know what the caches can hold: each cache target capped at what the
    # hottest rows that fit in its bytes serve, the rest passed on (as for one row size)
    bins, notes = feasible_targets(h, bins, size)
    dbins = [DdakBin(f"bin{i}", b.kind, b.capacity_rows, b.target_share) for i, b in enumerate(bins)]
    res = ddak(h, dbins, pool=pool or default_pool(h.size, len(dbins)), item_size=size, progress=progress)
    m = len(bins)
    placements = {}
    for i, t in enumerate(rows.types):
        a, c = rows.start[i], rows.count[i]
        bin_of = res.bin_of[a:a + c]
        # a type's rows of bin j, in the bin's row order (hottest first), numbered 0..k-1
        order = np.lexsort((res.row_of[a:a + c], bin_of))
        per_bin = np.bincount(bin_of, minlength=m)
        first = np.concatenate([[0], np.cumsum(per_bin)[:-1]])
        row_of = np.empty(c, dtype=np.int64)
        row_of[order] = np.arange(c) - np.repeat(first, per_bin)
        sub = tuple(Bin(j, b.kind, int(per_bin[j]), path=sub_bin_path(b.path, t) if b.path else None,
                        device=b.device) for j, b in enumerate(bins))
        placements[t] = Placement(sub, bin_of, row_of)
    real = rows.sizes("bytes")
    return HeteroPlaceResult(tuple(bins), rows, res, placements,
                             np.bincount(res.bin_of, weights=real, minlength=m).astype(np.int64), h, sizing,
                             tuple(notes))


def tier_shares(res: HeteroPlaceResult, hotness: np.ndarray | None = None) -> dict[str, dict[str, float]]:
    """Per tier: the row bytes it holds (``bytes``), its share of the reads and of the bytes read.

    ``hotness`` (``[num_nodes]``): the reads to count (e.g. an independent pre-sample, which
    the placement was not fitted to); default the hotness placed by.
    """
    h = res.item_reads if hotness is None else res.rows.item_hotness(hotness)
    m = len(res.bins)
    reads = np.bincount(res.result.bin_of, weights=h, minlength=m)
    read_bytes = np.bincount(res.result.bin_of, weights=h.astype(np.float64) * res.rows.sizes("bytes"), minlength=m)
    tot_r, tot_b = float(reads.sum()) or 1.0, float(read_bytes.sum()) or 1.0
    out: dict[str, dict[str, float]] = {}
    for kind in ("gpu", "cpu", "ssd"):
        js = [j for j, b in enumerate(res.bins) if b.kind == kind]
        if js:
            out[kind] = {"bytes": int(res.bytes_per_bin[js].sum()), "read_share": float(reads[js].sum()) / tot_r,
                         "read_bytes_share": float(read_bytes[js].sum()) / tot_b}
    return out


__all__ = ["SIZINGS", "HeteroPlaceResult", "TypedRows", "byte_cache_shares", "place_hetero", "sub_bin_path",
           "tier_shares", "typed_rows"]
