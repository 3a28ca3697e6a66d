"""fio, the reference reader: its command line, its JSON output, a run with engine fallback.

``moment profile`` (:mod:`hwprofile`) and the I/O benchmarks
(:mod:`iostack.bench.io`) measure the same random reads with fio beside
Moment's own reader; this module is the one place that runs it.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import shutil
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from momentbase.jsontypes import JsonObject
from momentbase.units import format_size
from planner.capacities import ReadMeasurement
from planner.errors import ParseError, ProfileError
from planner.progress import Progress, report

__all__ = ["FIO_ENGINES", "FioRun", "fio_command", "parse_fio_json", "fio_engines", "run_fio"]

#: fio engines tried in this order: asynchronous first
FIO_ENGINES = ("io_uring", "libaio", "psync")



@dataclass(frozen=True)
class FioRun:
    """What one fio run reported (its ``--output-format=json``), reads only."""

    version: str
    read_iops: float
    read_bytes_per_s: float
    read_bytes: int
    runtime_s: float
    total_ios: int
    engine: str | None
    iodepth: int | None
    numjobs: int
    block_bytes: int | None
    direct: bool | None
    error: int = 0


def fio_command(path: str | os.PathLike[str], *, block_bytes: int, queue_depth: int,
                seconds: float, file_bytes: int, direct: bool, engine: str,
                fio: str = "fio") -> list[str]:
    """The fio command line for a random-read test of an existing file.

    ``--readonly`` makes fio refuse any write, so a user's file is safe; an
    asynchronous engine keeps ``queue_depth`` reads in flight from one job,
    ``psync`` runs ``queue_depth`` threads of one read each.

    >>> fio_command("/d/f:1", block_bytes=4096, queue_depth=64, seconds=5, file_bytes=1 << 30,
    ...             direct=True, engine="io_uring")[1:4]
    ['--name=moment-randread', '--filename=/d/f\\\\:1', '--readonly']
    """
    cmd = [
        fio, "--name=moment-randread",
        # fio splits --filename at ':' (a list of files); escape it
        "--filename=" + str(path).replace("\\", "\\\\").replace(":", "\\:"),
        "--readonly", "--rw=randread", f"--bs={block_bytes}", f"--direct={int(direct)}",
        f"--ioengine={engine}", f"--size={file_bytes}",
        f"--runtime={max(1, round(seconds * 1000))}ms", "--time_based",
        "--randrepeat=0", "--norandommap", "--group_reporting", "--output-format=json",
    ]
    if engine in ("psync", "sync", "pvsync", "pvsync2"):
        cmd += ["--iodepth=1", f"--numjobs={queue_depth}", "--thread"]
    else:
        cmd += [f"--iodepth={queue_depth}", "--numjobs=1"]
    return cmd


def _fio_object(text: str, source: str) -> tuple[Any, int]:
    """The JSON value fio printed (warning lines before it skipped), and its first line's index."""
    if not isinstance(text, str):
        raise ParseError(source, None, "fio JSON output (text)", type(text).__name__)
    lines = text.split("\n")
    first = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("{")), None)
    if first is None:
        shown = next((ln for ln in lines if ln.strip()), None)
        line = lines.index(shown) + 1 if shown is not None else None
        raise ParseError(source, line, "fio JSON output (--output-format=json)",
                         shown if shown is not None else "no text")
    body = "\n".join(lines[first:])
    try:
        data = json.JSONDecoder().raw_decode(body.lstrip())[0]
    except json.JSONDecodeError as exc:
        raise ParseError(source, first + exc.lineno, f"valid JSON from fio ({exc.msg})") from None
    except RecursionError:
        raise ParseError(source, first + 1, "fio JSON output", "JSON nested too deeply") from None
    return data, first


def parse_fio_json(text: str, source: str = "<fio output>") -> FioRun:
    """The read figures of fio's JSON output (``--output-format=json``).

    Warning lines fio prints before the JSON object are skipped. Jobs not
    grouped (no ``--group_reporting``) are summed. Raises
    :class:`~planner.errors.ParseError` on anything else.

    >>> parse_fio_json('fio: engine x not loadable\\n')
    Traceback (most recent call last):
    ...
    planner.errors.ParseError: <fio output>:1: expected fio JSON output (--output-format=json), found 'fio: engine x not loadable'
    """  # noqa: E501 (a doctest's or a capture's line, as printed)
    data, first = _fio_object(text, source)

    def fail(expected: str, found: Any = None) -> ParseError:
        return ParseError(source, first + 1, expected, None if found is None else str(found))

    if not isinstance(data, dict) or "fio version" not in data:
        raise fail("fio JSON output (an object with 'fio version')",
                   type(data).__name__ if not isinstance(data, dict) else ", ".join(list(data)[:5]))
    jobs = data.get("jobs")
    if not isinstance(jobs, list) or not jobs or not all(isinstance(j, dict) for j in jobs):
        raise fail("a non-empty 'jobs' list in fio's output", type(jobs).__name__)

    def num(obj: Any, key: str, what: str) -> float:
        v = obj.get(key) if isinstance(obj, dict) else None
        try:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise fail(f"a number for {what}", v)
            return float(v)
        except OverflowError:  # an integer too large for a float
            raise fail(f"a number for {what}", "a huge number") from None

    iops = bw = nbytes = ios = 0.0
    runtime_ms = 0.0
    error = 0
    for job in jobs:
        rd = job.get("read")
        if not isinstance(rd, dict):
            raise fail("a 'read' object in each fio job", type(rd).__name__)
        iops += num(rd, "iops", "read iops")
        bw += num(rd, "bw_bytes", "read bw_bytes")
        nbytes += num(rd, "io_bytes", "read io_bytes")
        ios += num(rd, "total_ios", "read total_ios")
        runtime_ms = max(runtime_ms, num(rd, "runtime", "read runtime"))
        err = job.get("error", 0)
        if isinstance(err, int) and not isinstance(err, bool) and err:
            error = error or err
    opts: JsonObject = {}
    for src in (data.get("global options"), jobs[0].get("job options")):
        if isinstance(src, dict):
            opts.update(src)

    def opt_int(key: str) -> int | None:
        v = opts.get(key)
        try:
            return int(str(v)) if v is not None else None
        except ValueError:
            return None

    direct = opts.get("direct")
    numjobs = opt_int("numjobs") or len(jobs)
    return FioRun(
        version=str(data.get("fio version")), read_iops=iops, read_bytes_per_s=bw,
        read_bytes=int(nbytes), runtime_s=runtime_ms / 1000.0, total_ios=int(ios),
        engine=str(opts["ioengine"]) if "ioengine" in opts else None,
        iodepth=opt_int("iodepth"), numjobs=numjobs, block_bytes=opt_int("bs"),
        direct=None if direct is None else str(direct) not in ("0", "false"), error=error,
    )


def fio_engines(fio: str = "fio") -> tuple[str, ...]:
    """The engines of :data:`FIO_ENGINES` this fio was built with, in preference order."""
    try:
        out = subprocess.run([fio, "--enghelp"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return FIO_ENGINES
    have = {ln.strip() for ln in out.splitlines()}
    return tuple(e for e in FIO_ENGINES if e in have) or FIO_ENGINES


def run_fio(path: str | os.PathLike[str], *, block_bytes: int, queue_depth: int, seconds: float,
            file_bytes: int, direct: bool, engines: Sequence[str] | None = None,
            fio: str | None = None, progress: Progress | None = None
            ) -> tuple[ReadMeasurement, list[str]]:
    """Random reads of ``path`` with fio: the first engine that works, and why others did not.

    Raises :class:`ProfileError` when fio is missing or every engine fails.
    """
    exe = fio or shutil.which("fio")
    if exe is None:
        raise ProfileError("not installed (apt-get install fio)")
    failures: list[str] = []
    for engine in (engines or fio_engines(exe)):
        cmd = fio_command(path, block_bytes=block_bytes, queue_depth=queue_depth, seconds=seconds,
                          file_bytes=file_bytes, direct=direct, engine=engine, fio=exe)
        report(progress, f"fio {engine}: {format_size(block_bytes)} random reads, "
                       f"queue depth {queue_depth}, {seconds:g} s")
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
        except subprocess.TimeoutExpired:
            failures.append(f"fio {engine}: no answer within {seconds + 120:.0f} s")
            continue
        except OSError as exc:
            raise ProfileError(f"cannot run fio: {exc.strerror or exc}") from None
        complaint = _fio_complaint(proc.stderr) or _fio_complaint(proc.stdout)
        try:
            run = parse_fio_json(proc.stdout, "fio output")
        except ParseError as exc:
            failures.append(f"fio {engine}: {complaint or exc}")
            continue
        if proc.returncode != 0 or run.error or run.total_ios == 0:
            failures.append(f"fio {engine}: {complaint or f'exit status {proc.returncode}, error {run.error}'}")
            continue
        jobs = (f"{run.numjobs} threads, 1 read each" if engine in ("psync", "sync", "pvsync", "pvsync2")
                else f"1 job, iodepth {run.iodepth or queue_depth}")
        return ReadMeasurement(
            read_bytes_per_s=run.read_bytes_per_s,
            read_iops=run.read_iops,
            block_bytes=block_bytes,
            queue_depth=queue_depth,
            tool=f"fio-{engine}",
            mode="direct" if direct else "buffered",
            file_bytes=file_bytes,
            seconds=run.runtime_s,
            jobs=f"{jobs} ({run.version})",
            date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            host=socket.gethostname(),
        ), failures
    raise ProfileError("failed with every engine: " + "; ".join(failures))


def _fio_complaint(text: str) -> str | None:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip().startswith("fio:")]
    return " / ".join(dict.fromkeys(lines)) or None

