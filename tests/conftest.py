"""Shared test helpers: where the real captures live."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("MOMENT_SHARED", REPO.parent / "shared"))
TOPOLOGY_FIXTURES = SHARED / "fixtures" / "topology"
GRAPH_FIXTURES = SHARED / "fixtures" / "graphs"


def topology_fixture(machine: str, filename: str) -> Path:
    """Path of a real capture under ``../shared/fixtures/topology``; skips if shared/ is absent."""
    path = TOPOLOGY_FIXTURES / machine / filename
    if not path.exists():
        pytest.skip(f"fixture {path} not present (is ../shared beside the repository?)")
    return path


def expected_counts() -> dict[str, dict[str, int]]:
    """``expected.json``: device counts per fixture machine, as ``moment topo --json`` must report them."""
    import json

    return json.loads(topology_fixture(".", "expected.json").read_text())


def graph_fixture(name: str, filename: str = "") -> Path:
    """Path of a real graph under ``../shared/fixtures/graphs`` (a folder when ``filename`` is empty); skips if
    absent."""
    path = GRAPH_FIXTURES / name / filename if filename else GRAPH_FIXTURES / name
    if not path.exists():
        pytest.skip(f"fixture {path} not present (is ../shared beside the repository?)")
    return path


def assert_parse_error(parse, text: str, line: int | None, expected: str, source: str = "bad.xml") -> None:
    """``parse(text, source)`` raises ParseError naming ``source`` and ``line``, expecting ``expected``."""
    from planner.errors import ParseError

    with pytest.raises(ParseError) as info:
        parse(text, source)
    err = info.value
    assert err.source == source
    assert err.line == line
    assert expected.lower() in err.expected.lower()
    assert str(err).startswith(f"{source}:{line}: expected" if line is not None else f"{source}: expected")


def flat_spec(**fields):
    """A :class:`training.specs.TrainSpec` from the run record's flat field names (``TrainSpec.from_dict``):
    the tests list a run's settings in one line, as the records and checkpoints hold them."""
    from training.specs import TrainSpec

    return TrainSpec.from_dict(fields)


@pytest.fixture
def load_tool(monkeypatch):
    """``load_tool("bench_x")``: the module of ``tools/bench_x.py``, imported as its own script would be (``tools/``
    on the path, ``sys.argv`` naming it), so a test can call its ``main(argv)``."""
    import importlib.util
    import sys

    tools = Path(__file__).resolve().parents[1] / "tools"
    monkeypatch.syspath_prepend(str(tools))

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, tools / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        monkeypatch.setattr(sys, "argv", [f"{name}.py"])
        return mod

    return load


@pytest.fixture
def disk(tmp_path):
    """``disk(kind, size="64k")``: a small tmpfs that is ``full`` (0 bytes free), ``tight`` (4 KiB free), ``ro``
    or ``empty``; ``keep`` names files written on it first. Skips where mount is refused (needs root)."""
    mounted = []

    def make(kind: str, keep: dict[str, str] | None = None, size: str = "64k") -> Path:
        d = tmp_path / f"disk-{kind}"
        d.mkdir()
        opts = f"size={size}" + (",ro" if kind == "ro" else "")
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(d)], capture_output=True, text=True)
        if proc.returncode:
            pytest.skip(f"cannot mount a tmpfs for the {kind} disk ({proc.stderr.strip()}); needs root")
        mounted.append(d)
        for name, text in (keep or {}).items():
            (d / name).write_text(text)
        if kind in ("full", "tight"):
            fill = d / "fill"
            with open(fill, "wb", buffering=0) as f:  # unbuffered: the failing write is the last
                try:
                    while True:
                        f.write(b"\0" * 4096)
                except OSError:
                    pass
            if kind == "tight":
                with open(fill, "r+b") as f:  # give back one page
                    f.truncate(max(0, fill.stat().st_size - 4096))
        return d

    yield make
    for d in mounted:
        subprocess.run(["umount", "-l", str(d)], check=False)


@pytest.fixture(scope="session")
def cora_links(tmp_path_factory) -> Path:
    """Cora imported and its edges split for link prediction (``moment data split-edges --seed 1``); the
    edge-split dataset directory."""
    from moment.cli import main

    root = tmp_path_factory.mktemp("cora-links")
    assert main(["data", "import", str(graph_fixture("cora")), str(root / "cora")]) == 0
    assert main(["data", "split-edges", str(root / "cora"), str(root / "links"), "--seed", "1"]) == 0
    return root / "links"


@pytest.fixture(scope="session")
def placed_cora_links(cora_links, tmp_path_factory) -> Path:
    """``cora_links`` placed by ``moment place`` for moment-b (GPU, CPU and SSD bins; GPU bins on the host
    without CUDA); the placement directory."""
    from moment.cli import main

    root = tmp_path_factory.mktemp("placed-cora-links")
    ssd = [a for _ in range(8) for a in ("--ssd", str(root / "ssd"))]
    assert main(["place", "--dataset", str(cora_links), "--machine", "moment-b", "--gpu-cache", "128KiB",
                 "--cpu-cache", "1MiB", *ssd, "--fanouts", "10,10", "--batch-size", "512",
                 "--out", str(root / "place")]) == 0
    return root / "place"


@pytest.fixture(scope="session")
def placed_cora(tmp_path_factory) -> Path:
    """Cora imported and placed by the commands a user runs (``moment data import``, ``moment place`` for
    moment-b: GPU, CPU and SSD bins; GPU bins live on the host without CUDA); the dataset directory, with
    the placement in ``../place``."""
    from moment.cli import main

    root = tmp_path_factory.mktemp("placed-cora")
    assert main(["data", "import", str(graph_fixture("cora")), str(root / "cora")]) == 0
    ssd = [a for _ in range(8) for a in ("--ssd", str(root / "ssd"))]
    assert main(["place", "--dataset", str(root / "cora"), "--machine", "moment-b", "--gpu-cache", "128KiB",
                 "--cpu-cache", "1MiB", *ssd, "--fanouts", "10,5", "--batch-size", "35",
                 "--out", str(root / "place")]) == 0
    return root / "cora"


@pytest.fixture
def mem():
    """The deferred fake accelerator (:mod:`tests.fake_cuda`), entered; on leaving, no ordering violation may
    have gone unnoticed."""
    from tests.fake_cuda import FakeDeviceMemory, reset_driver

    reset_driver()
    m = FakeDeviceMemory(deferred=True)
    with m:
        yield m
    m.check()
    reset_driver()
