"""One rank of a ``tools/bench_multinode.py`` run (started by torchrun): train, and measure this process's memory.

    python tools/multinode_worker.py CONFIG.json OUT_DIR [--private]

``CONFIG.json`` holds a run's flat record (:meth:`training.specs.TrainSpec.to_dict`'s fields). Writes
``OUT_DIR/rank<r>.json``: the start and epoch records this rank saw, and its
``/proc/self/smaps_rollup`` (kB fields, as bytes) before training, after the
store opened (the start record) and at every epoch end. ``--private``: the
reference of the two-local-ranks figure: every rank builds its own copy of
the host tiers (what ``FeatureStore`` did before node-shared segments).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import training.trainer as trainer  # noqa: E402
from training.specs import TrainSpec  # noqa: E402

FIELDS = ("Rss", "Pss", "Pss_Anon", "Pss_Shmem", "Pss_File")


def smaps() -> dict[str, int]:
    """This process's memory (bytes): resident, proportional (shared pages split between their users)."""
    out = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        name, _, rest = line.partition(":")
        if name in FIELDS:
            out[name] = int(rest.split()[0]) * 1024
    return out


def main() -> int:
    cfg = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    threads = int(os.environ.get("MOMENT_THREADS", "0"))
    if threads:  # "nodes" on one host share its cores: the trainer would give each node all of them
        torch.set_num_threads(threads)
        torch.set_num_threads = lambda n: None
    if "--private" in sys.argv[3:]:
        trainer.share_key_of = lambda *a, **k: None  # no node-shared segments: one copy per rank
    rec: dict = {"rank": int(os.environ.get("RANK", 0)), "node": int(os.environ.get("GROUP_RANK", 0)),
                 "before": smaps(), "epochs": [], "epoch_mem": [], "steps": []}

    def progress(r: dict) -> None:
        if r["kind"] == "start":
            rec["start"], rec["start_mem"] = r, smaps()
        elif r["kind"] == "epoch":
            rec["epochs"].append(r)
            rec["epoch_mem"].append(smaps())
        elif r["kind"] == "step":
            rec["steps"].append({k: r[k] for k in ("epoch", "step", "loss", "step_s", "gather_s", "io_wait_s")})

    trainer.train(TrainSpec.from_dict(cfg), progress=progress)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rec['rank']}.json").write_text(json.dumps(rec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
