"""``moment place`` on a heterogeneous dataset as one library call: :func:`place_hetero_dataset`.

The dataset's typed pre-sampling hotness (:func:`training.hetero.hotness.hetero_presample_counts`,
one value per global id), the plan's targets for caches that hold these shares of the bytes
read (:func:`training.hetero.place.byte_cache_shares`, then :meth:`PlanHandoff.resolve`), the
plan's bins with capacities in bytes (:func:`training.place.bins.build_bins` at one byte a "row"),
DDAK over every type's rows (:func:`training.hetero.place.place_hetero`), the sub-bins and
indexes, and last the manifest with the report (:func:`training.hetero.tiered.write_hetero_placement`).

The report holds, per tier, the bytes held and the shares of reads and of bytes read, both
under the hotness placed by and under an independent pre-sample (another seed: what a run
will read, which DDAK was not fitted to), and the same for the padded-to-widest baseline on
the same bins; cache targets are capped at what the hottest rows fitting in their bytes serve
(:func:`training.place.bins.feasible_targets` with ``item_size``). Not yet for heterogeneous
datasets: several nodes, a storage dtype, ``in_place``, another policy than DDAK, another
hotness than pre-sampling (each refused with its name), socket-aware placement (left out).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from momentbase.jsontypes import JsonObject
from planner.handoff import PlanHandoff, PlanTargets
from planner.progress import Progress, report
from training.data import fingerprint
from training.hetero.hotness import hetero_presample_counts
from training.hetero.place import HeteroPlaceResult, byte_cache_shares, place_hetero, tier_shares, typed_rows
from training.hetero.store import HeteroDataset, open_hetero
from training.hetero.tiered import MANIFEST, write_hetero_placement
from training.place.bins import BinPlan, PlacingError, build_bins
from training.place.run import check_out
from training.place.specs import PlaceSpec, TierSpec


def is_hetero(dataset: str | os.PathLike[str]) -> bool:
    """Whether the dataset directory's ``meta.json`` has a ``hetero`` section (cheap: reads that file only)."""
    import json

    try:
        meta = json.loads((Path(dataset) / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and "hetero" in meta


def _refuse(spec: PlaceSpec) -> None:
    """The options a heterogeneous placement does not take yet, each named."""
    bad = [name for name, on in (("nodes", spec.shards.nodes > 1), ("feature_dtype", spec.feature_dtype is not None),
                                 ("in_place", spec.in_place), ("strategy", spec.policy.strategy != "ddak"),
                                 ("hotness", spec.hotness.method != "presample"),
                                 ("num_batches", spec.hotness.num_batches is not None))
           if on]
    if bad:
        raise PlacingError(f"{', '.join(f'`{b}`' for b in bad)}: not available for a heterogeneous dataset yet "
                           "(DDAK over pre-sampled hotness on one machine, rows in their own types)")


def _hotness(data: HeteroDataset, spec: PlaceSpec, seed: int) -> np.ndarray:
    h = spec.hotness
    return hetero_presample_counts(data, list(h.fanouts), batch_size=h.batch_size, epochs=h.epochs, seed=seed)


def hetero_bins(data: HeteroDataset, hotness: np.ndarray, handoff: PlanHandoff, tiers: TierSpec,
                out: str | os.PathLike[str]) -> tuple[list[BinPlan], PlanTargets, str | None]:
    """The plan's bins for ``data``'s rows, capacities in bytes; the targets, and a note when re-solved.

    The plan's targets are resolved for caches holding the shares of the bytes read that the hottest
    rows fitting in them hold (:func:`byte_cache_shares`).

    Raises
    ------
    PlacingError
        SSD directories that do not match the plan, a cache the plan has no place for.
    """
    rows = typed_rows(data)
    size = rows.sizes()
    g, c = byte_cache_shares(rows.item_hotness(hotness), size, handoff.targets, gpu_bytes=tiers.gpu_cache_bytes,
                             cpu_bytes=tiers.cpu_cache_bytes, gpu_mode=tiers.gpu_mode)
    targets, note = handoff.resolve(g, c)
    bins = build_bins(targets, num_rows=int(size.sum()), row_bytes=1, gpu_cache_bytes=tiers.gpu_cache_bytes,
                      cpu_cache_bytes=tiers.cpu_cache_bytes, ssd_dirs=tiers.ssd_dirs, out_dir=out,
                      gpu_mode=tiers.gpu_mode)
    return bins, targets, note


def place_hetero_dataset(dataset: str | os.PathLike[str], handoff: PlanHandoff, out: str | os.PathLike[str],
                         spec: PlaceSpec, *, force: bool = False, plan_notes: Sequence[str] = (),
                         progress: Progress | None = None) -> tuple[HeteroPlaceResult, JsonObject]:
    """Place every featured type's rows of ``dataset`` for ``handoff``'s plan; returns the result and report.

    Raises
    ------
    PlacingError
        ``out`` holds a placement (without ``force``), an option heterogeneous datasets do not take
        yet, SSD directories that do not match the plan, a bin file that could not be written.
    DatasetError
        Not a heterogeneous dataset, or one without a target type and training split.
    """
    out, tiers = Path(out), spec.tiers
    check_out(out, tiers.ssd_dirs, force=force)  # refuses an `out` holding any placement, this kind's too
    _refuse(spec)
    data = open_hetero(dataset)
    for d in (out, *tiers.ssd_dirs):
        Path(d).mkdir(parents=True, exist_ok=True)
    report(progress, "typed pre-sampling (the hotness of every type's rows)")
    hot = _hotness(data, spec, spec.hotness.seed)
    rows = typed_rows(data)
    bins, targets, note = hetero_bins(data, hot, handoff, tiers, out)
    report(progress, "placing (ddak over every type's rows, capacities in bytes)")
    res = place_hetero(data, hot, bins, pool=spec.policy.pool, progress=progress)
    padded = place_hetero(data, hot, bins, pool=spec.policy.pool, sizing="padded")
    report(progress, "an independent pre-sample (what a run will read)")
    other = _hotness(data, spec, spec.hotness.seed + 1)
    rep: JsonObject = {
        "schema": "moment.place.hetero", "version": 1, "dataset": str(data.base.path),
        "dataset_fingerprint": fingerprint(data.base), "plan": targets.source, "machine": targets.machine,
        "plan_notes": [*plan_notes, *([note] if note else []), *res.notes],
        "hotness": {**spec.hotness.params(), "method": "presample (typed)"},
        "gpu_cache_bytes": tiers.gpu_cache_bytes, "cpu_cache_bytes": tiers.cpu_cache_bytes,
        "types": {t: {"rows": rows.count[i], "row_bytes": rows.row_bytes[i],
                      "rows_per_bin": np.bincount(res.placements[t].bin_of, minlength=len(bins)).tolist()}
                  for i, t in enumerate(rows.types)},
        "bins": [{"kind": b.kind, "device": b.device, "path": b.path, "capacity_bytes": b.capacity_rows,
                  "bytes": int(res.bytes_per_bin[j]), "rows": int(res.result.items_per_bin[j]),
                  "target_share": b.target_share} for j, b in enumerate(res.bins)],
        "max_relative_deviation": res.result.max_relative_deviation,
        "tiers": tier_shares(res), "tiers_held_out": tier_shares(res, other),
        "padded_baseline": {"tiers": tier_shares(padded, hot), "tiers_held_out": tier_shares(padded, other)},
    }
    # replacing: the old manifest goes before any bin changes, never an old index over new bins
    (out / MANIFEST).unlink(missing_ok=True)
    write_hetero_placement(data, res, out, rep, progress=progress)
    return res, rep


__all__ = ["hetero_bins", "is_hetero", "place_hetero_dataset"]
