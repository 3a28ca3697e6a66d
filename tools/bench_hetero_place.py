"""DDAK over every node type's rows sized by their own bytes, against rows padded to the widest type.

One synthetic ogbn-mag-shaped dataset (``training.hetero.synth.synth_mag``: paper rows of 64 bytes,
author 16, institution 4; field_of_study featureless; reverse relations added), one typed
pre-sampling hotness, one plan (``moment-b``: a GPU cache, 2 host memories, 8 SSDs) and the same
bins (caches given as ``--gpu-share`` / ``--cpu-share`` of all row bytes, small enough that the
SSDs serve much of the reads). Ours: :func:`training.hetero.place.place_hetero` with each row its
own bytes (``sizing="bytes"``); the reference: every row counted at the widest type's bytes
(``sizing="padded"``, what one padded feature table would place; its rows are still stored in
their own widths here, so its SSD reads are no wider than ours and the gap measured is the
placement's alone, a lower bound on padding's cost). Both are written
(``write_hetero_placement``) and read back through :class:`training.hetero.tiered.HeteroFeatureStore`
(posix reads, O_DIRECT where the file system allows) for the same typed batches, drawn by
:class:`training.hetero.sampler.HeteroNeighborSampler` from training papers before the timing.

Reported, both sides in one run: bytes each tier holds, the share of rows read from each tier
(counted by the stores over the timed batches), and seeds per second of gathering every batch's
features (sampling excluded: it is the same for both), median of ``--repeats`` interleaved
rounds with the range; warm (one round first, not counted). Usage::

    python tools/bench_hetero_place.py [--papers 100000] [--repeats 5] [--dir /var/tmp/moment-hetero] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _results import Figure, write  # noqa: E402

from planner.handoff import plan_now  # noqa: E402
from planner.topology.discover import topology_from_files  # noqa: E402
from training.hetero.graph import add_reverse  # noqa: E402
from training.hetero.hotness import hetero_presample_counts  # noqa: E402
from training.hetero.place import place_hetero, tier_shares, typed_rows  # noqa: E402
from training.hetero.sampler import HeteroNeighborSampler  # noqa: E402
from training.hetero.store import open_hetero, write_hetero  # noqa: E402
from training.hetero.synth import synth_mag  # noqa: E402
from training.hetero.tiered import HeteroFeatureStore, write_hetero_placement  # noqa: E402
from training.hetero.workflow import hetero_bins  # noqa: E402
from training.place.specs import TierSpec  # noqa: E402

SIDES = ("bytes", "padded")


def _round(store: HeteroFeatureStore, batches: list) -> float:
    """Seeds per second of gathering every featured type's rows of ``batches``."""
    seeds = 0
    t = time.perf_counter()
    for b in batches:
        for nt, ids in b.n_id.items():
            if nt in store.stores:
                store.gather(nt, ids)
        seeds += b.batch_size
    return seeds / (time.perf_counter() - t)


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--papers", type=int, default=100_000)
    p.add_argument("--fanouts", type=int, nargs="+", default=[10, 5])
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--batches", type=int, default=20, help="timed batches per round")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--gpu-share", type=float, default=0.02, help="GPU cache as a share of all row bytes")
    p.add_argument("--cpu-share", type=float, default=0.05, help="each host memory's cache, share of all row bytes")
    p.add_argument("--dir", default="/var/tmp/moment-hetero-place", help="scratch directory (removed after)")
    p.add_argument("--json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    n = args.papers
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    load = [os.getloadavg()[0]]
    try:
        g = add_reverse(synth_mag(papers=n, authors=n // 2, institutions=max(n // 100, 1), fields=max(n // 50, 1)))
        data = open_hetero(write_hetero(root / "mag", g))
        del g
        hot = hetero_presample_counts(data, args.fanouts, batch_size=args.batch_size)
        held = hetero_presample_counts(data, args.fanouts, batch_size=args.batch_size, seed=1)
        total = int(typed_rows(data).sizes().sum())
        tiers = TierSpec(int(total * args.gpu_share), int(total * args.cpu_share), [root / "ssd"] * 8)
        handoff = plan_now(topology_from_files(machine="moment-b"), spec="moment-b")
        stores, shares, placed = {}, {}, {}
        for side in SIDES:
            out = root / side
            bins, _, _ = hetero_bins(data, hot, handoff, tiers, out)
            res = place_hetero(data, hot, bins, sizing=side)
            write_hetero_placement(data, res, out, {"sizing": side})
            placed[side] = tier_shares(res, held)
            stores[side] = HeteroFeatureStore(data, out, backend="posix")
        train = np.asarray(data.split("train_idx"))
        rng = np.random.default_rng(2)
        sampler = HeteroNeighborSampler(data, args.fanouts, seed=2)
        batches = [sampler.sample("paper", torch.from_numpy(rng.choice(train, args.batch_size, replace=False)))
                   for _ in range(args.batches)]
        for s in stores.values():
            _round(s, batches[:2])  # warm
            s.reset_stats()
        rates: dict[str, list[float]] = {k: [] for k in SIDES}
        for _ in range(args.repeats):
            for side in SIDES:  # interleaved, so load changes hit both
                rates[side].append(_round(stores[side], batches))
        for side in SIDES:
            shares[side] = stores[side].tier_stats()
            direct = {d for st in stores[side].stores.values() for d, _ in st.direct_io().values()}
            stores[side].close()
        load.append(os.getloadavg()[0])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return _report(args, rates, shares, placed, direct, load)


def _report(args: argparse.Namespace, rates: dict, shares: dict, placed: dict, direct: set, load: list) -> int:
    med = {k: statistics.median(v) for k, v in rates.items()}
    for side in SIDES:
        held = ", ".join(f"{k} {v['bytes'] / 2**20:.2f} MiB" for k, v in placed[side].items())
        read = ", ".join(f"{k} {100 * v['share']:.1f}%" for k, v in shares[side].items())
        print(f"{side}: {med[side]:,.0f} seeds/s gathered (range {min(rates[side]):,.0f}-{max(rates[side]):,.0f}, "
              f"{args.repeats} rounds); held: {held}; rows read from: {read}")
    print(f"ratio bytes / padded seeds/s: {med['bytes'] / med['padded']:.2f}x; load {load[0]:.2f} -> {load[-1]:.2f}; "
          f"SSD reads O_DIRECT: {sorted(direct)}")
    where = (f"synth_mag {args.papers} papers (+authors, institutions), fan-out {args.fanouts}, batch "
             f"{args.batch_size}, GPU {args.gpu_share:.0%} / host 2x{args.cpu_share:.0%} of row bytes, moment-b")
    ssd = {k: shares[k].get("ssd", {}).get("share", 0.0) for k in SIDES}
    cache = {k: sum(placed[k].get(t, {}).get("read_bytes_share", 0.0) for t in ("gpu", "cpu")) for k in SIDES}
    note = (f"warm, median of {args.repeats} interleaved rounds; load {load[0]:.1f} -> {load[-1]:.1f}; "
            f"O_DIRECT {sorted(direct)}")
    figs = [Figure("hetero_place", f"gather seeds/s, {where}", "seeds/s", med["bytes"], med["padded"],
                   "DDAK with rows padded to the widest type",
                   note=f"ours {min(rates['bytes']):,.0f}-{max(rates['bytes']):,.0f}, reference "
                        f"{min(rates['padded']):,.0f}-{max(rates['padded']):,.0f}; {note}"),
            Figure("hetero_place", f"share of rows read from SSD bins (measured), {where}", "share", ssd["bytes"],
                   ssd["padded"], "DDAK with rows padded to the widest type", higher_is_better=False, note=note),
            Figure("hetero_place", f"GPU+host share of bytes read, independent pre-sample, {where}", "share",
                   cache["bytes"], cache["padded"], "DDAK with rows padded to the widest type", note=note)]
    write(args.json, "bench_hetero_place", figs, " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
