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
  ``bytes / read_bytes_per_s``. Where the profile measured every SSD the
  placement reads (``device_rates`` keyed by the plan's device ids, as the
  placement's bins name them), each device's requests (its bins') over ITS
  IOPS, and the tier's time is the sum over the devices when the store reads a
  gather's bins one after another, the busiest device's (the max) when it reads
  them at once (``concurrent_bins``). Without per-device rates, the tier's
  requests over the devices' summed IOPS (every device busy at equal load);
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

__all__ = ["DeviceFigures", "EpochPrediction", "TierFigures", "TierRate", "device_figures",
           "device_rates_from_capacities", "pages_per_row", "predict_epoch", "rates_from_capacities",
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
class DeviceFigures:
    """One SSD in one epoch: its bins' predicted read requests, its measured IOPS, the seconds they predict,
    and the requests the store counted on its bins (``None``: not counted)."""

    device: str
    predicted_requests: float
    read_iops: float
    predicted_s: float
    measured_requests: float | None = None


@dataclass(frozen=True)
class EpochPrediction:
    """Every tier of one epoch; ``io`` figures sum the tiers that read from a device (the SSDs).

    ``devices``: the SSD tier per device where every device's IOPS is known (the SSD tier's
    predicted time is then their sum, or with ``concurrent_bins`` their max); empty otherwise.
    """

    epoch: int
    tiers: tuple[TierFigures, ...]
    devices: tuple[DeviceFigures, ...] = ()
    concurrent_bins: bool = False

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
                "tiers": [{**asdict(t), "error": t.error, "bytes_error": t.bytes_error} for t in self.tiers],
                "devices": [asdict(d) for d in self.devices],
                "ssd_time_model": (None if not self.devices else "max over devices" if self.concurrent_bins
                                   else "sum over devices")}


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


def device_rates_from_capacities(caps) -> dict[str, TierRate]:
    """Each measured SSD's rate from a :class:`planner.capacities.Capacities`, keyed as the file keys it
    (``dev:ssd0`` for :func:`iostack.bench.loopssds.capacities_for_spec`'s; a plan's SSD node id matches
    it); ``iops`` only where it was measured at one page per read."""
    return {d.key: TierRate(d.read_iops if d.read.block_bytes in (None, PAGE) else None, d.read_bytes_per_s,
                            d.read.tool or "capacities") for d in caps.devices}


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
                  shared: bool = False, ssd_devices: Sequence[str] = (),
                  device_rates: Mapping[str, TierRate] | None = None, concurrent_bins: bool = False,
                  device_requests: Mapping[str, float] | None = None) -> EpochPrediction:
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

    ``ssd_devices``: the device of each of ``ssd_bins`` (the plan's SSD node id, as
    ``place.json``'s bins name it); ``device_rates``: each device's rate
    (:func:`device_rates_from_capacities`). Where every device has its IOPS, the SSD
    time is per device (:func:`device_figures`): the sum over the devices, or with
    ``concurrent_bins`` (the store reads a gather's bins at once) the max.
    ``device_requests``: the requests the store counted per device, for the record.

    >>> bins = [(1.0, 100_000)]
    >>> m = {"ssd": {"rows": 2000, "bytes": 2000 * 1024, "requests": 0, "seconds": 1.0}}
    >>> r = {"ssd": TierRate(iops=1000.0, bytes_per_s=None, source="fio")}
    >>> [round(predict_epoch(0, {"ssd": 1.0}, m, row_bytes=1024, rates=r, steps=1, ssd_bins=bins,
    ...                      readers=k, shared=sh).predicted_io_s, 3) for k, sh in ((1, False), (2, False), (2, True))]
    [1.774, 3.549, 3.15]
    """
    total = sum(float(m.get("bytes", 0.0)) for m in measured.values())
    total_rows = sum(float(m.get("rows", 0.0)) for m in measured.values())
    devices = device_figures(total_rows, steps, ssd_bins, ssd_devices, device_rates or {}, row_bytes=row_bytes,
                             readers=readers, shared=shared, measured=device_requests)
    out = []
    for tier in sorted(set(shares) | set(measured)):
        share = float(shares.get(tier, 0.0))
        m = measured.get(tier, {})
        nbytes = share * total
        rate = rates.get(tier)
        pred_s = None
        if rate is not None:
            k = max(1, int(readers))
            if tier == "ssd" and devices:
                times = [d.predicted_s for d in devices]
                pred_s = max(times) if concurrent_bins else sum(times)
            elif tier == "ssd" and rate.iops and steps and ssd_bins:
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
    return EpochPrediction(epoch, tuple(out), devices, bool(concurrent_bins) and bool(devices))


def device_figures(rows_per_epoch: float, steps: int | None, ssd_bins: Sequence[tuple[float, int]],
                   ssd_devices: Sequence[str], device_rates: Mapping[str, TierRate], *, row_bytes: int,
                   readers: int = 1, shared: bool = False,
                   measured: Mapping[str, float] | None = None) -> tuple[DeviceFigures, ...]:
    """Each SSD's predicted requests (:func:`ssd_requests` of its own bins) and seconds at its own IOPS.

    ``ssd_devices[i]`` is the device of ``ssd_bins[i]``; devices in first-seen order. ``readers`` and
    ``shared`` as :func:`predict_epoch`'s. Empty where a bin has no device, a device no IOPS, or
    ``steps`` is unknown: the caller then falls back to the tier's summed rate.

    >>> r = {"a": TierRate(1000.0, None, "fio"), "b": TierRate(250.0, None, "fio")}
    >>> [(d.device, d.predicted_requests, d.predicted_s) for d in
    ...  device_figures(1000, 1, [(0.5, 10**6), (0.5, 10**6)], ["a", "b"], r, row_bytes=4096)]
    [('a', 500.0, 0.5), ('b', 500.0, 2.0)]
    """
    if not steps or not ssd_bins or len(ssd_devices) != len(ssd_bins):
        return ()
    mine: dict[str, list[tuple[float, int]]] = {}
    for b, dev in zip(ssd_bins, ssd_devices, strict=True):
        mine.setdefault(dev, []).append(b)
    k = max(1, int(readers))
    out = []
    for dev, bins in mine.items():
        rate = device_rates.get(dev)
        if rate is None or not rate.iops:
            return ()
        req = (ssd_requests(k * rows_per_epoch, steps, bins, row_bytes) if shared and k > 1
               else k * ssd_requests(rows_per_epoch, steps, bins, row_bytes))
        got = measured.get(dev) if measured else None
        out.append(DeviceFigures(dev, req, float(rate.iops), req / rate.iops, None if got is None else float(got)))
    return tuple(out)


def load_place_report(placement_dir: str | Path) -> JsonObject | None:
    """``place.json`` of a placement directory, or ``None`` (a placement made through the library)."""
    try:
        return json.loads((Path(placement_dir) / "place.json").read_text())
    except (OSError, ValueError):
        return None
