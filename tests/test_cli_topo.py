"""End to end: `moment topo` on every real capture, the bundled machines, live, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from moment.cli import main
from tests.conftest import TOPOLOGY_FIXTURES, topology_fixture

EXPECTED_FILE = TOPOLOGY_FIXTURES / "expected.json"
EXPECTED = json.loads(EXPECTED_FILE.read_text()) if EXPECTED_FILE.exists() else {}


def source_args(folder: Path) -> list[str]:
    """The `moment topo` options that feed every capture of one fixture folder."""
    args: list[str] = []
    for f in sorted(folder.iterdir()):
        n = f.name
        if n in ("lspci-tv.txt", "lspci-t-pruned.txt"):
            args += ["--lspci", str(f)]
        elif n == "lspci-vvnn.txt" or (n.startswith("lspci-vvv-s-") and n.endswith(".txt")):
            args += ["--lspci-vvv", str(f)]
        elif n == "dmidecode.txt":
            args += ["--dmidecode", str(f)]
        elif n == "nvidia-smi-topo.txt":
            args += ["--nvidia-smi", str(f)]
        elif n == "hwloc.xml":
            args += ["--hwloc", str(f)]
        elif n == "nccl-topo.xml":
            args += ["--nccl-topo", str(f)]
    return args


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("machine", sorted(EXPECTED))
def test_every_fixture_gives_the_expected_device_counts(capsys, machine):
    folder = TOPOLOGY_FIXTURES / machine
    code, out, err = run(capsys, "topo", *source_args(folder), "--json")
    assert code == 0, err
    data = json.loads(out)
    kinds = [n["kind"] for n in data["nodes"]]
    for kind, count in EXPECTED[machine].items():
        assert kinds.count(kind) == count, f"{machine}: {kind}"
        assert data["counts"][kind] == count


@pytest.mark.parametrize("machine", sorted(EXPECTED))
def test_every_fixture_prints_a_tree(capsys, machine):
    code, out, err = run(capsys, "topo", *source_args(TOPOLOGY_FIXTURES / machine))
    assert code == 0, err
    assert "socket" in out and "Traceback" not in out + err


@pytest.mark.parametrize("name", ["moment-a", "moment-b"])
def test_bundled_machines(capsys, tmp_path, name):
    svg = tmp_path / f"{name}.svg"
    code, out, err = run(capsys, "topo", "--machine", name, "--svg", str(svg))
    assert code == 0, err
    assert "GB/s" in out and "switch" in out
    assert svg.read_text().lstrip().startswith(("<?xml", "<svg"))
    code, out, _ = run(capsys, "topo", "--machine", name, "--json")
    data = json.loads(out)
    assert data["counts"]["socket"] == 2 and data["counts"]["switch"] >= 2


def test_machines_lists_bundled_specs(capsys):
    code, out, _ = run(capsys, "machines")
    assert code == 0 and "moment-a" in out and "moment-b" in out


def test_live_topology_on_this_machine(capsys):
    code, out, err = run(capsys, "topo", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["counts"]["socket"] >= 1 and data["counts"]["memory"] >= 1


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moment", *argv], capture_output=True, text=True, timeout=120)


BAD_INPUTS = {
    "empty": b"",
    "binary": bytes(range(256)) * 4,
    "truncated-lspci": b"85:02.0 PCI bridge [0604]: Intel Corporation Sky Lake-E PCI Express Root Port C [8086:2032",
    "json": b'{"a": 1}\n',
}


@pytest.mark.parametrize(
    "option", ["--lspci", "--lspci-vvv", "--dmidecode", "--nvidia-smi", "--hwloc", "--nccl-topo", "--machine"]
)
@pytest.mark.parametrize("kind", sorted(BAD_INPUTS))
def test_bad_input_is_a_clear_error_with_status_2(tmp_path, option, kind):
    bad = tmp_path / f"{kind}.txt"
    bad.write_bytes(BAD_INPUTS[kind])
    argv = [option, str(bad)]
    if option == "--dmidecode":  # dmidecode needs a PCI tree beside it; give a good one
        argv = [
            "--lspci-vvv",
            str(topology_fixture("dell-poweredge-r640-2x-xeon-gold6230-nvme", "lspci-vvnn.txt")),
            *argv,
        ]
    code, out, err = _run_main(argv)
    assert code == 2, (option, kind, out, err)
    assert "Traceback" not in err and "internal error" not in err
    assert str(bad) in err or bad.name in err


def _run_main(argv):
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["topo", *argv])
    return code, out.getvalue(), err.getvalue()


def test_wrong_command_output_names_the_mixup(tmp_path):
    dmi = topology_fixture("dell-poweredge-r640-2x-xeon-gold6230-nvme", "dmidecode.txt")
    code, _, err = _run_main(["--lspci", str(dmi)])
    assert code == 2 and "dmidecode.txt" in err


def test_missing_file_and_unknown_machine(tmp_path):
    code, _, err = _run_main(["--lspci", str(tmp_path / "nope.txt")])
    assert code == 2 and "nope.txt" in err
    code, _, err = _run_main(["--machine", "moment-z"])
    assert code == 2 and "moment-z" in err


def test_console_script_runs_as_a_new_user_would():
    proc = _cli("topo", "--machine", "moment-b")
    assert proc.returncode == 0, proc.stderr
    assert "switch" in proc.stdout
    proc = _cli("topo", "--lspci", "/nonexistent/lspci.txt")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
