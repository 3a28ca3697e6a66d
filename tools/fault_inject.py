"""Fault injection over every ``moment`` command that writes (issue 28, "and keep it so").

For each writing command (data synth, data import, place, train --checkpoint, report --out,
plan --svg, bench emulate --plot, topo --svg) it runs the command, as a user would, under:

``full``       its output on a 64 KiB tmpfs with 8 KiB left (the work starts, the disk fills);
``ro``         its output on a read-only tmpfs holding a previous good output;
``kill9``      ``kill -9`` at a random moment while it replaces a previous good output, then the
               same command again (which must succeed and sweep what the killed one left);
``sigint``     Ctrl-C (SIGINT) at a random moment, likewise;
``concurrent`` a second writer of the same output started at the same time.

and checks afterwards: a clear one-line message (``moment ...: error: ...``, no traceback, no
"internal error") and a non-zero exit for each failure; no partial output visible as complete;
the previous good output intact (or replaced by a complete new one); no leftovers (temporary
files, locks, work directories) once the next run is over. It counts faults injected, clear
errors, silent wrongs (exit 0 with an incomplete output, or a cut file under the output's name:
must be 0), leftovers (must be 0) and previous outputs lost (a directory output its reader now
refuses, or gone: nothing wrong is visible, but the old output did not survive).

    python tools/fault_inject.py                      # every command, every fault, 1 round
    python tools/fault_inject.py --rounds 3 --json faults.json
    python tools/fault_inject.py --commands "topo --svg" "data synth" --faults kill9 sigint

The tmpfs faults need root (``mount -t tmpfs``); without it they are skipped and said so.
tests/test_fault_injection.py runs the quick part (``--quick``) in the default test run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("MOMENT_SHARED", REPO.parent / "shared"))
CORA = SHARED / "fixtures" / "graphs" / "cora"
FAULTS = ("full", "ro", "kill9", "sigint", "concurrent")
TRAIN = ["--fanouts", "5,5", "--batch-size", "70", "--epochs", "2", "--hidden", "8", "--eval-every", "0",
         "--checkpoint-every", "5"]


# -- what "complete" means for each kind of output ---------------------------------------------

def _dataset_whole(p: Path) -> bool:
    from training.data import open_dataset

    try:
        open_dataset(p, verify="full")
        return True
    except Exception:  # any failure to open is "not complete"; this is a checker, not the library
        return False


def _placement_whole(p: Path) -> bool:
    from iostack.placement import load_placement

    try:
        pl = load_placement(p)
    except Exception:
        return False
    return (p / "place.json").is_file() and all(b.kind != "ssd" or (p / str(b.path)).is_file() or
                                                 Path(str(b.path)).is_file() for b in pl.bins)


def _checkpoint_whole(p: Path) -> bool:
    import torch

    try:
        ck = torch.load(p / "checkpoint.pt", map_location="cpu", weights_only=False)
    except Exception:
        return False
    return isinstance(ck, dict) and "model" in ck and "epoch" in ck


def _svg_whole(p: Path) -> bool:
    import xml.etree.ElementTree as ET

    try:
        return ET.parse(p).getroot().tag.endswith("svg")
    except (OSError, ET.ParseError):
        return False


def _png_whole(p: Path) -> bool:
    try:
        data = p.read_bytes()
    except OSError:
        return False
    return data.startswith(b"\x89PNG\r\n\x1a\n") and data.endswith(b"IEND\xaeB`\x82")


def _report_whole(p: Path) -> bool:
    return _png_whole(p / "report.png") and _svg_whole(p / "report.svg")


@dataclass(frozen=True)
class Command:
    """One writing command: its arguments for an output path, what makes its output complete."""

    name: str
    argv: Callable[[Path, Path], list[str]]  # (inputs, output) -> argv
    output: str  # the output's name in its directory
    whole: Callable[[Path], bool]
    replace: tuple[str, ...] = ()  # what it needs to replace an existing output
    #: work directories it keeps on purpose after a failure, for the next run to resume from
    resumable: tuple[str, ...] = ()


def _ssds(d: Path) -> list[str]:
    return [a for _ in range(8) for a in ("--ssd", str(d))]


COMMANDS: dict[str, Command] = {c.name: c for c in (
    Command("data synth", lambda i, o: ["data", "synth", str(o), "--nodes", "20000", "--edges", "200000",
                                        "--feature-dim", "16", "--quiet"],
            "g", _dataset_whole, ("--force",), (".g.partial",)),
    Command("data import", lambda i, o: ["data", "import", str(CORA), str(o)], "c", _dataset_whole, ("--force",)),
    Command("place", lambda i, o: ["place", "--dataset", str(i / "cora"), "--machine", "moment-b",
                                   "--gpu-cache", "1MiB", "--cpu-cache", "2MiB", *_ssds(o.parent / "ssd"),
                                   "--out", str(o)], "placed", _placement_whole, ("--force",)),
    Command("train --checkpoint", lambda i, o: ["train", "--dataset", str(i / "cora"), *TRAIN,
                                                "--checkpoint", str(o)], "ck", _checkpoint_whole),
    Command("report --out", lambda i, o: ["report", str(i / "m.jsonl"), "--out", str(o)], "r", _report_whole),
    Command("plan --svg", lambda i, o: ["plan", "--machine", "moment-b", "--svg", str(o)], "p.svg", _svg_whole),
    Command("bench emulate --plot", lambda i, o: ["bench", "emulate", str(i / "wl.yaml"), "--plot", str(o)],
            "e.png", _png_whole),
    Command("topo --svg", lambda i, o: ["topo", "--machine", "moment-b", "--svg", str(o)], "t.svg", _svg_whole),
)}


# -- running ---------------------------------------------------------------------------------------

@dataclass
class Outcome:
    command: str
    fault: str
    exit: int | None
    clear: bool  # a failure said in one clear line (or none was needed: exit 0)
    silent_wrong: str = ""  # what is wrong although nothing said so
    previous_lost: str = ""  # the previous good output did not survive the fault (none partial is visible)
    leftovers: list[str] = field(default_factory=list)
    note: str = ""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def _start(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "moment", *argv], cwd=REPO, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _run(argv: list[str], timeout: float = 600) -> tuple[int, str]:
    p = _start(argv)
    _, err = p.communicate(timeout=timeout)
    return p.returncode, err


def _clear(rc: int, err: str, command: str) -> bool:
    """A non-zero exit with exactly one ``moment ...: error:`` line and no traceback (or exit 0)."""
    if rc == 0:
        return True
    if "Traceback" in err or "internal error" in err:
        return False
    errors = [ln for ln in err.splitlines() if ": error:" in ln or ln.startswith("moment: interrupted")]
    return len(errors) == 1


def _listing(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*")} if d.is_dir() else set()


def _leftovers(d: Path, out: Path, cmd: Command, keep: set[str]) -> list[str]:
    """Entries under ``d`` that are neither the output (and what lies in it), nor kept inputs, nor allowed."""
    found = []
    for rel in sorted(_listing(d) - keep):
        top = rel.split("/", 1)[0]
        if top in (out.name, "ssd") and not any(part.startswith(".") and ".tmp" in part for part in rel.split("/")):
            continue  # the output itself and its SSD bins (their own temporaries are leftovers)
        found.append(rel)
    return found


def _digest(p: Path) -> dict[str, bytes]:
    if p.is_file():
        return {"": p.read_bytes()}
    return {str(f.relative_to(p)): f.read_bytes() for f in sorted(p.rglob("*")) if f.is_file()} if p.is_dir() else {}


@contextlib.contextmanager
def _tmpfs(d: Path, size: str = "64k") -> object:
    d.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)], capture_output=True,
                          text=True)
    if proc.returncode:
        raise PermissionError(proc.stderr.strip() or "mount refused")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def _fill(d: Path, leave_bytes: int) -> None:
    fill = d / ".fill"
    with open(fill, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)
    with open(fill, "r+b") as f:
        f.truncate(max(0, fill.stat().st_size - leave_bytes))


def inputs(work: Path, cora: bool = True) -> Path:
    """The inputs the commands read: cora imported (when ``cora``), a metrics file, an emulate workload."""
    i = work / "inputs"
    i.mkdir(parents=True, exist_ok=True)
    if cora and not (i / "cora").exists():
        rc, err = _run(["data", "import", str(CORA), str(i / "cora")])
        if rc:
            raise SystemExit(f"cannot import cora for the inputs: {err.strip()[-500:]}")
    (i / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"kind": "start", "config": {"model": "sage"}},
        {"kind": "epoch", "epoch": 0, "epoch_s": 1.0, "compute_s": 0.6, "allreduce_s": 0.0, "io_wait_s": 0.2,
         "sample_s": 0.1, "gather_s": 0.1, "tiers": {"gpu": {"rows": 5, "bytes": 50}}})))
    (i / "wl.yaml").write_text("data: {synthetic: {rows: 4096, row_bytes: 4KiB, dir: " + str(i / "emu") + "}}\n"
                               "stream: {kind: uniform, rows_per_step: 256, steps: 8}\n")
    (i / "emu").mkdir(exist_ok=True)
    return i


def _check_after(cmd: Command, fault: str, rc: int, err: str, out: Path, before: dict[str, bytes]) -> Outcome:
    o = Outcome(cmd.name, fault, rc, _clear(rc, err, cmd.name))
    if not o.clear:
        o.note = err.strip().splitlines()[-1][:300] if err.strip() else "(nothing said)"
    exists = out.exists()
    if rc == 0 and not (exists and cmd.whole(out)):
        o.silent_wrong = "exit 0 but the output is missing or incomplete"
    elif exists and _digest(out) != before and not cmd.whole(out):
        if out.is_dir():  # its reader refuses it (no manifest, bad checksums): not visible as complete
            o.previous_lost = "a partial directory its reader refuses stands where the previous output was"
        else:  # a cut file under the output's name: a picture that opens half drawn
            o.silent_wrong = "a partial file stands where the output belongs"
    elif before and not exists:
        o.previous_lost = "the previous output is gone (nothing partial left)"
    return o


def _disk_fault(cmd: Command, fault: str, work: Path, inp: Path) -> Outcome:
    d = work / f"{fault}-{cmd.name.replace(' ', '_')}"
    with _tmpfs(d, "256m" if fault == "ro" else "64k"):  # room for a previous output before it turns read-only
        out = d / cmd.output
        before: dict[str, bytes] = {}
        if fault == "ro":  # a previous good output first, then the disk turns read-only
            rc, err = _run(cmd.argv(inp, out) + list(cmd.replace))
            before = _digest(out) if rc == 0 else {}
            subprocess.run(["mount", "-o", "remount,ro", str(d)], check=True)
        else:
            _fill(d, 8 << 10)
        keep = _listing(d)
        rc, err = _run(cmd.argv(inp, out) + (list(cmd.replace) if before else []))
        o = _check_after(cmd, fault, rc, err, out, before)
        if before and _digest(out) != before:
            o.silent_wrong = o.silent_wrong or "the previous output changed on a read-only disk"
        allowed = {r for r in _listing(d) if r.split("/", 1)[0] in cmd.resumable}
        o.leftovers = [r for r in _leftovers(d, out, cmd, keep) if r not in allowed]
        return o


def _signal_fault(cmd: Command, fault: str, work: Path, inp: Path, rng: random.Random) -> Outcome:
    d = work / f"{fault}-{cmd.name.replace(' ', '_')}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    out = d / cmd.output
    t0 = time.monotonic()
    rc, err = _run(cmd.argv(inp, out))
    took = time.monotonic() - t0
    if rc:
        return Outcome(cmd.name, fault, rc, False, note=f"the first, undisturbed run failed: {err.strip()[-300:]}")
    before = _digest(out)
    keep = _listing(d)
    p = _start(cmd.argv(inp, out) + list(cmd.replace))
    at = rng.uniform(0.1, 0.95) * took  # a random moment of a run as long as the undisturbed one
    time.sleep(at)
    with contextlib.suppress(ProcessLookupError):
        p.send_signal(signal.SIGKILL if fault == "kill9" else signal.SIGINT)
    _, err = p.communicate(timeout=600)
    rc = p.returncode
    o = _check_after(cmd, fault, rc if rc >= 0 else 128 - rc, err if fault == "sigint" else "", out, before)
    if fault == "kill9":
        o.clear = True  # nothing can be said by a killed process
    elif rc == -signal.SIGINT and not err.strip():
        o.clear, o.note = True, "stopped before Python set its Ctrl-C handler (nothing ran)"
    elif rc not in (0, 130, -signal.SIGINT):  # -SIGINT: stopped before Python set its handler (nothing done)
        o.note = (o.note + "; " if o.note else "") + f"exit {rc} after Ctrl-C"
    o.note = (o.note + "; " if o.note else "") + f"signal at {at:.1f} s"
    # the next run of the same command: succeeds, the output complete, nothing else left
    rc2, err2 = _run(cmd.argv(inp, out) + list(cmd.replace))
    if rc2 != 0:
        o.silent_wrong = o.silent_wrong or f"the next run failed: {err2.strip()[-200:]}"
    elif not cmd.whole(out):
        o.silent_wrong = o.silent_wrong or "the next run left an incomplete output"
    o.leftovers = _leftovers(d, out, cmd, keep)
    return o


def _concurrent_fault(cmd: Command, work: Path, inp: Path) -> Outcome:
    d = work / f"concurrent-{cmd.name.replace(' ', '_')}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    out = d / cmd.output
    a, b = _start(cmd.argv(inp, out)), _start(cmd.argv(inp, out))
    (_, ea), (_, eb) = a.communicate(timeout=600), b.communicate(timeout=600)
    o = Outcome(cmd.name, "concurrent", max(a.returncode, b.returncode),
                _clear(a.returncode, ea, cmd.name) and _clear(b.returncode, eb, cmd.name))
    if not o.clear:
        o.note = " | ".join(e.strip().splitlines()[-1][:200] for e in (ea, eb) if e.strip())
    if 0 not in (a.returncode, b.returncode):
        o.note = (o.note + "; " if o.note else "") + "neither writer finished"
    if out.exists() and not cmd.whole(out):
        o.silent_wrong = "two writers left an incomplete output"
    elif 0 in (a.returncode, b.returncode) and not out.exists():
        o.silent_wrong = "a writer exited 0 and there is no output"
    o.leftovers = _leftovers(d, out, cmd, set())
    return o


def run_suite(pairs: list[tuple[str, str]], rounds: int, work: Path, seed: int,
              say: Callable[[str], None] = lambda s: None) -> dict:
    """Each (command, fault) of ``pairs``, the random ones ``rounds`` times; the counts and every outcome."""
    rng = random.Random(seed)
    inp = inputs(work, cora=any(c in ("place", "train --checkpoint") for c, _ in pairs))
    outcomes: list[Outcome] = []
    skipped: list[str] = []
    for r in range(rounds):
        for name, fault in pairs:
            cmd = COMMANDS[name]
            if fault in ("full", "ro") and r > 0:
                continue  # deterministic: once is enough
            try:
                if fault in ("full", "ro"):
                    o = _disk_fault(cmd, fault, work, inp)
                elif fault == "concurrent":
                    o = _concurrent_fault(cmd, work, inp)
                else:
                    o = _signal_fault(cmd, fault, work, inp, rng)
            except PermissionError as exc:
                skipped.append(f"{name} / {fault}: {exc}")
                continue
            outcomes.append(o)
            flag = "SILENT WRONG " if o.silent_wrong else ""
            say(f"{name:22} {fault:10} exit {o.exit!s:4} clear={o.clear!s:5} {flag}{o.silent_wrong} "
                f"leftovers={o.leftovers} {o.previous_lost} {o.note}")
    # a process killed with SIGKILL cannot say anything: its failures are counted apart
    failures = [o for o in outcomes if o.exit not in (0, None) and o.fault != "kill9"]
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load": Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else None,
        "pairs": [list(p) for p in pairs], "rounds": rounds, "seed": seed,
        "faults_injected": len(outcomes),
        "clear_errors": sum(o.clear for o in failures),
        "unclear_errors": sum(not o.clear for o in failures),
        "completed_anyway": sum(o.exit == 0 for o in outcomes),
        "killed": sum(o.fault == "kill9" and o.exit != 0 for o in outcomes),
        "silent_wrongs": sum(bool(o.silent_wrong) for o in outcomes),
        "previous_lost": sum(bool(o.previous_lost) for o in outcomes),
        "leftovers": sum(len(o.leftovers) for o in outcomes),
        "skipped": skipped,
        "outcomes": [asdict(o) for o in outcomes],
    }


#: the default test run's part (tests/test_fault_injection.py): every fault on the lightest command, and
#: the disk faults on a memory-mapped writer (where SIGBUS was)
QUICK = [("topo --svg", f) for f in FAULTS] + [("data import", "full"), ("data import", "ro")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commands", nargs="+", choices=list(COMMANDS), default=list(COMMANDS))
    ap.add_argument("--faults", nargs="+", choices=FAULTS, default=list(FAULTS))
    ap.add_argument("--rounds", type=int, default=1, help="kill/Ctrl-C/concurrent rounds (random moments)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="the default test run's part (QUICK)")
    ap.add_argument("--work", type=Path, help="scratch directory (default: a temporary one, removed)")
    ap.add_argument("--json", type=Path, help="write the counts and every outcome here")
    args = ap.parse_args(argv)
    pairs = QUICK if args.quick else [(c, f) for c in args.commands for f in args.faults]
    work = args.work or Path(tempfile.mkdtemp(prefix="moment-faults-"))
    try:
        res = run_suite(pairs, args.rounds, work, args.seed, say=lambda s: print(s, flush=True))
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"faults injected {res['faults_injected']}, clear errors {res['clear_errors']} "
          f"(unclear {res['unclear_errors']}, killed {res['killed']}, completed anyway {res['completed_anyway']}), "
          f"silent wrongs {res['silent_wrongs']}, leftovers {res['leftovers']}, previous output lost "
          f"{res['previous_lost']}; load {res['load']}")
    for s in res["skipped"]:
        print(f"skipped: {s}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")
    return 1 if res["silent_wrongs"] or res["leftovers"] or res["unclear_errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
