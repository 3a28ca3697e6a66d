"""The plan's prediction against what training measures, per epoch and per tier.

``moment place`` writes, in ``place.json``, the share of the reads each bin is
expected to serve (the hotness through the placement: what DDAK aimed at the
plan's targets). ``moment profile`` measures what each store delivers (an SSD's
random reads per second at a request size, a memory's bandwidth). Together they
predict an epoch's I/O: given the bytes the model reads in the epoch (the
demand, as the flow model takes it), each tier serves its share, and each
tier's reads take

* SSD: ``requests / read_iops`` at the profiled random-read rate. Rows of
  whole pages are read one request each, straight into the batch; smaller rows
  are packed several to a 4 KiB page, and the pages a batch touches that lie
  side by side go as one request (:func:`ssd_requests`). Without IOPS:
  ``bytes / read_bytes_per_s``;
* host memory: ``bytes / bandwidth`` of the NUMA node's memory.

Training measures per tier the rows, bytes, requests and the seconds the
store's reads took (:meth:`iostack.store.FeatureStore.tier_stats`). The error
is ``predicted / measured - 1``. What a prediction cannot know is said in the
record: a tier without a measured rate has no predicted time.

>>> p = predict_epoch(0, {"ssd": 0.5, "cpu": 0.5},
...                   {"ssd": {"rows": 900, "bytes": 900 * 4096, "requests": 900, "seconds": 0.010},
...                    "cpu": {"rows": 1100, "bytes": 1100 * 4096, "requests": 0, "seconds": 0.001}},
...                   row_bytes=4096, rates={"ssd": TierRate(iops=100_000.0, bytes_per_s=None, source="fio")})
>>> s = p.tier("ssd"); (s.predicted_bytes, round(s.predicted_s, 4), round(s.measured_s, 4), round(s.error, 2))
(4096000.0, 0.01, 0.01, 0.0)
>>> p.tier("cpu").predicted_s is None
True
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from momentbase.jsontypes import JsonObject, JsonValue

__all__ = ["EpochPrediction", "TierFigures", "TierRate", "pages_per_row", "predict_epoch", "rates_from_capacities",
           "shares_from_place_report", "ssd_bins_from_place_report", "ssd_requests"]

PAGE = 4096
#: the posix backend's largest coalesced read (``max_read_bytes``, 128 KiB), in pages
MAX_READ_PAGES = 32


@dataclass(frozen=True)
class TierRate:
    """What one tier delivers: random reads per second of one page (``iops``) and/or bytes per second."""

    iops: float | None
    bytes_per_s: float | None
    source: str


@dataclass(frozen=True)
class TierFigures:
    """One tier in one epoch: predicted and measured bytes, and seconds of reads (``None``: no rate known)."""

    tier: str
    predicted_share: float
    predicted_bytes: float
    measured_bytes: float
    predicted_s: float | None
    measured_s: float | None
    rate_source: str | None
    measured_requests: float = 0.0
    #: of ``measured_s``, the reading threads' wait for a core (a loaded machine's share; 0.0: not measured)
    measured_cpu_wait_s: float = 0.0

    @property
    def error(self) -> float | None:
        """``predicted_s / measured_s - 1`` (``None`` where either is unknown or nothing was measured)."""
        if self.predicted_s is None or not self.measured_s:
            return None
        return self.predicted_s / self.measured_s - 1.0

    @property
    def bytes_error(self) -> float | None:
        return self.predicted_bytes / self.measured_bytes - 1.0 if self.measured_bytes else None


@dataclass(frozen=True)
class EpochPrediction:
    """Every tier of one epoch; ``io`` figures sum the tiers that read from a device (the SSDs)."""

    epoch: int
    tiers: tuple[TierFigures, ...]

    def tier(self, name: str) -> TierFigures:
        return next(t for t in self.tiers if t.tier == name)

    @property
    def predicted_io_s(self) -> float | None:
        times = [t.predicted_s for t in self.tiers if t.tier == "ssd"]
        return None if not times or None in times else sum(s for s in times if s is not None)

    @property
    def measured_io_s(self) -> float | None:
        ssd = [t for t in self.tiers if t.tier == "ssd"]
        return sum(t.measured_s or 0.0 for t in ssd) if ssd else None

    @property
    def io_error(self) -> float | None:
        p, m = self.predicted_io_s, self.measured_io_s
        return p / m - 1.0 if p is not None and m else None

    def to_dict(self) -> JsonObject:
        return {"epoch": self.epoch, "predicted_io_s": self.predicted_io_s, "measured_io_s": self.measured_io_s,
                "io_error": self.io_error,
                "tiers": [{**asdict(t), "error": t.error, "bytes_error": t.bytes_error} for t in self.tiers]}


def pages_per_row(row_bytes: int) -> int:
    """4 KiB pages one row's read costs in an SSD bin (rows of at most 2 KiB never straddle a page).

    >>> pages_per_row(512), pages_per_row(4096), pages_per_row(6000)
    (1, 1, 2)
    """
    return 1 if row_bytes <= PAGE // 2 else -(-row_bytes // PAGE)


def ssd_bins_from_place_report(report: Mapping[str, JsonValue]) -> list[tuple[float, int]]:
    """``(expected share of all reads, rows)`` of every SSD bin in ``place.json``."""
    bins = report["report"]["bins"]
    held = report.get("expected_shares")
    return [(float(held[i]) if held and len(held) == len(bins) else float(b["traffic_share"]), int(b["rows"]))
            for i, b in enumerate(bins) if b["kind"] == "ssd"]


def shares_from_place_report(report: Mapping[str, JsonValue]) -> dict[str, float]:
    """Expected share of the reads per tier (``gpu``, ``cpu``, ``ssd``) from ``place.json``.

    The shares under the independent pre-sample where the report has them
    (``expected_shares``), else the shares under the hotness the placement was
    made from (which flatter a fitted placement).
    """
    bins = report["report"]["bins"]
    held = report.get("expected_shares")
    out: dict[str, float] = {}
    for i, b in enumerate(bins):
        share = float(held[i]) if held and len(held) == len(bins) else float(b["traffic_share"])
        out[b["kind"]] = out.get(b["kind"], 0.0) + share
    return out


def rates_from_capacities(caps) -> dict[str, TierRate]:
    """Tier rates from a :class:`planner.capacities.Capacities` (``moment profile``): the SSDs' reads
    summed over the measured devices, the host memories' bandwidth summed."""
    rates: dict[str, TierRate] = {}
    if caps.devices:
        iops = [d.read_iops for d in caps.devices]
        at_page = all(d.read.block_bytes in (None, PAGE) for d in caps.devices)
        rates["ssd"] = TierRate(sum(iops) if all(iops) and at_page else None,
                                sum(d.read_bytes_per_s for d in caps.devices),
                                ", ".join(sorted({d.read.tool or "capacities" for d in caps.devices})))
    if caps.memory:
        rates["cpu"] = TierRate(None, sum(m.bytes_per_s for m in caps.memory), "memory bandwidth (capacities)")
    return rates


def expected_runs(picks: float, units: int) -> float:
    """Contiguous runs that ``picks`` distinct units drawn at random out of ``units`` form, on average.

    >>> expected_runs(1, 100), expected_runs(100, 100), round(expected_runs(50, 100), 1)
    (1.0, 1.0, 25.5)
    """
    if picks <= 0 or units <= 0:
        return 0.0
    picks = min(float(picks), float(units))
    return max(1.0, picks - picks * (picks - 1) / units)


def ssd_requests(rows_per_epoch: float, steps: int, bins: Sequence[tuple[float, int]], row_bytes: int) -> float:
    """Read requests an epoch makes to the SSD bins (``iostack``'s posix backend).

    ``bins``: ``(share of all reads, rows)`` per SSD bin; ``rows_per_epoch``: all rows read (every
    tier); ``steps``: batches. Rows of whole pages (4 KiB, 8 KiB, ...) are read one request per row
    straight into the batch. Smaller rows are packed several to a page: a batch reads the distinct
    pages its rows touch, and touching pages go as one request; so do whole-page rows that are
    padded (their extents are read through staging and coalesced). A batch's rows of one bin are
    taken as spread at random over the bin. A coalesced read is at most 128 KiB.

    Not modelled: the time of each read call itself (a few hundred microseconds), which
    dominates when a batch reads only a few pages from a bin (a small graph, as in the demo).

    >>> ssd_requests(1000, 1, [(1.0, 10_000)], 4096)   # whole-page rows: one request each
    1000.0
    >>> round(ssd_requests(1000, 1, [(1.0, 10_000)], 256))  # 16 to a page: ~500 pages, coalesced
    101
    """
    steps = max(1, int(steps))
    per_page = PAGE // row_bytes if row_bytes <= PAGE // 2 else 1
    direct = row_bytes % PAGE == 0
    total = 0.0
    for share, rows in bins:
        r = share * rows_per_epoch / steps  # rows of this bin in one batch (distinct within a batch)
        if rows <= 0 or r <= 0:
            continue
        if direct:
            total += steps * r
        elif per_page > 1:
            pages = -(-rows // per_page)
            k = pages * (1.0 - (1.0 - 1.0 / pages) ** r)  # distinct pages touched
            total += steps * max(expected_runs(k, pages), k / MAX_READ_PAGES)
        else:
            stride = -(-row_bytes // PAGE)
            total += steps * max(expected_runs(r, rows), r * stride / MAX_READ_PAGES)
    return total


def predict_epoch(epoch: int, shares: Mapping[str, float], measured: Mapping[str, Mapping[str, float]], *,
                  row_bytes: int, rates: Mapping[str, TierRate], steps: int | None = None,
                  ssd_bins: Sequence[tuple[float, int]] = (), readers: int = 1,
                  shared: bool = False) -> EpochPrediction:
    """Predicted against measured figures of one epoch.

    ``shares``: expected share of the reads per tier; ``measured``: per tier
    ``rows``, ``bytes``, ``requests`` and ``seconds`` (the store's counters
    over the epoch); ``rates``: what each tier delivers. The demand is the
    bytes the epoch read over all tiers. ``steps`` and ``ssd_bins`` (``(share, rows)`` per SSD bin)
    give the SSD's requests (:func:`ssd_requests`); without them every row costs its pages.

    ``readers``: the ranks of this node that read the same SSDs as this one, each
    its own batches of the same size, at the same time (data-parallel steps run in
    lock-step). The SSDs serve all of them while this rank's reads run, so the SSD
    time predicted is the node's requests over the rate: ``readers`` times this
    rank's, or, with ``shared`` (node-shared reads: each page of a step read once
    for the node, split between the ranks), the requests of the union of their rows.

    >>> bins = [(1.0, 100_000)]
    >>> m = {"ssd": {"rows": 2000, "bytes": 2000 * 1024, "requests": 0, "seconds": 1.0}}
    >>> r = {"ssd": TierRate(iops=1000.0, bytes_per_s=None, source="fio")}
    >>> [round(predict_epoch(0, {"ssd": 1.0}, m, row_bytes=1024, rates=r, steps=1, ssd_bins=bins,
    ...                      readers=k, shared=sh).predicted_io_s, 3) for k, sh in ((1, False), (2, False), (2, True))]
    [1.774, 3.549, 3.15]
    """
    total = sum(float(m.get("bytes", 0.0)) for m in measured.values())
    total_rows = sum(float(m.get("rows", 0.0)) for m in measured.values())
    out = []
    for tier in sorted(set(shares) | set(measured)):
        share = float(shares.get(tier, 0.0))
        m = measured.get(tier, {})
        nbytes = share * total
        rate = rates.get(tier)
        pred_s = None
        if rate is not None:
            k = max(1, int(readers))
            if tier == "ssd" and rate.iops and steps and ssd_bins:
                node = (ssd_requests(k * total_rows, steps, ssd_bins, row_bytes) if shared and k > 1
                        else k * ssd_requests(total_rows, steps, ssd_bins, row_bytes))
                pred_s = node / rate.iops
            elif tier == "ssd" and rate.iops:  # without the bins, shared reads save nothing that is known
                pred_s = k * nbytes / row_bytes * pages_per_row(row_bytes) / rate.iops
            elif rate.bytes_per_s:
                pred_s = nbytes / rate.bytes_per_s
        secs = m.get("seconds")
        out.append(TierFigures(tier, share, nbytes, float(m.get("bytes", 0.0)), pred_s,
                               float(secs) if secs is not None and math.isfinite(secs) else None,
                               rate.source if rate else None, float(m.get("requests", 0.0)),
                               float(m.get("cpu_wait_s", 0.0))))
    return EpochPrediction(epoch, tuple(out))


def load_place_report(placement_dir: str | Path) -> JsonObject | None:
    """``place.json`` of a placement directory, or ``None`` (a placement made through the library)."""
    try:
        return json.loads((Path(placement_dir) / "place.json").read_text())
    except (OSError, ValueError):
        return None
