"""Several SSDs emulated on real block devices: loop devices, each with its own file system and read throttle.

The paper's placement (DDAK) pays off by balancing reads across SSDs that deliver different
bandwidths; on a machine with one disk that mechanism cannot show. This module makes N block
devices out of N backing files on that disk (``losetup --direct-io=on``: the loop device's reads
reach the backing file past the page cache), puts an ext4 file system on each, mounts them under
``root/mnt{i}``, and gives each its own read rate with the cgroup v1 blkio controller: a cgroup
``/sys/fs/cgroup/blkio/<name>`` with ``blkio.throttle.read_bps_device`` and
``blkio.throttle.read_iops_device`` set per device (``MAJ:MIN value``). Processes that join the
cgroup (:func:`join_cgroup`; child processes inherit it) read each device at most at its rate;
the sum of the rates is kept below what the disk itself delivers, so that the throttles, not the
disk, set each device's rate. ``blkio.throttle.io_service_bytes`` of the cgroup counts the bytes
read per device (:func:`device_reads`): each device's measured share of the reads.

Root only, Linux only: :func:`emulation_blocked` says why it cannot run here (one line), and
everything made is undone by :func:`teardown_emulated_ssds` (unmount, ``losetup -d``, delete the
backing files, remove the cgroup), which :func:`emulated_ssds` runs on exit, on an exception and
on Ctrl-C. The devices are described by a state file (``root/emulated-ssds.json``) so that a
set-up made by one command (``moment bench ssds up``) is torn down by another (``down``).

:func:`machine_spec_yaml` writes a machine spec of the emulated box (one socket, one GPU slot,
the N SSDs installed as ``dev:ssd0`` ... with their throttled rates) and
:func:`capacities_for_spec` re-keys a ``moment profile`` of the mounts (keyed ``block:loopN``)
to those node ids, so that ``moment plan --machine SPEC --capacities CAPS`` plans with the
measured rates and ``moment place --ssd root/mnt0 ... --ssd root/mnt{N-1}`` fills the bins in
the plan's order.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from iostack.errors import StoreError
from planner.capacities import Capacities

#: where the cgroup v1 blkio controller is mounted
BLKIO_ROOT = Path("/sys/fs/cgroup/blkio")

#: the state file a set-up leaves in its root (read by :func:`load_state`)
STATE_FILE = "emulated-ssds.json"

#: the read size the IOPS throttle is sized for (the store's page)
PAGE_BYTES = 4096

#: the tools a set-up runs
TOOLS = ("losetup", "mkfs.ext4", "mount", "umount")


class EmulationError(StoreError):
    """The emulated SSDs cannot be made or used here (not root, no loop devices, no blkio controller)."""


@dataclass(frozen=True)
class EmulatedSsd:
    """One emulated SSD: its backing file, loop device (``/dev/loopN``, ``maj_min``), mount and read limits."""

    index: int
    backing_file: str
    loop_device: str
    maj_min: str
    mount: str
    read_bytes_per_s: float
    read_iops: float


@dataclass(frozen=True)
class EmulatedSsds:
    """A set-up: the devices and the blkio cgroup (a directory) whose members are throttled."""

    root: str
    cgroup: str
    devices: tuple[EmulatedSsd, ...]
    size_bytes: int

    @property
    def mounts(self) -> list[str]:
        return [d.mount for d in self.devices]


def emulation_blocked(blkio_root: Path = BLKIO_ROOT) -> str | None:
    """Why emulated SSDs cannot be set up here (one line), or None when they can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root (loop devices, mounts and blkio cgroups)"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"needs {', '.join(missing)} on PATH"
    if not Path("/dev/loop-control").exists():
        return "no loop devices here (/dev/loop-control is missing)"
    if not (blkio_root / "blkio.throttle.read_bps_device").exists():
        return f"no cgroup v1 blkio controller with throttling at {blkio_root}"
    return None


def scaled_rates(spec_bytes_per_s: Sequence[float], spec_iops: Sequence[float], total_iops: float,
                 slow: Sequence[int] = (), slow_factor: float = 0.3) -> list[tuple[float, float]]:
    """Each SSD's ``(read bytes/s, read IOPS)``: a spec's figures scaled so that the IOPS sum to ``total_iops``,
    the devices ``slow`` (indices) at ``slow_factor`` of theirs (a congested switch).

    >>> [(round(b), round(i)) for b, i in scaled_rates([6e9, 6e9], [7e5, 7e5], 1300, slow=[1], slow_factor=0.3)]
    [(8571429, 1000), (2571429, 300)]

    Raises
    ------
    EmulationError
        When the lists differ in length, a figure is not positive, or ``slow_factor`` is not in (0, 1].
    """
    if len(spec_bytes_per_s) != len(spec_iops) or not spec_iops:
        raise EmulationError("`spec_bytes_per_s` and `spec_iops` need one figure per SSD, at least one")
    if min(*spec_bytes_per_s, *spec_iops) <= 0 or total_iops <= 0 or not 0 < slow_factor <= 1:
        raise EmulationError("rates must be positive and `slow_factor` in (0, 1]")
    bad = [i for i in slow if not 0 <= i < len(spec_iops)]
    if bad:
        raise EmulationError(f"`slow` {bad}: no such SSD (0..{len(spec_iops) - 1})")
    f = [slow_factor if i in set(slow) else 1.0 for i in range(len(spec_iops))]
    scale = total_iops / sum(x * k for x, k in zip(spec_iops, f, strict=True))
    return [(b * k * scale, i * k * scale) for b, i, k in zip(spec_bytes_per_s, spec_iops, f, strict=True)]


def spec_rates(machine: str, count: int, total_iops: float, slow: Sequence[int] = (),
               slow_factor: float = 0.3) -> tuple[list[tuple[float, float]], str]:
    """:func:`scaled_rates` for ``count`` SSDs of a machine spec's inventory (``"moment-b"``: Intel P5510, 6 GiB/s
    and 700k IOPS each; cycled when it lists fewer), and the model emulated.

    Raises
    ------
    EmulationError
        When the spec lists no NVMe SSD with a read bandwidth and IOPS, or as :func:`scaled_rates` does.
    """
    from planner.topology.spec.load import spec_inventory

    items = [i for i in spec_inventory(machine) for _ in range(i.count)
             if i.kind.value == "nvme" and "read_bytes_per_s" in i.attrs and "random_read_iops" in i.attrs]
    if not items or count < 1:
        raise EmulationError(f"`machine` {machine}: its inventory lists no NVMe SSD with read_bandwidth and "
                             "random_read_iops" if not items else f"`count` {count}: need at least one SSD")
    picked = [items[k % len(items)] for k in range(count)]
    rates = scaled_rates([float(i.attrs["read_bytes_per_s"]) for i in picked],
                         [float(i.attrs["random_read_iops"]) for i in picked], total_iops, slow, slow_factor)
    return rates, picked[0].model


def _run(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()
    except FileNotFoundError:
        raise EmulationError(f"{cmd[0]}: not found on PATH") from None
    except subprocess.CalledProcessError as exc:
        raise EmulationError(f"{' '.join(cmd)} failed: {(exc.stderr or exc.stdout).strip()[:300]}") from None


def _maj_min(dev: str) -> str:
    st = os.stat(dev)
    return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"


def _write_limit(cgroup: Path, name: str, maj_min: str, value: float) -> None:
    (cgroup / name).write_text(f"{maj_min} {max(1, int(value))}\n")


def setup_emulated_ssds(root: str | os.PathLike[str], rates: Sequence[tuple[float, float]], *, size_bytes: int,
                        cgroup_name: str | None = None, blkio_root: Path = BLKIO_ROOT) -> EmulatedSsds:
    """Make ``len(rates)`` emulated SSDs under ``root`` (``rates``: each one's read bytes/s and IOPS).

    Each gets a sparse backing file ``root/ssd{i}.img`` of ``size_bytes``, a loop device with direct
    I/O, ext4 and a mount at ``root/mnt{i}``; the cgroup ``blkio_root/cgroup_name`` (default: named after
    ``root``) gets each device's
    read limits. The state is written to ``root/emulated-ssds.json``. What was made is undone again
    when a step fails.

    Raises
    ------
    EmulationError
        When :func:`emulation_blocked` names a reason, ``root`` already holds a set-up, or a step fails.
    """
    why = emulation_blocked(blkio_root)
    if why:
        raise EmulationError(f"cannot emulate SSDs here: {why}")
    if size_bytes < 64 << 20:
        raise EmulationError(f"`size_bytes` {size_bytes}: each emulated SSD needs at least 64 MiB")
    base = Path(root).resolve()
    if (base / STATE_FILE).exists():
        raise EmulationError(f"{base}: holds emulated SSDs already (tear them down first)")
    base.mkdir(parents=True, exist_ok=True)
    # one cgroup per root (two set-ups never share one: tearing one down must not free the other's members)
    cgroup = blkio_root / (cgroup_name or f"moment-ssds-{zlib.crc32(str(base).encode()):08x}")
    made: list[EmulatedSsd] = []  # what a failed set-up undoes (a device is listed once its loop device exists)
    try:
        cgroup.mkdir(exist_ok=True)
        for i, (bps, iops) in enumerate(rates):
            _make_one(base, i, size_bytes, bps, iops, cgroup, made)
    except BaseException:
        teardown_emulated_ssds(EmulatedSsds(str(base), str(cgroup), tuple(made), size_bytes))
        raise
    state = EmulatedSsds(str(base), str(cgroup), tuple(made), size_bytes)
    (base / STATE_FILE).write_text(json.dumps(asdict(state), indent=1))
    return state


def _make_one(base: Path, i: int, size_bytes: int, bps: float, iops: float, cgroup: Path,
              made: list[EmulatedSsd]) -> None:
    img, mnt = base / f"ssd{i}.img", base / f"mnt{i}"
    with open(img, "wb") as f:  # sparse: the disk holds only what is written
        f.truncate(size_bytes)
    made.append(EmulatedSsd(i, str(img), "", "", "", float(bps), float(iops)))
    _run("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", str(img))
    dev = _run("losetup", "--direct-io=on", "--find", "--show", str(img))
    made[-1] = replace(made[-1], loop_device=dev, maj_min=_maj_min(dev))
    mnt.mkdir(exist_ok=True)
    made[-1] = replace(made[-1], mount=str(mnt))
    _run("mount", "-o", "noatime", dev, str(mnt))
    _write_limit(cgroup, "blkio.throttle.read_bps_device", made[-1].maj_min, bps)
    _write_limit(cgroup, "blkio.throttle.read_iops_device", made[-1].maj_min, iops)


def load_state(root: str | os.PathLike[str]) -> EmulatedSsds:
    """The set-up described by ``root/emulated-ssds.json``.

    Raises
    ------
    EmulationError
        When ``root`` holds no state file.
    """
    p = Path(root) / STATE_FILE
    try:
        raw = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise EmulationError(f"{p}: no emulated SSDs described here ({exc})") from None
    return EmulatedSsds(raw["root"], raw["cgroup"], tuple(EmulatedSsd(**d) for d in raw["devices"]),
                        int(raw["size_bytes"]))


def join_cgroup(state: EmulatedSsds, pid: int | None = None) -> None:
    """Put process ``pid`` (default: this one) into the set-up's cgroup: its reads, and those of the children it
    starts from now on, are throttled.

    Raises
    ------
    EmulationError
        When the cgroup is gone or refuses the process.
    """
    try:
        (Path(state.cgroup) / "cgroup.procs").write_text(f"{pid or os.getpid()}\n")
    except OSError as exc:
        raise EmulationError(f"{state.cgroup}: cannot join the cgroup ({exc.strerror or exc})") from None


def _leave_cgroup(cgroup: Path) -> None:
    """Move every process of ``cgroup`` back to the controller's root (a cgroup with members cannot be removed)."""
    procs = cgroup / "cgroup.procs"
    if not procs.exists():
        return
    for pid in procs.read_text().split():
        with contextlib.suppress(OSError):  # gone meanwhile
            (cgroup.parent / "cgroup.procs").write_text(f"{pid}\n")


def device_reads(state: EmulatedSsds) -> list[tuple[int, int]]:
    """``(bytes, requests)`` read so far through each device by the cgroup's members
    (``blkio.throttle.io_service_bytes`` and ``io_serviced``), in the order of ``state.devices``."""
    def column(name: str) -> dict[str, int]:
        seen: dict[str, int] = {}
        for line in (Path(state.cgroup) / name).read_text().splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] == "Read":
                seen[parts[0]] = int(parts[2])
        return seen

    nbytes, ops = column("blkio.throttle.io_service_bytes"), column("blkio.throttle.io_serviced")
    return [(nbytes.get(d.maj_min, 0), ops.get(d.maj_min, 0)) for d in state.devices]


def teardown_emulated_ssds(state: EmulatedSsds) -> list[str]:
    """Undo a set-up: unmount, detach each loop device, delete the backing files, the state file and the cgroup.

    Best effort: every step is tried; returns what could not be undone (one line each, empty when all was).
    """
    left: list[str] = []
    for d in state.devices:
        if d.mount and os.path.ismount(d.mount):
            err = _unmount(d.mount)
            if err:
                left.append(err)
        if d.loop_device:
            try:
                _run("losetup", "-d", d.loop_device)
            except EmulationError as exc:
                left.append(str(exc))
        for p, rm in ((d.mount, os.rmdir), (d.backing_file, os.unlink)):
            with contextlib.suppress(OSError):
                if p:
                    rm(p)
    with contextlib.suppress(OSError):
        (Path(state.root) / STATE_FILE).unlink()
    cg = Path(state.cgroup)
    if cg.exists():
        _leave_cgroup(cg)
        try:
            cg.rmdir()
        except OSError as exc:
            left.append(f"{cg}: cannot remove the cgroup ({exc.strerror or exc})")
    return left


def _unmount(mount: str, tries: int = 10) -> str | None:
    """Unmount ``mount``, waiting for a moment while it is busy (a child killed by the same Ctrl-C may still
    hold a file), then lazily (it goes once the last user does; the loop device is then freed by its
    autoclear flag, which ``losetup -d`` of a busy device sets). The reason when even that fails."""
    for _ in range(tries):
        try:
            _run("umount", mount)
            return None
        except EmulationError:
            time.sleep(0.3)
    try:
        _run("umount", "-l", mount)
        return None
    except EmulationError as exc:
        return str(exc)


@contextlib.contextmanager
def emulated_ssds(root: str | os.PathLike[str], rates: Sequence[tuple[float, float]], *, size_bytes: int,
                  cgroup_name: str | None = None, join: bool = True) -> Iterator[EmulatedSsds]:
    """:func:`setup_emulated_ssds`, this process in the cgroup (``join``), and :func:`teardown_emulated_ssds` on
    the way out: on return, on an exception, on Ctrl-C and on SIGTERM (turned into ``SystemExit`` while inside).

    Raises
    ------
    EmulationError
        As :func:`setup_emulated_ssds` does.
    """
    state = setup_emulated_ssds(root, rates, size_bytes=size_bytes, cgroup_name=cgroup_name)
    old = None
    try:
        with contextlib.suppress(ValueError):  # not the main thread: SIGTERM keeps its handler
            old = signal.signal(signal.SIGTERM, _exit_on_term)
        if join:
            join_cgroup(state)
        yield state
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
        teardown_emulated_ssds(state)


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def machine_spec_yaml(state: EmulatedSsds, *, name: str = "emulated-ssds",
                      gpu_model: str = "NVIDIA A100 40GB PCIe") -> str:
    """A machine spec (``docs/machine-spec.md``) of the emulated box: one socket, one empty GPU slot and the
    GPU in the inventory, the SSDs installed as ``dev:ssd{i}`` with their throttled rates."""
    lines = ["schema: moment.machine", "version: 1", f"name: {name}",
             f"description: {len(state.devices)} SSDs emulated by throttled loop devices under {state.root}",
             "defaults:", "  pcie_gen: 4", "sockets:", "  - id: 0", "    numa_nodes: [0]", "    ports:",
             "      - slot: gpu-slot0", "        form_factor: cem", "        lanes: 16", "        double_width: true"]
    for d in state.devices:
        lines += [f"      - slot: bay{d.index}", "        form_factor: u.2", "        lanes: 4",
                  f"        device: {{id: ssd{d.index}, kind: nvme, model: emulated SSD {d.loop_device}, "
                  f"read_bandwidth: {d.read_bytes_per_s:.0f} B/s, random_read_iops: {d.read_iops:.0f}}}"]
    lines += ["inventory:", "  - kind: gpu", f"    model: {gpu_model}", "    count: 1", "    form_factor: cem",
              "    double_width: true"]
    return "\n".join(lines) + "\n"


def capacities_for_spec(caps: Capacities, state: EmulatedSsds) -> Capacities:
    """``caps`` (a ``moment profile`` of the mounts) with each emulated device's entry keyed by its node id in
    :func:`machine_spec_yaml`'s spec (``dev:ssd{i}``) instead of ``block:loopN``; other entries as they were."""
    by_dev = {os.path.basename(d.loop_device): f"dev:ssd{d.index}" for d in state.devices}
    out = []
    for dc in caps.devices:
        name = dc.key.removeprefix("block:")
        key = by_dev.get(name) or by_dev.get(dc.block_device or "")
        out.append(replace(dc, key=key) if key else dc)
    return replace(caps, devices=tuple(out))


__all__ = ["BLKIO_ROOT", "EmulatedSsd", "EmulatedSsds", "EmulationError", "capacities_for_spec", "emulated_ssds",
           "emulation_blocked", "join_cgroup", "load_state", "machine_spec_yaml", "device_reads",
           "scaled_rates", "setup_emulated_ssds", "spec_rates", "teardown_emulated_ssds"]
