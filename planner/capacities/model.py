"""The capacities file's contents as frozen dataclasses (schema ``moment.capacities``)."""

from __future__ import annotations

from dataclasses import dataclass

SCHEMA = "moment.capacities"
VERSION = 1

#: how a read test opened its file: O_DIRECT (past the page cache) or buffered
MODES = ("direct", "buffered")

#: the page cache a read test saw: ``cold`` (the file's pages dropped before every batch) or ``warm``
PAGE_CACHE = ("cold", "warm")

#: link classes a ``links:`` entry may name instead of ``src:``/``dst:``
LINK_CLASSES = ("host-to-device", "device-to-host", "peer-to-peer", "inter-socket")

_TOP_KEYS = ("schema", "version", "host", "date", "tool", "notes", "devices", "links", "memory",
             "pcie_efficiency")
_MEASUREMENT_KEYS = ("read_bytes_per_s", "read_iops", "block_bytes", "queue_depth", "tool",
                     "mode", "page_cache", "file_bytes", "seconds", "jobs", "date", "host", "note")
_DEVICE_KEYS = (*_MEASUREMENT_KEYS, "model", "block_device", "path", "other_measurements")
_LINK_KEYS = ("src", "dst", "class", "device", "bytes_per_s", "transfer_bytes", "tool", "date",
              "host", "note")
_MEMORY_KEYS = ("bytes_per_s", "method", "convention", "array_bytes", "repeats", "threads",
                "date", "host", "note")
_EFFICIENCY_KEYS = ("value", "derived_from", "note")


@dataclass(frozen=True)
class ReadMeasurement:
    """One read test of a storage device.

    ``read_bytes_per_s`` is what the planner uses; ``read_iops`` is the
    number of reads of ``block_bytes`` each per second (random, aligned
    reads when a profile measured it). ``queue_depth`` is the number of
    reads in flight, ``tool`` what issued them (``fio-io_uring``,
    ``fio-libaio``, ``fio-psync``, ``moment-posix``, or anything a person
    wrote), ``mode`` ``"direct"`` (O_DIRECT) or ``"buffered"``,
    ``page_cache`` ``"cold"`` when the file's pages were dropped from the
    page cache before every batch (a buffered reader then reads the device,
    as an O_DIRECT one always does) or ``"warm"``,
    ``file_bytes`` the size of the file read, ``jobs`` how the tool
    spread the queue depth ("2 processes x 32 threads"), ``date`` an ISO
    8601 time.
    """

    read_bytes_per_s: float
    read_iops: float | None = None
    block_bytes: int | None = None
    queue_depth: int | None = None
    tool: str | None = None
    mode: str | None = None
    file_bytes: int | None = None
    seconds: float | None = None
    jobs: str | None = None
    date: str | None = None
    host: str | None = None
    note: str | None = None
    page_cache: str | None = None


@dataclass(frozen=True)
class DeviceCapacity:
    """What was measured of one storage device (or of every device of one model).

    ``key`` is a node id, a PCI bus address or a model name (see
    :func:`apply_capacities` for how it is matched); ``read`` is the figure
    used, ``others`` the other measurements kept for the record. ``line`` is
    the entry's line in the file it came from.
    """

    key: str
    read: ReadMeasurement
    model: str | None = None
    block_device: str | None = None
    path: str | None = None
    others: tuple[ReadMeasurement, ...] = ()
    line: int | None = None

    @property
    def read_bytes_per_s(self) -> float:
        return self.read.read_bytes_per_s

    @property
    def read_iops(self) -> float | None:
        return self.read.read_iops

    def measurements(self) -> tuple[ReadMeasurement, ...]:
        """The figure used, then the others."""
        return (self.read, *self.others)


@dataclass(frozen=True)
class LinkCapacity:
    """A measured link rate, in bytes/s per direction.

    Either ``src`` and ``dst`` (node ids or PCI bus addresses; for a
    ``peer-to-peer`` class the two GPUs) or ``link_class`` alone: a
    ``host-to-device`` / ``device-to-host`` figure for one GPU (``device``)
    or, without ``device``, for every GPU; an ``inter-socket`` figure for
    every socket-to-socket link. ``transfer_bytes`` is the size of each copy.
    """

    bytes_per_s: float
    src: str | None = None
    dst: str | None = None
    link_class: str | None = None
    device: str | None = None
    transfer_bytes: int | None = None
    tool: str | None = None
    date: str | None = None
    host: str | None = None
    note: str | None = None
    line: int | None = None

    @property
    def label(self) -> str:
        if self.link_class is None:
            return f"{self.src} → {self.dst}"
        if self.src is not None:
            return f"{self.link_class} {self.src} → {self.dst}"
        return f"{self.link_class} {self.device}" if self.device else f"{self.link_class} (all)"


@dataclass(frozen=True)
class MemoryCapacity:
    """DRAM bandwidth of one NUMA node (``numa_node=None``: every node without its own entry).

    ``bytes_per_s`` follows ``convention``: ``"stream-copy"`` (the STREAM
    benchmark's, which counts the bytes read plus the bytes written of a
    copy) unless the file says otherwise. ``method`` names how it was
    measured (``numpy-copy``), ``threads`` how many threads copied.
    """

    numa_node: int | None
    bytes_per_s: float
    method: str | None = None
    convention: str | None = None
    array_bytes: int | None = None
    repeats: int | None = None
    threads: int | None = None
    date: str | None = None
    host: str | None = None
    note: str | None = None
    line: int | None = None


@dataclass(frozen=True)
class PcieEfficiency:
    """Measured share of a PCIe link's encoded rate that carries payload (0 < value ≤ 1)."""

    value: float
    derived_from: str | None = None
    note: str | None = None
    line: int | None = None


@dataclass(frozen=True)
class Capacities:
    """A whole capacities file. ``notes`` says what was not measured and why."""

    devices: tuple[DeviceCapacity, ...] = ()
    links: tuple[LinkCapacity, ...] = ()
    memory: tuple[MemoryCapacity, ...] = ()
    pcie_efficiency: PcieEfficiency | None = None
    host: str | None = None
    date: str | None = None
    tool: str | None = None
    notes: tuple[str, ...] = ()
    source: str | None = None

    def device(self, key: str) -> DeviceCapacity | None:
        """The entry whose key is exactly ``key``."""
        return next((d for d in self.devices if d.key == key), None)

