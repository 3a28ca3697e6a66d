"""Profiling: fio output, Moment's own reader, memory, block devices and `moment profile`.

Sizes and durations are tiny: these tests check that the measurements run,
read the right bytes and report what they did, never how fast anything is.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwprofile import (
    MemoryProbe,
    ProfileError,
    ProfileSpec,
    SsdProbe,
    cuda_bandwidths,
    host_memory_bandwidth,
    memory_bandwidth_by_node,
    posix_random_read,
    profile_machine,
    ssd_random_read,
    write_test_file,
)
from hwprofile.ssd import MAGIC, read_blocks
from moment.cli import main
from planner.capacities import load_capacities
from planner.errors import ParseError
from planner.fio import fio_command, parse_fio_json, run_fio
from planner.hostinfo import _disk_from_sysfs, block_device_of
from tests.conftest import REPO

FIO_DATA = Path(__file__).parent / "data" / "fio"
URING = FIO_DATA / "fio-3.33-io_uring-randread-4k-qd64.json"
PSYNC = FIO_DATA / "fio-3.33-psync-randread-4k-8threads.json"
MISSING = FIO_DATA / "fio-3.33-missing-file.out"

TINY = dict(seconds=0.05, queue_depth=2, processes=1)


# -- fio output ----------------------------------------------------------------


def test_parse_fio_io_uring_capture():
    run = parse_fio_json(URING.read_text(), str(URING))
    assert run.version == "fio-3.33"
    assert run.read_iops == pytest.approx(73462.512496)
    assert run.read_bytes_per_s == 300902451
    assert run.read_bytes == 903008256 and run.total_ios == 220461
    assert run.read_bytes == run.total_ios * 4096
    assert run.runtime_s == pytest.approx(3.001)
    assert (run.engine, run.iodepth, run.numjobs, run.block_bytes, run.direct) == ("io_uring", 64, 1, 4096, True)
    assert run.error == 0


def test_parse_fio_psync_capture():
    run = parse_fio_json(PSYNC.read_text(), str(PSYNC))
    assert run.read_iops == pytest.approx(57235.382309)
    assert run.read_bytes_per_s == 234436125
    assert (run.engine, run.iodepth, run.numjobs) == ("psync", 1, 8)


def test_parse_fio_error_output():
    # fio's complaints come first, then JSON reporting error 2 and no I/O
    run = parse_fio_json(MISSING.read_text(), str(MISSING))
    assert run.error == 2 and run.total_ios == 0


@pytest.mark.parametrize(("text", "line", "needle"), [
    ("", None, "fio JSON output"),
    ("fio: engine bogus not loadable\nfio: failed to load engine\n", 1, "not loadable"),
    ('\n{"fio version": "fio-3.33", "jobs": [', 2, "valid JSON"),
    ('{"jobs": []}', 1, "'fio version'"),
    ('{"fio version": "x", "jobs": []}', 1, "non-empty 'jobs'"),
    ('{"fio version": "x", "jobs": [{"read": {"iops": "many"}}]}', 1, "read iops"),
    ('{"fio version": "x", "jobs": [{"write": {}}]}', 1, "'read' object"),
    ("[1, 2]", 1, "fio JSON output"),
])
def test_parse_fio_rejects(text, line, needle):
    with pytest.raises(ParseError) as err:
        parse_fio_json(text, "fio.json")
    assert err.value.line == line and needle in str(err.value)


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_mutated_fio_output_raises_only_parse_error(data):
    text = URING.read_text()
    lines = text.split("\n")
    mutated = data.draw(st.one_of(
        st.integers(0, len(text)).map(lambda i: text[:i]),
        st.integers(0, len(lines) - 1).map(lambda i: "\n".join(lines[:i] + lines[i + 1:])),
        st.tuples(st.integers(0, len(text) - 1), st.characters()).map(
            lambda t: text[:t[0]] + t[1] + text[t[0] + 1:]),
        st.text(max_size=200),
    ))
    try:
        parse_fio_json(mutated, "m.json")
    except ParseError as exc:
        assert exc.source == "m.json"


def test_fio_command():
    cmd = fio_command("/data/a:b.dat", block_bytes=4096, queue_depth=64, seconds=2.5,
                      file_bytes=1 << 30, direct=True, engine="io_uring")
    assert "--filename=/data/a\\:b.dat" in cmd and "--readonly" in cmd
    assert {"--iodepth=64", "--numjobs=1", "--runtime=2500ms", "--direct=1", "--size=1073741824"} <= set(cmd)
    sync = fio_command("/f", block_bytes=8192, queue_depth=16, seconds=1, file_bytes=8192,
                       direct=False, engine="psync")
    assert {"--iodepth=1", "--numjobs=16", "--thread", "--direct=0", "--bs=8192"} <= set(sync)


def _fake_fio(tmp_path: Path, ok_engines: set[str]) -> str:
    """An executable answering like fio: the io_uring capture for engines in ``ok_engines``."""
    script = tmp_path / "fio"
    script.write_text(f"""#!{sys.executable}
import sys
args = sys.argv[1:]
if args == ["--enghelp"]:
    print("Available IO engines:\\n\\tpsync\\n\\tio_uring\\n\\tlibaio")
    sys.exit(0)
engine = next(a.split("=", 1)[1] for a in args if a.startswith("--ioengine="))
if engine in {sorted(ok_engines)!r}:
    sys.stdout.write(open({str(URING)!r}).read())
    sys.exit(0)
sys.stderr.write("fio: io engine " + engine + " init failed.\\n")
sys.stdout.write(open({str(MISSING)!r}).read().split("\\n", 3)[3])
sys.exit(1)
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_run_fio_falls_back_to_the_next_engine(tmp_path):
    fio = _fake_fio(tmp_path, {"libaio"})
    m, failures = run_fio("/f", block_bytes=4096, queue_depth=64, seconds=1, file_bytes=1 << 30,
                          direct=True, fio=fio)
    assert m.tool == "fio-libaio" and m.read_iops == pytest.approx(73462.512496)
    assert m.read_bytes_per_s == 300902451 and m.mode == "direct" and m.queue_depth == 64
    assert failures == ["fio io_uring: fio: io engine io_uring init failed."]


def test_run_fio_fails_clearly(tmp_path):
    fio = _fake_fio(tmp_path, set())
    with pytest.raises(ProfileError, match="failed with every engine: fio io_uring: .*init failed"):
        run_fio("/f", block_bytes=4096, queue_depth=4, seconds=1, file_bytes=1 << 20, direct=True, fio=fio)


# -- test files and Moment's reader ----------------------------------------------


def test_test_file_is_fully_written_with_offset_headers(tmp_path):
    p = write_test_file(tmp_path, 64 * 1024 + 100)  # rounded up to 512 bytes
    data = p.read_bytes()
    assert len(data) == 64 * 1024 + 512
    assert data.count(0) < len(data) // 50  # real data, not zeros
    for off in range(0, len(data), 512):
        assert int.from_bytes(data[off:off + 8], "little") ^ MAGIC == off
    blocks = {data[i:i + 4096] for i in range(0, 64 * 1024, 4096)}
    assert len(blocks) == 16  # no two blocks alike


def test_reader_returns_the_files_bytes(tmp_path):
    p = write_test_file(tmp_path, 256 * 1024)
    data = p.read_bytes()
    rng = random.Random(7)
    offsets = [rng.randrange(256 // 4) * 4096 for _ in range(12)]
    for direct in (False, True):
        try:
            got = read_blocks(str(p), offsets, 4096, direct=direct)
        except ProfileError as exc:
            assert direct and "O_DIRECT" in str(exc)  # a file system without O_DIRECT
            continue
        assert got == [data[o:o + 4096] for o in offsets]


def test_reader_measures_and_checks_every_block(tmp_path):
    p = write_test_file(tmp_path, 256 * 1024)
    m = posix_random_read(p, block_bytes=4096, queue_depth=4, seconds=0.05, direct=False,
                          verify=True, processes=2)
    assert m.tool == "moment-posix" and m.read_iops > 0
    assert m.read_bytes_per_s == pytest.approx(m.read_iops * 4096)
    assert m.queue_depth == 4 and "2 processes x 2 threads" in m.jobs and "checked" in m.jobs
    assert m.file_bytes == 256 * 1024


def test_reader_catches_a_wrong_block(tmp_path):
    p = write_test_file(tmp_path, 8 * 4096)
    with open(p, "r+b") as fh:  # block 3 now holds block 5's data
        fh.seek(5 * 4096)
        five = fh.read(4096)
        fh.seek(3 * 4096)
        fh.write(five)
    with pytest.raises(ProfileError, match="offset 12288 is not the one written"):
        posix_random_read(p, block_bytes=4096, queue_depth=2, seconds=0.2, direct=False,
                          verify=True, processes=1)


def test_ssd_random_read_in_a_directory(tmp_path):
    m = ssd_random_read(tmp_path, file_bytes=128 * 1024, use_fio=False, **TINY)
    assert m.created and m.verified and not m.kept
    assert [r.tool for r in m.results] == ["moment-posix"]
    assert m.best.read_iops > 0 and m.best.block_bytes == 4096 and m.best.mode == m.mode
    assert m.mode in ("direct", "buffered") and (m.mode == "direct") == (m.mode_note is None)
    assert m.not_measured == ("fio: not run (asked not to)",)
    assert list(tmp_path.iterdir()) == []  # the test file is gone


def test_ssd_random_read_keeps_the_file_when_asked(tmp_path):
    m = ssd_random_read(tmp_path, file_bytes=64 * 1024, use_fio=False, keep_file=True, **TINY)
    assert m.kept and Path(m.path).exists() and Path(m.path).stat().st_size == 64 * 1024


def test_ssd_random_read_of_an_existing_file_leaves_it_alone(tmp_path):
    p = tmp_path / "user.dat"
    p.write_bytes(os.urandom(40 * 1024 + 123))
    before = hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns
    m = ssd_random_read(p, use_fio=False, **TINY)
    assert not m.created and not m.verified and m.file_bytes == 40 * 1024
    assert (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) == before


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")
def test_ssd_random_read_with_real_fio(tmp_path):
    m = ssd_random_read(tmp_path, file_bytes=256 * 1024, seconds=0.1, queue_depth=4, processes=1)
    tools = [r.tool for r in m.results]
    assert tools[0].startswith("fio-") and tools[1] == "moment-posix"
    fio = m.results[0]
    assert fio.read_iops > 0 and fio.mode == m.mode and fio.file_bytes == 256 * 1024
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("kwargs", "needle"), [
    (dict(block_bytes=1000), "multiple of 512"),
    (dict(queue_depth=0), "queue depth"),
    (dict(seconds=0), "duration"),
    (dict(file_bytes=100), "file size"),
])
def test_ssd_random_read_rejects_bad_parameters(tmp_path, kwargs, needle):
    with pytest.raises(ProfileError, match=needle):
        ssd_random_read(tmp_path, **{"use_fio": False, **kwargs})


def test_ssd_random_read_bad_paths(tmp_path):
    with pytest.raises(ProfileError, match="no such directory or file"):
        ssd_random_read(tmp_path / "missing", use_fio=False)
    small = tmp_path / "small"
    small.write_bytes(b"x" * 100)
    with pytest.raises(ProfileError, match="smaller than one block"):
        ssd_random_read(small, use_fio=False)
    with pytest.raises(ProfileError, match="free|cannot create|not writable"):
        ssd_random_read("/proc", file_bytes=1 << 20, use_fio=False)


# -- block devices --------------------------------------------------------------


def _fake_sysfs(root: Path) -> Path:
    def disk(path: str, dev: str, model: str | None = None, partition: str | None = None) -> Path:
        d = root / "devices" / path
        d.mkdir(parents=True)
        (d / "dev").write_text(dev + "\n")
        if model:
            (d.parent / "model").write_text(model + "  \n")  # the controller's
        (root / "class" / "block").mkdir(parents=True, exist_ok=True)
        (root / "class" / "block" / d.name).symlink_to(d)
        (root / "dev" / "block").mkdir(parents=True, exist_ok=True)
        (root / "dev" / "block" / dev).symlink_to(d)
        if partition:
            p = d / partition
            p.mkdir()
            (p / "partition").write_text("1\n")
            (root / "dev" / "block" / "259:1").symlink_to(p)
        return d

    disk("pci0000:00/0000:00:02.0/virtio1/block/vda", "254:0")
    nvme = disk("pci0000:80/0000:80:01.0/0000:81:00.0/nvme/nvme0/nvme0n1", "259:0",
                model="SAMSUNG MZQL23T8HCLS-00A07", partition="nvme0n1p1")
    (nvme / "device").symlink_to(nvme.parent)
    dm = disk("virtual/block/dm-0", "253:0")
    (dm / "slaves").mkdir()
    (dm / "slaves" / "nvme0n1").symlink_to(nvme)
    md = disk("virtual/block/md0", "9:0")
    (md / "slaves").mkdir()
    for s in ("sda", "sdb"):
        (md / "slaves" / s).mkdir()
    disk("virtual/block/loop0", "7:0")
    return root


def test_block_devices_from_sysfs(tmp_path):
    root = _fake_sysfs(tmp_path)
    vda = _disk_from_sysfs(254, 0, root)
    assert (vda.name, vda.pci_address, vda.kind) == ("vda", "0000:00:02.0", "virtio")
    assert "virtual machine" in vda.notes[0]
    part = _disk_from_sysfs(259, 1, root)  # a partition resolves to its disk
    assert (part.name, part.pci_address, part.model) == ("nvme0n1", "0000:81:00.0", "SAMSUNG MZQL23T8HCLS-00A07")
    dm = _disk_from_sysfs(253, 0, root)
    assert (dm.name, dm.pci_address, dm.backing) == ("nvme0n1", "0000:81:00.0", ("nvme0n1",))
    assert "dm-0 is a device-mapper/md device over nvme0n1" in dm.notes[0]
    md = _disk_from_sysfs(9, 0, root)
    assert md.pci_address is None and md.backing == ("sda", "sdb") and "array" in md.notes[0]
    loop = _disk_from_sysfs(7, 0, root)
    assert loop.pci_address is None and loop.kind == "loop"
    assert _disk_from_sysfs(8, 99, root).name is None


def test_block_device_of_real_paths(tmp_path):
    info = block_device_of(tmp_path)  # whatever this machine has; never raises
    assert info.name is None or info.major is not None
    assert block_device_of(tmp_path / "missing").notes[0].startswith("cannot stat")


# -- memory and CUDA -------------------------------------------------------------


def test_memory_bandwidth_is_positive():
    assert host_memory_bandwidth(8 << 20, repeats=2) > 0
    assert host_memory_bandwidth(8 << 20, repeats=1, threads=2) > 0
    with pytest.raises(ProfileError):
        host_memory_bandwidth(100)


def test_memory_per_numa_node(tmp_path):
    cpu = sorted(os.sched_getaffinity(0))[0]
    for node, cpus in ((0, str(cpu)), (1, "")):
        d = tmp_path / "devices" / "system" / "node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
    mems, notes = memory_bandwidth_by_node(4 << 20, repeats=1, sys_root=tmp_path)
    assert [(m.numa_node, m.threads, m.convention, m.method) for m in mems] == [(0, 1, "stream-copy", "numpy-copy")]
    assert mems[0].bytes_per_s > 0
    assert notes == ["memory of NUMA node 1: not measured: the node has no CPUs"]
    assert os.sched_getaffinity(0) >= {cpu}  # unpinned again
    mems, _ = memory_bandwidth_by_node(4 << 20, repeats=1, sys_root=tmp_path / "none")
    assert mems[0].numa_node is None


def test_cuda_without_torch_is_skipped_cleanly(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch → ImportError
    links, eff, notes = cuda_bandwidths()
    assert links == [] and eff is None
    assert notes == ["host↔GPU and GPU↔GPU links: not measured: PyTorch is not installed"]


# -- the whole machine and the command line ---------------------------------------


def test_profile_machine_tiny(tmp_path):
    from planner.capacities import apply_capacities, measured_figures
    from planner.topology.discover import live_topology

    try:
        topo = live_topology()
    except Exception:
        topo = None
    seen: list[str] = []
    calls: list[tuple[str, int, int | None]] = []

    def progress(stage: str, done: int, total: int | None) -> None:
        seen.append(stage)
        calls.append((stage, done, total))

    spec = ProfileSpec(SsdProbe([tmp_path], file_bytes=64 * 1024, seconds=0.05, queue_depth=2, use_fio=False,
                                processes=1), memory=MemoryProbe(4 << 20, repeats=1))
    caps = profile_machine(spec, topo, progress=progress)
    assert len(caps.devices) == 1
    dev = caps.devices[0]
    assert dev.read.tool == "moment-posix" and dev.path == str(tmp_path)
    assert caps.memory and all(m.bytes_per_s > 0 for m in caps.memory)
    assert any("not measured" in n for n in caps.notes)
    assert any("moment-posix" in s for s in seen)
    writes = [(d, t) for s, d, t in calls if s.startswith("writing the test file")]
    assert writes and writes[-1] == (64 * 1024, 64 * 1024)  # the test file's bar ends full
    if topo is not None and dev.key in topo:
        new = apply_capacities(topo, caps)
        assert new.node(dev.key).attrs["read_source"] == "measured"
        assert (dev.key, "read_bytes_per_s", "measured") in measured_figures(new)


@pytest.mark.parametrize("make, match", [
    (lambda: SsdProbe(block_bytes=1000), "block size 1000"),
    (lambda: SsdProbe(seconds=0), "duration 0"),
    (lambda: SsdProbe(block_bytes=8192, file_bytes=4096), "file size 4096"),
    (lambda: MemoryProbe(array_bytes=100), "memory test"),
    (lambda: MemoryProbe(repeats=0), "memory test"),
    (lambda: ProfileSpec(ssd=MemoryProbe()), "expected an SsdProbe"),
])
def test_profile_specs_refuse_bad_values_before_measuring(make, match):
    with pytest.raises(ProfileError, match=match):
        make()


def test_cli_end_to_end(tmp_path, capsys):
    out = tmp_path / "caps.yaml"
    ssd = tmp_path / "ssd"
    ssd.mkdir()
    code = main(["profile", "--ssd", str(ssd), "--file-size", "64KiB", "--seconds", "0.05",
                 "--queue-depth", "2", "--no-fio", "--no-memory", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "moment-posix" in printed and "capacities written to" in printed
    caps = load_capacities(out)
    assert len(caps.devices) == 1 and caps.devices[0].read.tool == "moment-posix"
    assert caps.devices[0].read.file_bytes == 64 * 1024 and caps.devices[0].read.queue_depth == 2
    assert caps.memory == ()
    assert list(ssd.iterdir()) == []


@pytest.mark.parametrize(("args", "needle"), [
    (["--ssd", "/nonexistent/dir"], "no such directory or file"),
    (["--file-size", "4 parsecs"], "is not a size"),
    (["--block-size", "1000"], "multiple of 512"),
    (["--queue-depth", "many"], "expected a whole number"),
    (["--seconds", "-1"], "duration"),
    (["--out", "/nonexistent/dir/caps.yaml"], "(/nonexistent/dir: no such directory)"),
])
def test_cli_bad_input(tmp_path, capsys, args, needle):
    base = ["profile", "--ssd", str(tmp_path), "--file-size", "64KiB", "--seconds", "0.05",
            "--no-fio", "--no-memory"]
    assert main(base + args) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    assert len([ln for ln in err.splitlines() if ln.startswith("moment profile: error")]) == 1


def test_cli_bad_input_in_a_real_process(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "moment", "profile", "--ssd", str(tmp_path / "nope")],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no such directory" in proc.stderr


def test_reader_reports_a_file_it_cannot_open(tmp_path):
    with pytest.raises(ProfileError, match="cannot open .*No such file"):
        posix_random_read(tmp_path / "gone", block_bytes=4096, queue_depth=2, seconds=0.05,
                          direct=False, file_bytes=1 << 20, processes=2)


def test_host_device_copies_run_on_the_gpus_socket(tmp_path):
    """The pinned buffer of a host↔GPU copy test is allocated and copied from the GPU's NUMA node."""
    from hwprofile.cuda import _on_numa_node
    from planner.hostinfo import gpu_numa_node

    allowed = sorted(os.sched_getaffinity(0))
    gpu = tmp_path / "bus" / "pci" / "devices" / "0000:b7:00.0"
    gpu.mkdir(parents=True)
    (gpu / "numa_node").write_text("1\n")
    for node, cpus in ((0, "1000-1001"), (1, str(allowed[-1]))):
        d = tmp_path / "devices" / "system" / "node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
    assert gpu_numa_node("0000:b7:00.0", sys_root=tmp_path) == 1
    assert gpu_numa_node("0000:07:00.0", sys_root=tmp_path) is None
    with _on_numa_node(1, tmp_path) as local:
        assert local and os.sched_getaffinity(0) == {allowed[-1]}
    assert sorted(os.sched_getaffinity(0)) == allowed
    with _on_numa_node(0, tmp_path) as local:  # none of node 0's CPUs may be used here
        assert not local
