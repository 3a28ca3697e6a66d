"""Are a change's outputs byte-identical to a reference tree's? Plans, datasets, placements, trained parameters.

    python tools/check_outputs.py --write-ref DIR        # digests of this tree's outputs
    python tools/check_outputs.py --ref DIR              # this tree's against them: exit 1 on a difference

A refactoring (issue 27) must not change what the commands produce. This runs the
commands on the fixtures and small generated data, each through ``python -m moment``
in a subprocess (so ``PYTHONPATH`` chooses the tree), and reduces every output to a
SHA-256 digest:

- plans (``moment plan --json``) of both bundled machines, both flow models, a what-if and
  two captured machines, with run-time fields (``seconds``, paths) left out;
- datasets written by ``moment data import`` (Cora, Amazon Photo) and ``moment data synth``:
  every ``.npy`` file's bytes (``meta.json`` without its paths and dates);
- placements written by ``moment place`` (DDAK and hash, on Cora and the synthetic graph):
  ``bin_of``/``row_of`` and every SSD bin's bytes;
- trained parameters: ``moment train`` from a placement and from memory (GraphSAGE and GAT),
  the model's ``state_dict`` in the checkpoint, tensor by tensor.

Digests, not files, are kept, so a reference is small; ``--keep`` leaves the outputs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: ../shared/fixtures beside the repository, as tests/conftest.py finds it (MOMENT_SHARED overrides)
FIXTURES = Path(os.environ.get("MOMENT_SHARED", Path(__file__).resolve().parents[2] / "shared")) / "fixtures"
#: run-time or machine-local keys left out of a JSON output before it is digested
VOLATILE = {"seconds", "path", "paths", "created", "date", "written_at", "elapsed_s", "host",
            "source", "wall_s", "started", "finished", "out", "dir", "dataset_dir"}


def moment(*args: str, cwd: Path) -> str:
    """Run ``python -m moment ARGS`` in ``cwd``; its stdout, or SystemExit naming the failure."""
    done = subprocess.run([sys.executable, "-m", "moment", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"moment {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-600:]}")
    return done.stdout


def _strip(obj: object) -> object:
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in sorted(obj.items()) if k not in VOLATILE}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    if isinstance(obj, str) and ("/tmp/" in obj or "/work/" in obj):
        return "<path>"
    return obj


def json_digest(text: str) -> str:
    return hashlib.sha256(json.dumps(_strip(json.loads(text)), sort_keys=True).encode()).hexdigest()


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def tree_digests(root: Path, prefix: str) -> dict[str, str]:
    """Every ``.npy``/``.dat``/``.bin`` file under ``root`` by its relative path, and its JSON files stripped."""
    out: dict[str, str] = {}
    for p in sorted(root.rglob("*")):
        if not p.is_file():
            continue
        # an SSD bin's name carries a digest of the placement's full path (training.place.bins)
        rel = re.sub(r"-[0-9a-f]{8}-bin", "-<digest>-bin", f"{prefix}/{p.relative_to(root).as_posix()}")
        if p.suffix == ".json":
            out[rel] = json_digest(p.read_text())
        elif p.suffix in (".npy", ".dat", ".bin") or p.name.startswith("bin"):
            out[rel] = file_digest(p)
    return out


def param_digests(checkpoint: Path, prefix: str) -> dict[str, str]:
    import torch

    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    model = state.get("model", state)
    return {f"{prefix}/{k}": hashlib.sha256(v.detach().contiguous().numpy().tobytes()).hexdigest()
            for k, v in sorted(model.items())}


def plans(work: Path) -> dict[str, str]:
    runs = {
        "plan/moment-a": ["--machine", "moment-a"],
        "plan/moment-b": ["--machine", "moment-b"],
        "plan/moment-b-concurrent": ["--machine", "moment-b", "--model", "concurrent"],
        "plan/moment-a-nvlink-cache": ["--machine", "moment-a", "--nvlink", "0-1", "--nvlink", "2-3",
                                       "--cpu-cache-share", "0.3", "--gpu-cache-share", "0.1"],
        "plan/moment-b-nodes": ["--machine", "moment-b", "--nodes", "2", "--nics", "1"],
    }
    xd665 = FIXTURES / "topology" / "hpe-cray-xd665-2x-epyc9354-h100"
    runs["plan/xd665-capture"] = ["--lspci-vvv", str(xd665 / "lspci-vvnn.txt"), "--dmidecode",
                                  str(xd665 / "dmidecode.txt"), "--unknown-link-gbps", "16"]
    return {k: json_digest(moment("plan", *a, "--json", cwd=work)) for k, a in runs.items()}


def datasets(work: Path) -> dict[str, str]:
    graphs = FIXTURES / "graphs"
    moment("data", "import", str(graphs / "cora"), "cora", cwd=work)
    moment("data", "import", str(graphs / "amazon-photo" / "amazon_photo.npz"), "photo", cwd=work)
    moment("data", "synth", "synth", "--nodes", "20000", "--edges", "200000", "--feature-dim", "32",
           "--seed", "3", cwd=work)
    out: dict[str, str] = {}
    for name in ("cora", "photo", "synth"):
        out.update(tree_digests(work / name, f"data/{name}"))
    return out


def placements(work: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for ds, strategy in (("cora", "ddak"), ("cora", "hash"), ("synth", "ddak")):
        name = f"{ds}-{strategy}"
        ssds = [str(work / f"{name}-ssd{i}") for i in range(8)]  # Machine B has 8
        moment("place", "--dataset", ds, "--machine", "moment-b", "--strategy", strategy,
               "--gpu-cache", "64KiB", "--cpu-cache", "256KiB", *(x for s in ssds for x in ("--ssd", s)),
               "--out", f"{name}-placement", "--seed", "0", cwd=work)
        out.update(tree_digests(work / f"{name}-placement", f"place/{name}"))
        for i, s in enumerate(ssds):
            out.update(tree_digests(Path(s), f"place/{name}/ssd{i}"))
    return out


def trained(work: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    runs = {
        "sage-placed": ["--dataset", "cora", "--placement", "cora-ddak-placement"],
        "sage-memory": ["--dataset", "cora"],
        "gat-placed": ["--dataset", "cora", "--placement", "cora-ddak-placement", "--model", "gat"],
        "sage-synth": ["--dataset", "synth", "--placement", "synth-ddak-placement", "--fanouts", "10,5"],
    }
    for name, args in runs.items():
        ck = work / f"ck-{name}"
        moment("train", *args, "--epochs", "2", "--seed", "0", "--batch-size", "256",
               "--prefetch", "0", "--checkpoint", str(ck), cwd=work)
        out.update(param_digests(ck / "checkpoint.pt", f"train/{name}"))
    return out


def collect(work: Path) -> dict[str, str]:
    digests: dict[str, str] = {}
    for step in (plans, datasets, placements, trained):
        digests.update(step(work))
    return digests


def compare(ours: dict[str, str], ref: dict[str, str]) -> list[str]:
    lines = [f"differs: {k}" for k in sorted(ours.keys() & ref.keys()) if ours[k] != ref[k]]
    lines += [f"only in the reference: {k}" for k in sorted(ref.keys() - ours.keys())]
    lines += [f"only in this tree: {k}" for k in sorted(ours.keys() - ref.keys())]
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--write-ref", type=Path, metavar="DIR", help="write this tree's digests to DIR/digests.json")
    g.add_argument("--ref", type=Path, metavar="DIR", help="compare this tree's digests with DIR/digests.json")
    p.add_argument("--keep", type=Path, metavar="DIR", help="produce the outputs in DIR and keep them")
    a = p.parse_args()
    work = a.keep or Path(tempfile.mkdtemp(prefix="moment-outputs-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        digests = collect(work)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    tree = os.environ.get("PYTHONPATH", "(installed)")
    if a.write_ref:
        a.write_ref.mkdir(parents=True, exist_ok=True)
        (a.write_ref / "digests.json").write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
        print(f"{len(digests)} digests of {tree} written to {a.write_ref / 'digests.json'}")
        return 0
    ref = json.loads((a.ref / "digests.json").read_text())
    lines = compare(digests, ref)
    print("\n".join(lines) if lines else f"all {len(digests)} outputs byte-identical to {a.ref} ({tree})")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
