"""Delete each synchronisation of the GPU path in turn and check that a GPU-path test fails (a mutation check).

Every synchronisation (an event wait, a stream wait, a ``record_stream``, a host
wait before a buffer is reused) is one statement on a line marked
``# sync-point: NAME``. For each, in a scratch copy of the repository, the
statement is replaced by ``pass`` and the GPU-path tests run (``-x``, on the
deferred fake accelerator of ``tests/fake_cuda.py``); the point is *caught*
when they fail, *missed* when they pass. The unmutated copy must pass first.
Exits 1 when a point is missed (or the baseline fails), so CI runs it.

    python3 tools/check_syncs.py            # all points, the GPU-path tests
    python3 tools/check_syncs.py --list     # the points only
    python3 tools/check_syncs.py --json out.json
    python3 tools/check_syncs.py --jobs 4      # four scratch copies, four mutations at once
    python3 tools/check_syncs.py --repo ../old --tests tests/test_transfer.py   # another tree's points
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: where the library's sync points may be
PACKAGES = ("iostack", "training", "moment", "hwprofile")
#: the tests that exercise the GPU path on the deferred fake
GPU_TESTS = ("tests/test_gpu_syncs.py", "tests/test_gpu_cache.py")
MARK = re.compile(r"#\s*sync-point:\s*([a-z][a-z0-9-]*)")


def sync_points(root: Path = REPO) -> list[tuple[str, int, str]]:
    """``(path, line, name)`` of every marked synchronisation under ``root``'s packages, in file order."""
    found = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            for i, line in enumerate(path.read_text().splitlines(), 1):
                m = MARK.search(line)
                if m:
                    found.append((str(path.relative_to(root)), i, m.group(1)))
    names = [n for _, _, n in found]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise SystemExit(f"check_syncs: sync-point names used twice: {', '.join(sorted(dup))}")
    return found


def mutate(text: str, line: int) -> str:
    """``text`` with the statement on ``line`` (1-based) replaced by ``pass``, indentation kept."""
    lines = text.splitlines(keepends=True)
    old = lines[line - 1]
    code = old.split("#", 1)[0]
    if not code.strip():
        raise SystemExit(f"check_syncs: line {line} holds no statement: {old.strip()}")
    indent = code[:len(code) - len(code.lstrip())]
    lines[line - 1] = f"{indent}pass  # removed by check_syncs\n"
    return "".join(lines)


def _copy(repo: Path, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    root = dest / repo.name
    shutil.copytree(repo, root, ignore=shutil.ignore_patterns(".git", "__pycache__", ".mypy_cache", ".ruff_cache",
                                                                 ".pytest_cache", "*.egg-info", "build"))
    shared = repo.parent / "shared"  # the fixtures the tests find beside the repository
    if shared.exists():
        os.symlink(shared.resolve(), dest / "shared")
    return root


def _run(root: Path, tests: list[str], timeout_s: float) -> tuple[bool, str]:
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    try:
        p = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return False, "timed out (counted as caught: the tests did not pass)"
    tail = (p.stdout + p.stderr).strip().splitlines()
    return p.returncode == 0, tail[-1] if tail else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="list the sync points and exit")
    ap.add_argument("--tests", nargs="+", default=list(GPU_TESTS), help="test files to run per mutation")
    ap.add_argument("--only", nargs="+", default=None, help="check these sync-point names only")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per test run")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--jobs", type=int, default=2, help="mutations run at once (one scratch copy each)")
    ap.add_argument("--repo", default=str(REPO), help="the tree whose sync points are checked (default: this one)")
    args = ap.parse_args(argv)
    repo = Path(args.repo).resolve()
    points = sync_points(repo)
    if args.only:
        points = [p for p in points if p[2] in set(args.only)]
    if args.list:
        for path, line, name in points:
            print(f"{name:32s} {path}:{line}")
        return 0
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="check-syncs-") as tmp:
        roots: queue.Queue[Path] = queue.Queue()
        for k in range(max(1, args.jobs)):
            roots.put(_copy(repo, Path(tmp) / str(k)))
        first = roots.get()
        ok, tail = _run(first, args.tests, args.timeout)
        roots.put(first)
        if not ok:
            print(f"check_syncs: the GPU-path tests fail without any mutation: {tail}")
            return 1

        def check(point: tuple[str, int, str]) -> dict:
            path, line, name = point
            root = roots.get()
            f = root / path
            original = f.read_text()
            f.write_text(mutate(original, line))
            try:
                passed, tail = _run(root, args.tests, args.timeout)
            finally:
                f.write_text(original)
                roots.put(root)
            print(f"{'caught' if not passed else 'MISSED':7s} {name:32s} {path}:{line}  ({tail})", flush=True)
            return {"name": name, "where": f"{path}:{line}", "caught": not passed, "tests": tail}

        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            results = list(pool.map(check, points))
    missed = [r["name"] for r in results if not r["caught"]]
    print(f"{len(results) - len(missed)} of {len(results)} sync points caught ({time.time() - t0:.0f} s)"
          + (f"; missed: {', '.join(missed)}" if missed else ""))
    if args.json:
        Path(args.json).write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                               "load": Path("/proc/loadavg").read_text().split()[:3],
                                               "repo": str(repo), "tests": args.tests, "points": results},
                                              indent=1))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
