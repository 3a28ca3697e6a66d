"""How the emulated SSDs' blkio throttle times a burst of reads that starts on an idle device.

    sudo python tools/bench_throttle_slice.py [--iops 1000] [--bursts 25,100,150,250,500,1000,2000] [--json FILE]

One emulated SSD (:mod:`iostack.bench.loopssds`: loop device with direct I/O, ext4, a blkio
``read_iops_device`` throttle at ``--iops``); for each burst size ``n``, after ``--idle`` seconds of
idling (longer than the throttle's 100 ms slice), ``fio`` reads ``n`` random 4 KiB pages (O_DIRECT,
io_uring, QD 32) and reports its runtime. Side by side: ``n / iops`` (the rate, what
``training.prediction`` charges a device) and the throttle's slice rule, ``slice * (ceil(n / (iops *
slice)) - 1)`` (``tg_within_iops_limit`` rounds the elapsed time up to the next 100 ms slice, so a
group whose slice expired gets a whole slice's reads at once). Explains why an epoch whose read calls
each start on an idle emulated device (a gather's bins read one after another) runs faster than the
sum of requests / IOPS: not an SSD's behaviour, the emulator's. Needs root; everything is removed at
the end. Medians and ranges over ``--repeats``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _results import Figure, write  # noqa: E402

from iostack.bench.loopssds import emulated_ssds, emulation_blocked  # noqa: E402

#: blk-throttle's slice (``DFL_THROTL_SLICE``, HZ / 10)
SLICE_S = 0.1


def burst_s(path: str, n: int) -> float:
    """fio's runtime of ``n`` random 4 KiB O_DIRECT reads of ``path``, seconds."""
    r = subprocess.run(["fio", "--name=burst", f"--filename={path}", "--direct=1", "--rw=randread", "--bs=4k",
                        "--ioengine=io_uring", "--iodepth=32", f"--number_ios={n}", "--size=64M",
                        "--randrepeat=0", "--output-format=json"], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["jobs"][0]["read"]["runtime"] / 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/moment-throttle-slice"), help="work directory")
    ap.add_argument("--iops", type=float, default=1000.0, help="the emulated SSD's read IOPS throttle")
    ap.add_argument("--bursts", default="25,100,150,250,500,1000,2000", help="reads per burst")
    ap.add_argument("--idle", type=float, default=0.5, help="seconds idle before each burst")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    why = emulation_blocked()
    if why:
        print(f"skipped: {why}")
        write(args.json, "throttle_slice", [], " ".join(sys.argv), skipped=why)
        return 0
    figs = []
    with emulated_ssds(args.dir, [(64e9, args.iops)], size_bytes=256 << 20) as st:
        data = st.devices[0].mount + "/data"
        subprocess.run(["dd", "if=/dev/urandom", f"of={data}", "bs=1M", "count=64", "status=none"], check=True)
        subprocess.run(["sync"], check=True)
        for n in [int(x) for x in args.bursts.split(",")]:
            runs = []
            for _ in range(args.repeats):
                time.sleep(args.idle)
                runs.append(burst_s(data, n))
            rate = n / args.iops
            sliced = SLICE_S * (math.ceil(n / (args.iops * SLICE_S)) - 1)
            med = statistics.median(runs)
            figs.append(Figure("throttle_slice", f"{n} reads after idle at {args.iops:g} IOPS: fio vs the slice rule",
                               "s", med, sliced, "slice * (ceil(n / (iops * slice)) - 1)", higher_is_better=False,
                               target="~1x", note=f"n / iops {rate:.3f} s; range {min(runs):.3f}..{max(runs):.3f}"))
            print(f"{n} reads after {args.idle:g} s idle: fio {med:.3f} s (range {min(runs):.3f}..{max(runs):.3f}), "
                  f"slice rule {sliced:.3f} s, n / iops {rate:.3f} s", flush=True)
    write(args.json, "throttle_slice", figs, " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
