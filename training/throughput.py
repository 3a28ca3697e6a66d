"""The prediction in the paper's terms: an epoch's throughput and per-GPU inlet against the plan's, each SSD's share.

The paper (§4.4, Figure 13) holds the flow model's throughput against the measured one: the
bytes per second of features each GPU takes in (its *inlet*), and with them the training
throughput. :mod:`training.prediction` checks the plan per tier (bytes and read seconds); this
module turns one epoch into those terms:

* **measured**: the feature bytes this rank read in the epoch (every tier) over the epoch's wall
  time, and its seeds per second;
* **plan**: the flow model's inlet for this rank's GPU (``place.json``'s
  ``plan_inlet_bytes_per_s``, from :attr:`planner.handoff.PlanTargets.inlet_bytes_per_s`; rank
  ``i`` of a node is the plan's ``i``-th GPU); its seeds/s are the measured seeds per byte at that
  rate;
* **profile**: the per-tier prediction's time (:func:`training.prediction.predict_epoch`, the
  profiled rates of ``moment profile``) turned into bytes per second;
* **per SSD**: each SSD bin's share of the SSD reads measured, against the plan's target share
  and the share the placement expected.

When the flow model applies
---------------------------
The flow model is a bandwidth model: the time it predicts is bytes over a rate. Two things it
does not have make it inapplicable, and the record says so (``applies``, ``why_not``):

* **too small / latency-bound.** Every read call of a batch to an SSD bin also costs a fixed
  latency (the request's trip to the device and back, the call itself): about
  :data:`CALL_LATENCY_S` each, whatever its size. With ``calls`` such calls in the epoch, that adds
  ``calls × latency`` to the ``bytes / rate`` the model predicts; the model is taken to apply
  when that addition is at most ``1 / LATENCY_MARGIN`` (10%) of its prediction, i.e. when
  ``bytes / rate ≥ LATENCY_MARGIN × calls × latency``. 10% is the paper's own accuracy
  (max error 8.61%): below that margin, the latency left out alone is a larger error than the
  one the model is checked for. A tiny graph (Cora: a few pages per bin per batch) is far below.
* **compute-bound.** Throughput follows the I/O only when the training thread waits for its
  features: the model is taken to apply when the I/O wait is at least :data:`IO_BOUND_SHARE`
  (half) of the epoch. Below, sampling and compute set the epoch's time and the plan's rate is
  a ceiling, not a forecast (the measured throughput is then below it by design).

>>> rec = {"epoch": 0, "epoch_s": 2.0, "seeds": 1000, "io_wait_share": 0.8,
...        "tiers": {"ssd": {"rows": 500, "bytes": 2e9}, "cpu": {"rows": 500, "bytes": 2e9}}}
>>> t = epoch_throughput(rec, plan_inlet={"gpu0": 2.5e9}, read_calls=100)
>>> t.measured_bytes_per_s, round(t.plan_error, 3), t.applies
(2000000000.0, 0.25, True)
>>> epoch_throughput({**rec, "io_wait_share": 0.1}, plan_inlet={"gpu0": 2.5e9}).why_not[0][:14]
'compute-bound:'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from momentbase.jsontypes import JsonObject, JsonValue
from training.prediction import EpochPrediction

__all__ = ["CALL_LATENCY_S", "IO_BOUND_SHARE", "LATENCY_MARGIN", "DeviceShare", "Throughput", "applicability",
           "describe", "epoch_throughput", "plan_inlet_from_place_report", "ssd_targets_from_place_report"]

#: the fixed cost of one read call to an SSD bin, seconds: a 4 KiB random read's latency at queue depth 1 on
#: an NVMe SSD is of the order of 100 µs; the read call around it (tools/bench_contention.py) no less
CALL_LATENCY_S = 100e-6
#: the flow model applies when its bandwidth time is at least this many times the epoch's call latencies
LATENCY_MARGIN = 10.0
#: the flow model applies when the training thread waited for features at least this share of the epoch
IO_BOUND_SHARE = 0.5


@dataclass(frozen=True)
class DeviceShare:
    """One SSD bin in one epoch: its share of the SSD reads (rows) measured, the plan's target share
    and the placement's expected share (all shares of the SSD tier's reads; ``None``: not known)."""

    bin: int
    device: str
    measured_share: float
    target_share: float
    expected_share: float | None
    #: the seconds the prediction gives its device's reads this epoch (``None``: no per-device rate)
    predicted_s: float | None = None

    @property
    def deviation(self) -> float | None:
        """``measured / target - 1`` (``None`` for a zero target)."""
        return self.measured_share / self.target_share - 1.0 if self.target_share > 0 else None


@dataclass(frozen=True)
class Throughput:
    """One rank's epoch in the paper's terms (bytes/s of features, seeds/s), predicted against measured.

    ``plan_bytes_per_s``: the plan's inlet of this rank's GPU ``plan_gpu`` (``None``: the placement
    holds no plan rates); ``plan_gpus`` GPUs read at once in the plan, ``readers`` ranks of this node in
    the run. ``profile_bytes_per_s``: the per-tier prediction's rate (``None`` without profiled rates
    for every tier read). ``applies``: whether the flow model applies to this epoch (see the module);
    ``why_not`` says why not, with the threshold.
    """

    epoch: int
    feature_bytes: float
    seeds: int
    epoch_s: float
    io_wait_share: float
    plan_gpu: str | None
    plan_bytes_per_s: float | None
    plan_gpus: int
    readers: int
    profile_bytes_per_s: float | None
    read_calls: int
    call_latency_s: float
    applies: bool
    why_not: tuple[str, ...]
    devices: tuple[DeviceShare, ...] = ()
    #: the machine the plan was made for (``place.json``'s ``machine``; its rates are that machine's)
    plan_machine: str | None = None

    @property
    def measured_bytes_per_s(self) -> float:
        return self.feature_bytes / self.epoch_s if self.epoch_s > 0 else 0.0

    @property
    def measured_seeds_per_s(self) -> float:
        return self.seeds / self.epoch_s if self.epoch_s > 0 else 0.0

    def _seeds_at(self, rate: float | None) -> float | None:
        return self.seeds * rate / self.feature_bytes if rate and self.feature_bytes > 0 else None

    @property
    def plan_seeds_per_s(self) -> float | None:
        """Seeds per second at the plan's inlet (this epoch's seeds per byte)."""
        return self._seeds_at(self.plan_bytes_per_s)

    @property
    def profile_seeds_per_s(self) -> float | None:
        return self._seeds_at(self.profile_bytes_per_s)

    @property
    def plan_error(self) -> float | None:
        """``plan / measured - 1`` of the bytes per second."""
        m = self.measured_bytes_per_s
        return self.plan_bytes_per_s / m - 1.0 if self.plan_bytes_per_s and m > 0 else None

    @property
    def profile_error(self) -> float | None:
        m = self.measured_bytes_per_s
        return self.profile_bytes_per_s / m - 1.0 if self.profile_bytes_per_s and m > 0 else None

    @property
    def max_device_deviation(self) -> float | None:
        """The largest ``|measured / target - 1|`` over the SSD bins with a target."""
        devs = [abs(d.deviation) for d in self.devices if d.deviation is not None]
        return max(devs) if devs else None

    def to_dict(self) -> JsonObject:
        out: JsonObject = asdict(self)
        out["why_not"] = list(self.why_not)
        out["devices"] = [{**asdict(d), "deviation": d.deviation} for d in self.devices]
        for k in ("measured_bytes_per_s", "measured_seeds_per_s", "plan_seeds_per_s", "profile_seeds_per_s",
                  "plan_error", "profile_error", "max_device_deviation"):
            out[k] = getattr(self, k)
        out["thresholds"] = {"call_latency_s": self.call_latency_s, "latency_margin": LATENCY_MARGIN,
                             "io_bound_share": IO_BOUND_SHARE}
        return out


def applicability(feature_bytes: float, bytes_per_s: float | None, read_calls: int, io_wait_share: float, *,
                  call_latency_s: float = CALL_LATENCY_S) -> tuple[str, ...]:
    """Why the flow model does not apply to an epoch (empty: it applies); the thresholds are the module's.

    >>> applicability(1e6, 1e9, 100, 0.9)[0][:13]   # 1 ms of bandwidth time against 100 calls of 100 µs
    'latency-bound'
    >>> applicability(1e9, 1e9, 100, 0.9)
    ()
    """
    out = []
    if bytes_per_s and read_calls > 0:
        model_s, fixed_s = feature_bytes / bytes_per_s, read_calls * call_latency_s
        if model_s < LATENCY_MARGIN * fixed_s:
            out.append(f"latency-bound (too small for the flow model): the epoch's {feature_bytes / 1e6:,.1f} MB at "
                       f"{bytes_per_s / 1e9:.3g} GB/s take {model_s * 1e3:.3g} ms, under {LATENCY_MARGIN:g}x its "
                       f"{read_calls:,} SSD read calls x {call_latency_s * 1e6:.0f} us each "
                       f"({fixed_s * 1e3:.3g} ms): the fixed per-call latency the model leaves out is over "
                       f"{1 / LATENCY_MARGIN:.0%} of what it predicts")
    if io_wait_share < IO_BOUND_SHARE:
        out.append(f"compute-bound: the training thread waited for features {io_wait_share:.0%} of the epoch "
                   f"(under {IO_BOUND_SHARE:.0%}): sampling and compute set its time, the plan's rate is a "
                   "ceiling, not a forecast")
    return tuple(out)


def _device_shares(bin_rows: Mapping[int, float], targets: Sequence[tuple[int, str, float, float | None]],
                   predicted_s: Mapping[str, float] | None = None) -> tuple[DeviceShare, ...]:
    rows = {b: float(bin_rows.get(b, 0.0)) for b, _, _, _ in targets}
    total, t_sum = sum(rows.values()), sum(t for _, _, t, _ in targets)
    e_known = [e for _, _, _, e in targets if e is not None]
    e_sum = sum(e_known) if len(e_known) == len(targets) else 0.0
    if total <= 0:
        return ()
    return tuple(DeviceShare(b, dev, rows[b] / total, t / t_sum if t_sum > 0 else 0.0,
                             e / e_sum if e is not None and e_sum > 0 else None, (predicted_s or {}).get(dev))
                 for b, dev, t, e in targets)


def epoch_throughput(record: Mapping[str, JsonValue], prediction: EpochPrediction | None = None, *,
                     plan_inlet: Mapping[str, float] | None = None, rank_index: int = 0, readers: int = 1,
                     read_calls: int = 0, bin_rows: Mapping[int, float] | None = None,
                     ssd_targets: Sequence[tuple[int, str, float, float | None]] = (),
                     call_latency_s: float = CALL_LATENCY_S, plan_machine: str | None = None) -> Throughput:
    """One epoch record (:func:`training.metrics.epoch_record`: ``epoch_s``, ``seeds``, ``io_wait_share``,
    ``tiers``) in the paper's terms.

    ``prediction``: the epoch's per-tier prediction (its predicted seconds give the profile's rate);
    ``plan_inlet``: the plan's inlet per GPU, bytes/s (:func:`plan_inlet_from_place_report`);
    ``rank_index``: this rank's place among the node's (its GPU is the plan's GPU of that index, in the
    plan's order); ``readers``: the node's ranks; ``read_calls``: the epoch's read calls to SSD bins;
    ``bin_rows``: rows read per bin id in the epoch; ``ssd_targets``: ``(bin id, device, target share,
    expected share)`` per SSD bin (:func:`ssd_targets_from_place_report`); ``plan_machine``: the plan's machine.
    ``seeds`` are the run's (all ranks'), bytes this rank's: ranks step in lock-step, so the run's seeds/s at
    the plan's rate are its seeds over this rank's bytes at that rate.
    """
    tiers = record.get("tiers") or {}
    feature_bytes = float(sum(float(v.get("bytes", 0)) for v in tiers.values() if isinstance(v, Mapping)))
    epoch_s, io_wait = float(record.get("epoch_s") or 0.0), float(record.get("io_wait_share") or 0.0)
    gpus = list(plan_inlet or {})
    gpu = gpus[rank_index] if 0 <= rank_index < len(gpus) else None
    plan_rate = float(plan_inlet[gpu]) if plan_inlet and gpu is not None else None
    profile_rate = None
    if prediction is not None:
        read = [t for t in prediction.tiers if t.measured_bytes > 0 or t.predicted_bytes > 0]
        # the GPU tier's reads are on the device: no time the profile predicts, none the plan's inlet counts
        timed = [t for t in read if t.tier not in ("gpu", "gpu-peer")]
        secs = [t.predicted_s for t in timed]
        if timed and None not in secs:
            total_s = sum(s for s in secs if s is not None)
            profile_rate = feature_bytes / total_s if total_s > 0 else None
    per_device = {d.device: d.predicted_s for d in prediction.devices} if prediction is not None else None
    why_not = applicability(feature_bytes, plan_rate or profile_rate, read_calls, io_wait,
                            call_latency_s=call_latency_s)
    return Throughput(int(record.get("epoch") or 0), feature_bytes, int(record.get("seeds") or 0), epoch_s, io_wait,
                      gpu, plan_rate, len(gpus), max(1, int(readers)), profile_rate, int(read_calls), call_latency_s,
                      not why_not, why_not, _device_shares(bin_rows or {}, ssd_targets, per_device), plan_machine)


def plan_inlet_from_place_report(report: Mapping[str, JsonValue]) -> dict[str, float]:
    """The plan's inlet per GPU (bytes/s) that ``place.json`` recorded, in the plan's GPU order; ``{}`` for a
    placement made before it recorded them (``moment place`` again adds them)."""
    got = report.get("plan_inlet_bytes_per_s")
    return {str(g): float(v) for g, v in got.items()} if isinstance(got, Mapping) else {}


def ssd_targets_from_place_report(report: Mapping[str, JsonValue]) -> list[tuple[int, str, float, float | None]]:
    """``(bin id, device, the plan's target share, the placement's expected share)`` per SSD bin of ``place.json``."""
    bins = report.get("bins") or []
    held = report.get("expected_shares")
    rep = (report.get("report") or {}).get("bins") or []
    out: list[tuple[int, str, float, float | None]] = []
    for i, b in enumerate(bins):
        if b.get("kind") != "ssd":
            continue
        expected: float | None
        if held and len(held) == len(bins):
            expected = float(held[i])
        else:
            expected = float(rep[i]["traffic_share"]) if i < len(rep) else None
        out.append((i, str(b.get("device") or f"bin{i}"), float(b.get("target_share") or 0.0), expected))
    return out


def _off(error: JsonValue) -> str:
    if not isinstance(error, (int, float)):
        return ""
    return f" ({1 + error:.3g}x the run's)" if abs(error) > 1 else f" ({100 * error:+.1f}% against the run)"


def describe(t: Mapping[str, JsonValue]) -> list[str]:
    """Lines for a reader from a :meth:`Throughput.to_dict` record (the CLI's summary, ``moment report``)."""
    gb = 1e9
    head = (f"feature reads {t['measured_bytes_per_s'] / gb:.3g} GB/s measured, "
            f"{t['measured_seeds_per_s']:,.0f} seeds/s")
    if t.get("plan_bytes_per_s"):
        of = f"{t['plan_machine']}, " if t.get("plan_machine") else ""
        head += (f"; plan ({of}inlet of {t['plan_gpu']}, {t['plan_gpus']} GPU(s) reading) "
                 f"{t['plan_bytes_per_s'] / gb:.3g} GB/s, {t['plan_seeds_per_s'] or 0:,.0f} seeds/s"
                 f"{_off(t.get('plan_error'))}")
    else:
        head += "; no plan rate in the placement (place it again with `moment place` to record the plan's inlet)"
    if t.get("profile_bytes_per_s"):
        head += (f"; profile {t['profile_bytes_per_s'] / gb:.3g} GB/s, {t['profile_seeds_per_s'] or 0:,.0f} seeds/s"
                 f"{_off(t.get('profile_error'))}")
    lines = [head]
    devices = t.get("devices") or []
    if devices:
        lines.append("SSD reads per device, measured vs the plan's target: " + ", ".join(
            f"{d['device']} {d['measured_share']:.1%} vs {d['target_share']:.1%}"
            + (f" ({d['predicted_s']:.3g} s predicted)" if d.get("predicted_s") is not None else "")
            for d in devices))
    if t.get("applies"):
        lines.append("the flow model applies: the epoch is I/O-bound and large enough")
    else:
        lines += [f"the flow model does not apply: {w}" for w in t.get("why_not") or ()]
    return lines
