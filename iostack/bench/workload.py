"""What ``moment bench emulate`` replays: the workload description and its YAML reader.

A :class:`Workload` names the data, the access stream, the emulated compute, the
readers, prefetch depth, checkpoint writes and epochs (``docs/emulate.md``);
:func:`load_workload` reads one from YAML, :func:`workload_from_dict` from a mapping.
:mod:`iostack.bench.emulate` replays it.

>>> w = workload_from_dict({"data": {"synthetic": {"rows": 1000, "row_bytes": 4096, "dir": "/tmp"}},
...                         "stream": {"kind": "uniform", "rows_per_step": 64, "steps": 3}})
>>> w.stream.kind, w.compute.seconds_per_step, w.readers
('uniform', 0.0, 1)
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iostack.backends import backend_choices
from iostack.errors import StoreError
from momentbase.jsontypes import JsonValue


class WorkloadError(StoreError):
    """A workload file or value that cannot be emulated (the message names the key and the fix)."""


# --- the workload ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SyntheticData:
    """One SSD bin of ``rows`` random rows of ``row_bytes`` in ``dir`` (written once, then reused)."""

    rows: int
    row_bytes: int
    dir: str


@dataclass(frozen=True)
class StreamSpec:
    """Which rows each step reads: ``recorded`` (a ``.npz`` from :func:`save_stream`), ``uniform``
    or ``zipf`` (``exponent``; id ``k`` drawn with weight ``(k + 1) ** -exponent``)."""

    kind: str
    path: str | None = None
    rows_per_step: int = 0
    steps: int = 0
    exponent: float = 1.0
    seed: int = 0


#: where the emulated compute (and sampling) runs: ``device`` sleeps, as DLIO emulates an
#: accelerator's step (the host stays free); ``host`` keeps the host's cores busy for the time,
#: as a run that trained on the CPU did; ``auto``: ``host`` when ``from_metrics`` is of a CPU run
COMPUTE_ON = ("auto", "device", "host")


@dataclass(frozen=True)
class ComputeSpec:
    """Emulated compute per step: a fixed ``seconds_per_step``, or per step from a ``moment train``
    metrics file (its steps' compute + all-reduce time, and sampling time for the preparing thread);
    ``on`` (:data:`COMPUTE_ON`): whether that time occupies the host's cores or an accelerator."""

    seconds_per_step: float = 0.0
    from_metrics: str | None = None
    on: str = "auto"


@dataclass(frozen=True)
class CheckpointSpec:
    """A checkpoint of ``bytes`` written to ``dir`` every ``every_steps`` steps (0: none)."""

    bytes: int = 0
    every_steps: int = 0
    dir: str | None = None


@dataclass(frozen=True)
class Workload:
    """Everything :func:`emulate` needs (see the module docstring)."""

    name: str
    placement: str | None
    synthetic: SyntheticData | None
    stream: StreamSpec
    compute: ComputeSpec = field(default_factory=ComputeSpec)
    readers: int = 1
    prefetch: int = 2
    epochs: int = 1
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    backend: str = "auto"
    features: str | None = None


def _num(section: Mapping[str, JsonValue], key: str, where: str, kind: type = int, default: Any = None,
         minimum: float = 0) -> Any:
    v = section.get(key, default)
    if v is None:
        raise WorkloadError(f"{where}.{key}: missing; give a number")
    if isinstance(v, str) and kind is int and key in ("bytes", "row_bytes"):
        from momentbase.units import parse_size

        try:
            v = parse_size(v)
        except Exception:  # noqa: BLE001 - parse_size's own error, re-worded with the key
            raise WorkloadError(f"{where}.{key}: {v!r} is not a size like 4KiB or 256MiB") from None
    try:
        x = kind(float(v)) if kind is int else kind(v)
    except (TypeError, ValueError, OverflowError):  # int(float("inf")) overflows
        raise WorkloadError(f"{where}.{key}: {v!r} is not a number") from None
    if not math.isfinite(x):  # nan passes every comparison below
        raise WorkloadError(f"{where}.{key}: {v!r} is not a finite number")
    if x < minimum:
        raise WorkloadError(f"{where}.{key}: {x} is below {minimum}")
    return x


def _section(d: Mapping[str, JsonValue], key: str, where: str = "") -> Mapping[str, JsonValue]:
    v = d.get(key) or {}
    if not isinstance(v, Mapping):
        raise WorkloadError(f"{where}{key}: expected a mapping of keys, got {type(v).__name__}")
    return v


def workload_from_dict(d: Mapping[str, JsonValue], base: str | os.PathLike[str] = ".") -> Workload:
    """A validated :class:`Workload` from parsed YAML; relative paths resolve against ``base``.

    Raises :class:`WorkloadError` naming the key for a missing or bad value.
    """
    if not isinstance(d, Mapping):
        raise WorkloadError("the workload: expected a mapping of keys (name, data, stream, ...)")
    known = {"name", "data", "stream", "compute", "readers", "prefetch", "epochs", "checkpoint", "backend"}
    unknown = set(d) - known
    if unknown:
        raise WorkloadError(f"unknown key(s) {', '.join(sorted(unknown))}; expected {', '.join(sorted(known))}")

    def path(p: Any) -> str:
        return str(Path(base) / str(p)) if not Path(str(p)).is_absolute() else str(p)

    data = _section(d, "data")
    placement = synthetic = None
    features = None
    if "placement" in data and "synthetic" in data:
        raise WorkloadError("data: give placement or synthetic, not both")
    if "placement" in data:
        placement = path(data["placement"])
        features = path(data["features"]) if data.get("features") else None
    elif "synthetic" in data:
        s = _section(data, "synthetic", "data.")
        if "dir" not in s:
            raise WorkloadError("data.synthetic.dir: missing; name a directory on the SSD to test")
        synthetic = SyntheticData(_num(s, "rows", "data.synthetic", minimum=1),
                                  _num(s, "row_bytes", "data.synthetic", minimum=1), path(s["dir"]))
    else:
        raise WorkloadError("data: missing; give {placement: DIR} (a moment place output) or "
                            "{synthetic: {rows: N, row_bytes: B, dir: DIR}}")
    st = _section(d, "stream")
    kind = st.get("kind")
    if kind not in ("recorded", "uniform", "zipf"):
        raise WorkloadError(f"stream.kind: {kind!r}; expected recorded, uniform or zipf")
    if kind == "recorded":
        if "path" not in st:
            raise WorkloadError("stream.path: missing; a recorded stream (.npz from `training.stream.record_stream`)")
        stream = StreamSpec("recorded", path(st["path"]))
    else:
        stream = StreamSpec(kind, None, _num(st, "rows_per_step", "stream", minimum=1),
                            _num(st, "steps", "stream", minimum=1),
                            _num(st, "exponent", "stream", float, 1.0, minimum=0.0),
                            _num(st, "seed", "stream", int, 0))
    c = _section(d, "compute")
    on = str(c.get("on", "auto"))
    if on not in COMPUTE_ON:
        raise WorkloadError(f"compute.on: {on!r}; expected {', '.join(COMPUTE_ON)}")
    compute = ComputeSpec(_num(c, "seconds_per_step", "compute", float, 0.0),
                          path(c["from_metrics"]) if c.get("from_metrics") else None, on)
    ck = _section(d, "checkpoint")
    checkpoint = CheckpointSpec(_num(ck, "bytes", "checkpoint", int, 0), _num(ck, "every_steps", "checkpoint", int, 0),
                                path(ck["dir"]) if ck.get("dir") else None)
    if checkpoint.bytes and checkpoint.every_steps and checkpoint.dir is None:
        raise WorkloadError("checkpoint.dir: missing; name where checkpoints are written")
    backend = str(d.get("backend", "auto"))
    if backend not in backend_choices():
        raise WorkloadError(f"backend: {backend!r}; expected one of {', '.join(backend_choices())}")
    return Workload(str(d.get("name", "workload")), placement, synthetic, stream, compute,
                    _num(d, "readers", "", int, 1, minimum=1), _num(d, "prefetch", "", int, 2),
                    _num(d, "epochs", "", int, 1, minimum=1), checkpoint, backend, features)


def load_workload(path: str | os.PathLike[str]) -> Workload:
    """Read a workload YAML file (``docs/emulate.md``)."""
    import yaml

    p = Path(path)
    try:
        d = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise WorkloadError(f"{p}: no such workload file") from None
    except (OSError, yaml.YAMLError) as exc:
        raise WorkloadError(f"{p}: not readable YAML ({exc})") from None
    try:
        return workload_from_dict(d, p.parent)
    except WorkloadError as exc:
        raise WorkloadError(f"{p}: {exc}") from None


# --- streams -----------------------------------------------------------------------------------
