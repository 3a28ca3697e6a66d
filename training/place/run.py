"""The whole placement workflow as one library call: :func:`place_dataset`.

A dataset and a plan go in; a placement directory comes out: the hotness
(computed or loaded, :mod:`training.hotness`), the plan's traffic targets
resolved for the caches (:func:`training.place.bins.targets_for_caches`), DDAK or
a baseline over the feasible targets (:func:`training.place.policy.place`), the SSD
bin files (:func:`iostack.bins.write_bins`), the expected shares under an
independent pre-sample, the report (``place.json``) and, last, the placement
index (:meth:`iostack.placement.Placement.save`), whose manifest carries the
dataset's fingerprint (:func:`training.data.fingerprint`) so that training
refuses a placement made from another dataset. With ``nodes > 1`` the rows are
split over the nodes instead (:func:`training.place.nodes.place_sharded`).

``moment place`` is this call with options parsed and the result printed. The
order of the writes keeps a failure harmless: nothing under ``out`` is a
placement until its ``placement.json`` is written. With ``force`` the new bins
are written beside the old ones (``*.dat.new``) and take their names only once
all are whole, just after the old index goes: an interrupted replacement leaves
the old placement as it was. Where the file systems lack the room for both,
the old index goes first (never an old index over new bins) and a warning says
that an interruption then leaves neither.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from iostack.placement import MANIFEST, Placement, save_json
from iostack.shards import SHARDS, ShardLayout
from momentbase.jsontypes import JsonObject
from planner.handoff import PlanHandoff, PlanTargets
from planner.progress import Progress, report
from training.data import Dataset, fingerprint, open_dataset
from training.hotness import Hotness, get_hotness
from training.hotness_methods import HOTNESS_METHODS
from training.memplan import CacheSizing
from training.place.bins import PlacingError, build_bins, check_free_space, reader_sockets, targets_for_caches
from training.place.guard import holds_placement_lock
from training.place.node_reads import NodeHotness
from training.place.policy import PlaceResult, place
from training.place.report import expected_shares
from training.place.specs import PlaceSpec

if TYPE_CHECKING:
    from iostack.codec import FeatureCodec

log = logging.getLogger(__name__)

#: files whose presence in ``out`` means a placement is there already (the last: a heterogeneous
#: dataset's, :data:`training.hetero.tiered.MANIFEST`)
HELD = (MANIFEST, SHARDS, "hetero_place.json")

@dataclass(frozen=True)
class PlacedDataset:
    """What :func:`place_dataset` wrote and found.

    ``report``: the ``place.json`` it wrote to ``out`` (for ``nodes > 1`` the
    root's: the nodes and their rows). ``result``: the one machine's placement
    and reports (``None`` for ``nodes > 1``); ``sharded``: the nodes'
    (:class:`training.place.nodes.ShardedPlacement`, ``None`` for one machine).
    ``row_bytes``: a row as the bins hold it (bytes). ``plan_notes``: how the
    plan's targets were resolved; ``warnings``: why the SSD directories are
    not separate drives, when they are not.
    """

    out: Path
    dataset: Dataset = field(repr=False)
    hotness: Hotness = field(repr=False)
    targets: PlanTargets
    report: dict[str, Any] = field(repr=False)
    row_bytes: int
    result: PlaceResult | None = field(default=None, repr=False)
    sharded: Any = field(default=None, repr=False)
    plan_notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


def check_out(out: str | os.PathLike[str], ssd_dirs: Iterable[str | os.PathLike[str]] = (), *,
              force: bool = False) -> None:
    """Refuse an ``out`` that holds a placement (unless ``force``) or that, or an SSD directory, is a file.

    Cheap and done before any work; :func:`place_dataset` calls it too.
    """
    out = Path(out)
    held = next((n for n in HELD if (out / n).exists()), None)
    if held and not force:
        raise PlacingError(f"`out` {out}: holds a placement already ({held}); "
                           "choose another directory or pass `force=True` to replace it")
    if out.exists() and not out.is_dir():
        raise PlacingError(f"`out` {out}: exists and is not a directory")
    for d in ssd_dirs:
        if Path(d).exists() and not Path(d).is_dir():
            raise PlacingError(f"`ssd_dirs` {d}: exists and is not a directory")


def ssd_warnings(ssd_dirs: Iterable[str | os.PathLike[str]], root: str = "/") -> list[str]:
    """Why the ``ssd_dirs`` are not separate drives, if they are not (one line each).

    Directories on one file system (the same ``st_dev``) share one drive's bandwidth, so
    the plan's per-SSD targets cannot hold; one on the file system of ``root`` is on the
    system disk. The directories must exist.

    >>> ssd_warnings([], root="/")
    []
    """
    dirs = list(dict.fromkeys(Path(d).resolve() for d in ssd_dirs))
    root_dev = os.stat(root).st_dev
    by_dev: dict[int, list[Path]] = {}
    for d in dirs:
        by_dev.setdefault(os.stat(d).st_dev, []).append(d)
    notes = []
    for dev, ds in by_dev.items():
        names = ", ".join(str(d) for d in ds)
        where = f"{os.major(dev)}:{os.minor(dev)}"
        if dev == root_dev:
            notes.append(f"--ssd {names}: on the root file system (device {where}), not a separate drive; "
                         "fine for a trial, but the plan's SSD targets assume one drive per --ssd")
        elif len(ds) > 1:
            notes.append(f"--ssd {names}: all on one device ({where}), not separate drives; their bins "
                         "share that drive's bandwidth, so the plan's per-SSD targets will not hold")
    return notes


@holds_placement_lock  # one writer of out at a time; what a killed one left is swept (training/place/guard.py)
def place_dataset(dataset: str | os.PathLike[str] | Dataset, handoff: PlanHandoff, out: str | os.PathLike[str],
                  spec: PlaceSpec, *, hotness_dir: str | os.PathLike[str] | None = None,
                  recompute_hotness: bool = False, force: bool = False, plan_notes: Sequence[str] = (),
                  cpu_cache_sizing: CacheSizing | None = None, progress: Progress | None = None,
                  warn: Callable[[str], None] | None = None,
                  node_handoffs: Sequence[PlanHandoff] | None = None) -> PlacedDataset:
    """Place ``dataset``'s feature rows for ``handoff``'s plan as ``spec`` says and write the placement to ``out``.

    Parameters
    ----------
    dataset : path or Dataset
        The dataset directory (``moment data import``) or an open dataset; it needs features.
    handoff : PlanHandoff
        The plan (:func:`planner.handoff.read_plan_file`, or :func:`planner.handoff.plan_now`).
    out : path
        The placement directory (created); one holding a placement is refused unless ``force``.
    spec : PlaceSpec
        The tiers, the policy, the split over nodes, the hotness and the rows' type
        (:mod:`training.place.specs`).
    hotness_dir : path, optional
        Where the hotness is saved (default ``<dataset>/hotness``) and reused from unless
        ``recompute_hotness``.
    force : bool
        Replace a placement already in ``out`` (and SSD bin files already there).
    plan_notes : sequence of str
        Notes of the caller about the plan, kept in the report.
    cpu_cache_sizing : CacheSizing, optional
        How ``spec.tiers.cpu_cache_bytes`` was chosen (:func:`training.memplan.size_cpu_cache`), for ``place.json``.
    progress : Progress, optional
        Called as the hotness, DDAK and the bin files advance (:mod:`planner.progress`).
    warn : callable, optional
        Called with each warning as it arises (default: this module's logger).
    node_handoffs : sequence of PlanHandoff, optional
        One plan per node: node ``k``'s rows go into the bins of plan ``k`` (None: ``handoff`` on every node).

    Returns
    -------
    PlacedDataset

    Raises
    ------
    PlacingError
        ``out`` holds a placement (without ``force``), a dataset without features, a plan the
        in-place bin does not fit, too little free space, a write that failed, ``node_handoffs`` not one per node.

    Examples
    --------
    >>> import tempfile
    >>> from planner.topology.discover import topology_from_files
    >>> from planner.handoff import plan_now
    >>> from training.hotness import HotnessSpec
    >>> from training.place.specs import TierSpec
    >>> from training.synth import SynthSpec
    >>> from training.synth_run import synthesize
    >>> tmp = Path(tempfile.mkdtemp())
    >>> _ = synthesize(tmp / "ds", SynthSpec(num_nodes=500, num_edges=3000, feature_dim=4))
    >>> plan = plan_now(topology_from_files(machine="moment-b"), spec="moment-b")  # 4 GPUs, 2 sockets, 8 SSDs
    >>> spec = PlaceSpec(TierSpec(gpu_cache_bytes=800, cpu_cache_bytes=1600, ssd_dirs=[tmp / "p"] * 8),
    ...                  hotness=HotnessSpec("degree"))
    >>> placed = place_dataset(tmp / "ds", plan, tmp / "p", spec, warn=lambda s: None)
    >>> [b.kind for b in placed.result.placement.bins][:4], placed.report["dataset_fingerprint"]["num_nodes"]
    (['gpu', 'cpu', 'cpu', 'ssd'], 500)
    """
    out, tiers = Path(out), spec.tiers
    check_out(out, tiers.ssd_dirs, force=force)
    _check_node_handoffs(node_handoffs, spec.shards.nodes)
    ds, codec, row_bytes = _open(dataset, spec.feature_dtype, progress)
    shift = _in_place_shift(ds, handoff) if spec.in_place else None  # before any long work
    for d in (out, *tiers.ssd_dirs):
        Path(d).mkdir(parents=True, exist_ok=True)
    hot = get_hotness(ds, spec.hotness, directory=hotness_dir, recompute=recompute_hotness, progress=progress)
    targets, resolved = targets_for_caches(handoff, hot.values, gpu_rows=tiers.gpu_cache_bytes // row_bytes,
                                           cpu_rows=tiers.cpu_cache_bytes // row_bytes, gpu_mode=tiers.gpu_mode)
    job = _Job(ds, hot, targets, out, spec, progress, warn if warn is not None else log.warning,
               plan_notes=(*plan_notes, *([resolved] if resolved else [])), in_place_shift=shift,
               cpu_cache_sizing=cpu_cache_sizing, handoff=handoff, node_handoffs=node_handoffs)
    if spec.shards.nodes > 1:
        return _place_nodes(job)
    return _place_one(job, row_bytes, codec, force)


def _check_node_handoffs(node_handoffs: Sequence[PlanHandoff] | None, nodes: int) -> None:
    if node_handoffs is not None and len(node_handoffs) != nodes:
        raise PlacingError(f"`node_handoffs`: {len(node_handoffs)} plans for `nodes` {nodes}; give one plan per "
                           "node, or one plan for all")


def _open(dataset: str | os.PathLike[str] | Dataset, feature_dtype: str | None,
          progress: Progress | None) -> tuple[Dataset, FeatureCodec | None, int]:
    """The dataset, the codec of ``feature_dtype`` fitted to its features (or None), a row's bytes in the bins."""
    ds = dataset if isinstance(dataset, Dataset) else open_dataset(dataset)
    if ds.features is None:
        raise PlacingError(f"`dataset` {ds.path}: has no features to place; import it with features")
    if feature_dtype is None:
        return ds, None, ds.row_bytes
    from iostack.codec import fit_codec

    codec = fit_codec(ds.features, feature_dtype, progress=progress)
    return ds, codec, codec.row_bytes


def _in_place_shift(ds: Dataset, handoff: PlanHandoff) -> int:
    """Whether the dataset's feature file can be a one-SSD plan's bin as it is: the rows its header takes.

    One machine and the rows' own type (:class:`~training.place.specs.PlaceSpec` refused the rest).
    """
    from iostack.bins import in_place_shift

    n_ssd = len(handoff.targets.of_kind("ssd"))
    if n_ssd != 1:
        raise PlacingError(f"`in_place`: the plan has {n_ssd} SSDs; the dataset's feature file can stand in "
                           "for one SSD bin only (plan for one SSD, or leave out `in_place`)")
    return in_place_shift(Path(ds.path) / "features.npy")


@dataclass
class _Job:
    """What both the one-machine and the several-node placements need."""

    ds: Dataset
    hot: Hotness
    targets: PlanTargets
    out: Path
    spec: PlaceSpec
    progress: Progress | None
    warn: Callable[[str], None]
    plan_notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    #: rows the feature file's header takes when it is the SSD bin itself (``in_place``), else None
    in_place_shift: int | None = None
    cpu_cache_sizing: CacheSizing | None = None
    handoff: PlanHandoff | None = None
    node_handoffs: Sequence[PlanHandoff] | None = None

    def warn_ssd(self) -> None:
        self.warnings = tuple(ssd_warnings(self.spec.tiers.ssd_dirs))
        for note in self.warnings:
            self.warn(note)


def _report_head(job: _Job) -> dict[str, Any]:
    """The fields every ``place.json`` starts with: the dataset, its fingerprint, the plan, the hotness."""
    ds, spec, hot, targets, tiers = job.ds, job.hot.spec, job.hot, job.targets, job.spec.tiers
    return {"schema": "moment.place", "version": 1, "dataset": str(ds.path), "dataset_fingerprint": fingerprint(ds),
            "plan": targets.source, "machine": targets.machine,
            # the flow model's inlet per GPU, bytes/s: what training's throughput is held against
            "plan_inlet_bytes_per_s": dict(targets.inlet_bytes_per_s),
            "hotness": {**spec.params(), "path": str(hot.path) if hot.path else None, "loaded": hot.loaded,
                        "epochs_covered": hot.epochs_covered},
            "gpu_cache_bytes": tiers.gpu_cache_bytes, "cpu_cache_bytes": tiers.cpu_cache_bytes,
            "gpu_cache_mode": tiers.gpu_mode,
            # how --cpu-cache auto chose cpu_cache_bytes (None: given as a size)
            "cpu_cache_sizing": job.cpu_cache_sizing.to_dict() if job.cpu_cache_sizing is not None else None}


def _place_one(job: _Job, row_bytes: int, codec: FeatureCodec | None, force: bool) -> PlacedDataset:
    """One machine: bins, the placement, its SSD files, the report, and last the placement's index."""
    from iostack.bins import adopt_bin, bin_path, discard_staged, publish_staged, write_bins

    ds, hot, tiers, policy = job.ds, job.hot, job.spec.tiers, job.spec.policy
    bins = build_bins(job.targets, num_rows=ds.num_nodes, row_bytes=row_bytes, gpu_cache_bytes=tiers.gpu_cache_bytes,
                      cpu_cache_bytes=tiers.cpu_cache_bytes, ssd_dirs=tiers.ssd_dirs, out_dir=job.out,
                      gpu_mode=tiers.gpu_mode)
    job.warn_ssd()  # the SSD list is known good now: a warning, then the long work
    reads = hot.reads_per_epoch
    group_reads, sockets = _socket_reads(job)
    report(job.progress, f"placing ({policy.strategy})")
    res = place(hot.values, bins, job.targets, row_bytes=row_bytes, strategy=policy.strategy, pool=policy.pool,
                seed=policy.seed, reads_per_epoch=float(reads.sum()) if reads is not None else None, codec=codec,
                progress=job.progress, group_reads=group_reads)
    if group_reads is not None:  # DDAK was fitted to these reads: what it does to reads it did not see
        sockets["held_out_cross_socket_share"] = _held_out_cross(job, res)
    del group_reads
    if job.in_place_shift is not None:
        res = _as_in_place(res, job.in_place_shift)
    clash = [str(f) for f in (bin_path(job.out, b) for b in res.placement.bins if b.kind == "ssd") if f.exists()]
    if clash and not force:
        raise PlacingError(f"bin file {clash[0]} exists already"
                           + (f" (and {len(clash) - 1} more)" if len(clash) > 1 else "")
                           + "; choose other `ssd_dirs` directories or pass `force=True` to replace them")
    staged = force and job.in_place_shift is None and _room_to_keep_the_old(job, res.placement, row_bytes)
    if job.in_place_shift is None and not staged:
        check_free_space(res.placement, row_bytes, job.out)
    held = None
    # a sampled hotness: what the run will read, from an independent sample DDAK was not fitted to
    if HOTNESS_METHODS.caps(hot.spec.method).get("sampled"):
        report(job.progress, "an independent pre-sample (the expected shares that training's prediction uses)")
        other = get_hotness(ds, replace(hot.spec, seed=hot.spec.seed + 1), save=False, progress=job.progress)
        held = expected_shares(res.placement.bin_of, other.values, len(res.placement.bins))
    if force and not staged:
        # the old placement stops existing before its bins change: never an old index over new bins
        _unindex(job.out)
    try:
        if job.in_place_shift is not None:
            ssd = next(b for b in res.placement.bins if b.kind == "ssd")
            adopt_bin(Path(ds.path) / "features.npy", ssd, job.out, progress=job.progress)
        else:
            # staged: the new bins go beside the old ones, so that an interrupted replacement leaves the
            # old placement whole; only renames remain once they are written
            write_bins(ds.features, res.placement, job.out, progress=job.progress, staged=staged)
    except BaseException as exc:
        if staged:
            discard_staged(res.placement, job.out)
        if isinstance(exc, OSError):
            raise PlacingError(f"writing the bins: {exc.strerror or exc} ({getattr(exc, 'filename', '')}); "
                               "check the `ssd_dirs` directories") from None
        raise
    if staged:
        _unindex(job.out)
        publish_staged(res.placement, job.out)
    head = _report_head(job)
    rep = {**head, "row_bytes": row_bytes,
           "feature_dtype": codec.dtype if codec is not None else ds.features.dtype.name,
           "bins": [asdict(b) for b in res.bins], "report": asdict(res.report),
           "baseline": asdict(res.baseline) if res.baseline else None, "target_notes": list(res.notes),
           "plan_notes": list(job.plan_notes),
           # per bin: share of the reads under an independent pre-sample (seed + 1), or None
           "expected_shares": held, "socket_aware": sockets}
    save_json(job.out / "place.json", rep)
    res.placement.save(job.out, dataset_fingerprint=head["dataset_fingerprint"])  # last: exists once its bins do
    return PlacedDataset(job.out, ds, hot, job.targets, rep, row_bytes, result=res, plan_notes=job.plan_notes,
                         warnings=job.warnings)


def _unindex(out: Path) -> None:
    """``out`` stops being a placement (its index and report go; its bins stay until replaced)."""
    for stale in (out / MANIFEST, out / "place.json"):
        stale.unlink(missing_ok=True)


def _room_to_keep_the_old(job: _Job, placement: Placement, row_bytes: int) -> bool:
    """Whether a forced replacement of ``job.out`` can write its bins beside the old ones.

    Only when ``out`` holds a placement to keep; without the room for both, the old one goes
    first (as before) and a warning says so.
    """
    if not (job.out / MANIFEST).exists():
        return False
    try:
        check_free_space(placement, row_bytes, job.out, keep_existing=True)
    except PlacingError:
        note = (f"{job.out}: no room for the new bins beside the old ones, so the old placement is removed "
                "before the new one is written (an interruption now leaves neither)")
        job.warnings = (*job.warnings, note)
        job.warn(note)
        return False
    return True


def _socket_reads(job: _Job) -> tuple[np.ndarray | None, JsonObject]:
    """Each socket's reads where the plan's GPUs span sockets and the policy is socket-aware
    (:mod:`training.place.sockets`), and what ``place.json`` records of it (``used``, and why not)."""
    from training.place.sockets import SEED_SPLIT, gpus_per_socket, socket_reads, spans_sockets

    why = None
    if not job.spec.policy.socket_aware:
        why = "turned off (`socket_aware=False`)"
    elif not spans_sockets(job.targets):
        why = "the plan's GPUs sit on one socket"
    elif not HOTNESS_METHODS.caps(job.hot.spec.method).get("sampled"):
        why = f"hotness {job.hot.spec.method} is not pre-sampled: no reads per socket"
    if why is not None:
        return None, {"used": False, "why_not": why}
    report(job.progress, "each socket's reads (a pre-sample of its GPUs' part of the training vertices)")
    reads = socket_reads(job.ds, job.hot.spec, job.targets, progress=job.progress)
    # gpu_sockets: each plan GPU's socket in the plan's order; `moment train` gives rank i the socket of the
    # plan's GPU i (training.socket_batches) and keeps that rank's seeds to its socket's part
    return reads, {"used": True, "sockets": list(reader_sockets(job.targets)),
                   "gpus_per_socket": gpus_per_socket(job.targets), "gpu_sockets": [s for _, s in job.targets.gpus],
                   "seed_split": SEED_SPLIT,
                   "note": "the cross-socket shares hold for ranks that train on their socket's part: `moment "
                           "train` on this placement gives rank i the socket of the plan's GPU i and its seeds "
                           "from that socket's part (training.socket_batches)"}


def _held_out_cross(job: _Job, res: PlaceResult) -> float:
    """The placement's cross-socket share of an independent pre-sample of each socket's reads (seed + 1)."""
    from training.place.sockets import cross_socket_share, socket_reads

    report(job.progress, "each socket's reads again (an independent pre-sample: the held-out cross-socket share)")
    other = socket_reads(job.ds, replace(job.hot.spec, seed=job.hot.spec.seed + 1), job.targets,
                         progress=job.progress)
    return cross_socket_share(res.placement.bin_of, other, res.bins, job.targets)


def _as_in_place(result: PlaceResult, shift: int) -> PlaceResult:
    """``result`` with its one SSD bin being the dataset's feature file itself (``moment place --in-place``).

    The SSD bin then holds every row at ``vertex + shift`` (``shift``: the rows the file's
    header takes, :func:`iostack.bins.in_place_shift`); the vertices DDAK put there keep
    their bin, only their row changes, and the cached vertices' rows in the file go
    unread. Nothing is copied: what DDAK decides is which rows the caches hold. The
    placement has one SSD bin and no codec (:func:`_in_place_shift` refused the rest).
    """
    p = result.placement
    s = next(b for b in p.bins if b.kind == "ssd")
    row_of = np.array(p.row_of, dtype=np.int64)
    mine = p.bin_of == s.id
    row_of[mine] = np.flatnonzero(mine) + shift
    bins = tuple(replace(b, capacity_rows=shift + p.num_vertices) if b.id == s.id else b for b in p.bins)
    return replace(result, placement=Placement(bins, p.bin_of, row_of, codec=None))


def _node_layout(job: _Job) -> ShardLayout:
    """The rows over the nodes: by ``spec.shards.partition`` (the graph's partitions), else dealt by hotness."""
    from iostack.shards import shard_rows

    shards, n = job.spec.shards, job.ds.num_nodes
    if shards.partition is None:
        return shard_rows(job.hot.values, shards.nodes, shards.replicas, shards.hot_row_count(n),
                          groups=shards.groups)
    from training.partition.owners import partition_layout

    return partition_layout(job.ds, shards.partition, shards.nodes, hotness=job.hot.values,
                            replicas=shards.replicas, hot_rows=shards.hot_row_count(n), groups=shards.groups)


def _node_hotness(job: _Job, layout: ShardLayout) -> NodeHotness | None:
    """Each node's hotness and locality cache order (:mod:`training.place.node_reads`) where the rows follow a
    partition and the hotness is pre-sampled (its nodes' seeds are then known); else None."""
    shards = job.spec.shards
    # with replica groups a node's reads depend on how the groups split the seeds: left to the dataset's hotness
    if shards.partition is None or shards.groups > 1 or not HOTNESS_METHODS.caps(job.hot.spec.method).get("sampled"):
        return None
    from training.place.node_reads import node_hotness, partition_halos


    report(job.progress, "each node's reads (a pre-sample of its own seeds) and its locality cache's rows")
    return node_hotness(job.ds, layout, job.hot.spec, cache_rows=shards.halo_cache_bytes // job.ds.row_bytes,
                        halos=partition_halos(shards.partition, shards.nodes), progress=job.progress)


def _node_targets(job: _Job, layout: ShardLayout,
                  node_hot: NodeHotness | None) -> list[PlanTargets] | PlanTargets:
    """Every node's plan resolved for its caches by its own rows' hotness, or the one resolved plan when every node
    has the same plan and the dataset's hotness."""
    if job.node_handoffs is None and node_hot is None:
        return job.targets
    tiers, rb, out = job.spec.tiers, job.ds.row_bytes, []
    for k in range(layout.num_nodes):
        handoff = job.node_handoffs[k] if job.node_handoffs is not None else job.handoff
        hot = node_hot.hotness[k] if node_hot is not None else job.hot.values[layout.rows_of(k)]
        targets, note = targets_for_caches(handoff, hot, gpu_rows=tiers.gpu_cache_bytes // rb,
                                           cpu_rows=tiers.cpu_cache_bytes // rb, gpu_mode=tiers.gpu_mode)
        if note:
            job.plan_notes = (*job.plan_notes, f"node {k}: {note}")
        out.append(targets)
    return out


def _shares(job: _Job, layout: ShardLayout, node_hot: NodeHotness | None) -> JsonObject | None:
    """The nodes' pre-sampled remote share without and with the halo caches (``moment plan --nodes N
    --remote-share``), or None without each node's reads."""
    if node_hot is None:
        return None
    from training.place.node_reads import remote_shares

    rows = job.spec.shards.halo_cache_bytes // job.ds.row_bytes
    bare, cached = remote_shares(node_hot.reads, layout, [h[:rows] for h in node_hot.halo])
    # the caches were chosen by these very reads, so their share is the best case, not a prediction:
    # tools/bench_partition_place.py predicts the cache's share from a second, independent pre-sample instead
    return {"no_cache": bare, "halo_cache": cached,
            "halo_cache_note": "fitted to the pre-sample that chose it: a best case"}


def _place_nodes(job: _Job) -> PlacedDataset:
    """Several nodes: every node's directory (:func:`training.place.nodes.place_sharded`), the root report."""
    from training.place.nodes import place_sharded, sharded_summary

    spec = job.spec
    job.warn_ssd()
    layout = _node_layout(job)
    node_hot = _node_hotness(job, layout)
    targets = _node_targets(job, layout, node_hot)
    head = {**_report_head(job), "row_bytes": job.ds.row_bytes, "strategy": spec.policy.strategy,
            "ownership": {"partition": spec.shards.partition} if spec.shards.partition else "hotness",
            "node_plans": [t.source for t in targets] if isinstance(targets, list) else None,
            "halo_cache_bytes": spec.shards.halo_cache_bytes, "presampled_remote_share": _shares(job, layout, node_hot)}
    report(job.progress, f"placing over {spec.shards.nodes} nodes ({spec.policy.strategy}, "
                         f"replicas {spec.shards.replicas})")
    try:
        sp = place_sharded(job.ds.features, job.hot.values, targets, job.out, spec.tiers, spec.policy,
                           spec.shards, reads_per_epoch=job.hot.reads_per_epoch, report=head, progress=job.progress,
                           layout=layout, node_hot=node_hot)
    except OSError as exc:
        raise PlacingError(f"writing the node directories: {exc.strerror or exc} "
                           f"({getattr(exc, 'filename', '')}); check `out` and the `ssd_dirs` directories") from None
    return PlacedDataset(job.out, job.ds, job.hot, job.targets, {**head, **sharded_summary(sp)}, job.ds.row_bytes,
                         sharded=sp, plan_notes=job.plan_notes, warnings=job.warnings)


def check_placement_is_for(placement: Placement, placement_dir: str | os.PathLike[str], ds: Dataset) -> None:
    """Refuse a placement made from another dataset than ``ds``; its manifest records whose it is.

    ``placement``: the loaded :class:`iostack.placement.Placement` of
    ``placement_dir``. Placements written before the manifest carried the
    fingerprint fall back to ``place.json``'s; one with neither still opens
    (logged).
    """
    made_from = getattr(placement, "dataset_fingerprint", None)
    if not made_from:
        try:
            made_from = json.loads((Path(placement_dir) / "place.json").read_text()).get("dataset_fingerprint")
        except (OSError, ValueError, AttributeError):
            made_from = None
    if not made_from:
        log.warning("%s: the placement records no dataset fingerprint (written before placements carried one); "
                    "not checked against %s", placement_dir, ds.path)
        return
    now = fingerprint(ds)
    diff = [k for k in made_from if now.get(k) != made_from[k]]
    if diff:
        raise PlacingError(f"{placement_dir}: placed from another dataset than {ds.path} (they differ in "
                           f"{', '.join(diff)}); place this dataset with `moment place`")


__all__ = ["PlacedDataset", "check_out", "check_placement_is_for", "place_dataset", "ssd_warnings"]
