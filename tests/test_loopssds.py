"""Emulated SSDs (iostack.bench.loopssds): rates, the machine spec and capacities of a set-up, and, where the
machine allows it (root, loop devices, cgroup v1 blkio), real throttled loop devices and ``moment bench ssds``."""

from __future__ import annotations

import mmap
import os
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iostack.bench.loopssds import (
    EmulatedSsd,
    EmulatedSsds,
    EmulationError,
    capacities_for_spec,
    device_reads,
    emulated_ssds,
    emulation_blocked,
    load_state,
    machine_spec_yaml,
    scaled_rates,
    spec_rates,
)
from planner.capacities import Capacities, DeviceCapacity, ReadMeasurement
from planner.topology.spec.load import load_machine_spec


@given(st.lists(st.floats(1e3, 1e7), min_size=1, max_size=8), st.floats(10, 1e6), st.floats(0.05, 1.0),
       st.data())
def test_scaled_rates_sum_to_the_total_and_slow_the_chosen(iops, total, factor, data):
    slow = data.draw(st.lists(st.integers(0, len(iops) - 1), unique=True, max_size=len(iops)))
    out = scaled_rates([x * 8 for x in iops], iops, total, slow=slow, slow_factor=factor)
    assert sum(i for _, i in out) == pytest.approx(total, rel=1e-9)
    scale = out[0][1] / (iops[0] * (factor if 0 in slow else 1.0))
    for k, (b, i) in enumerate(out):
        want = iops[k] * scale * (factor if k in slow else 1.0)
        assert i == pytest.approx(want, rel=1e-9)
        assert b == pytest.approx(8 * i, rel=1e-9)  # bytes/s keep the spec's bytes per read


def test_scaled_rates_refuse_bad_input():
    with pytest.raises(EmulationError, match="slow"):
        scaled_rates([1.0], [1.0], 10, slow=[3])
    with pytest.raises(EmulationError, match="slow_factor"):
        scaled_rates([1.0], [1.0], 10, slow_factor=0)


def test_spec_rates_of_machine_b():
    rates, model = spec_rates("moment-b", 8, 16_000, [6, 7], 0.3)
    assert model == "Intel P5510 3.84 TB"
    assert [round(i) for _, i in rates] == [2424] * 6 + [727] * 2
    assert rates[0][0] / rates[0][1] == pytest.approx(6 * 2**30 / 700_000)  # the P5510's bytes per read


def _state(tmp_path: Path, rates: list[tuple[float, float]]) -> EmulatedSsds:
    devs = tuple(EmulatedSsd(i, str(tmp_path / f"ssd{i}.img"), f"/dev/loop{10 + i}", f"7:{10 + i}",
                             str(tmp_path / f"mnt{i}"), b, q) for i, (b, q) in enumerate(rates))
    return EmulatedSsds(str(tmp_path), "/sys/fs/cgroup/blkio/x", devs, 1 << 30)


def test_machine_spec_installs_the_ssds_at_their_rates(tmp_path):
    state = _state(tmp_path, [(10e6, 2500.0), (3e6, 750.0)])
    topo = load_machine_spec(machine_spec_yaml(state))
    assert topo.node("dev:ssd0").attrs["read_bytes_per_s"] == pytest.approx(10e6)
    assert topo.node("dev:ssd1").attrs["random_read_iops"] == 750


def test_capacities_are_keyed_to_the_spec_nodes(tmp_path):
    state = _state(tmp_path, [(10e6, 2500.0), (3e6, 750.0)])
    caps = Capacities(devices=(DeviceCapacity("block:loop11", ReadMeasurement(3e6, 700.0)),
                               DeviceCapacity("pci:0000:01:00.0", ReadMeasurement(1e9)),
                               DeviceCapacity("block:loop10", ReadMeasurement(9e6, 2400.0))))
    out = capacities_for_spec(caps, state)
    assert [d.key for d in out.devices] == ["dev:ssd1", "pci:0000:01:00.0", "dev:ssd0"]
    assert out.device("dev:ssd0").read_iops == 2400.0


BLOCKED = emulation_blocked()


def _direct_reads(path: Path, n: int) -> float:
    """``n`` 4 KiB O_DIRECT reads of ``path`` at spread offsets, one at a time: reads per second."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT needs
    pages = os.fstat(fd).st_size // 4096
    t = time.perf_counter()
    try:
        for k in range(n):
            os.preadv(fd, [buf], (k * 7919 % pages) * 4096)
    finally:
        os.close(fd)
    return n / (time.perf_counter() - t)


@pytest.mark.skipif(BLOCKED is not None, reason=f"emulated SSDs cannot run here: {BLOCKED}")
def test_throttles_bind_per_device_and_everything_is_removed(tmp_path):
    root = tmp_path / "emu"
    # low rates: one 4 KiB read at a time from Python makes hundreds a second even on a loaded machine, so the
    # throttle (not the CPU) sets the pace; ~1.2 s per device keeps blk-throttle's 100 ms slices a small error
    with emulated_ssds(root, [(40e6, 50.0), (40e6, 15.0)], size_bytes=64 << 20) as state:
        for d in state.devices:
            with open(Path(d.mount) / "f", "wb") as f:
                f.write(os.urandom(4 << 20))
        os.sync()
        before = device_reads(state)
        fast = _direct_reads(Path(state.devices[0].mount) / "f", 60)
        slow = _direct_reads(Path(state.devices[1].mount) / "f", 18)
        after = device_reads(state)
        loops = [d.loop_device for d in state.devices]
    # each device's delivered rate is its throttle (within the slice granularity of blk-throttle)
    assert 0.7 * 50 < fast < 1.3 * 50 and 0.7 * 15 < slow < 1.3 * 15
    assert [r1 - r0 for (_, r0), (_, r1) in zip(before, after, strict=True)] == [60, 18]
    assert not root.joinpath("emulated-ssds.json").exists() and not Path(state.cgroup).exists()
    assert not any(root.glob("*.img")) and not any(root.glob("mnt*"))
    held = Path("/proc/self/mounts").read_text()
    assert not any(loop + " " in held for loop in loops)


@pytest.mark.skipif(BLOCKED is not None, reason=f"emulated SSDs cannot run here: {BLOCKED}")
def test_cli_up_caps_down(tmp_path, capsys):
    from moment.cli import main
    from planner.capacities import load_capacities, save_capacities

    root = tmp_path / "emu"
    assert main(["bench", "ssds", "up", "--root", str(root), "--count", "2", "--size", "64MiB",
                 "--total-iops", "1000", "--slow", "1"]) == 0
    try:
        state = load_state(root)
        assert [round(d.read_iops) for d in state.devices] == [769, 231]
        assert (root / "machine.yaml").exists()
        raw = tmp_path / "profile.yaml"
        save_capacities(Capacities(devices=(DeviceCapacity(f"block:{Path(state.devices[1].loop_device).name}",
                                                           ReadMeasurement(1e6, 230.0)),)), raw)
        assert main(["bench", "ssds", "caps", "--root", str(root), str(raw), str(tmp_path / "caps.yaml")]) == 0
        assert load_capacities(tmp_path / "caps.yaml").devices[0].key == "dev:ssd1"
    finally:
        assert main(["bench", "ssds", "down", "--root", str(root)]) == 0
    assert not Path(state.cgroup).exists() and not list(root.glob("mnt*"))
    with pytest.raises(EmulationError, match="no emulated SSDs"):
        load_state(root)
