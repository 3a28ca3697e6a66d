"""Reading ``nvidia-smi topo -m``'s text into a :class:`TopoMatrix` (see :mod:`planner.topology.nvidia.smi`).

>>> m = parse_nvidia_smi_topo("  GPU0  GPU1  CPU Affinity\\nGPU0  X  NV2  0-7\\nGPU1  NV2  X  0-7\\n")
>>> m.nvlink_count("GPU0", "GPU1")
2
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from planner.errors import ParseError
from planner.topology.model import NodeKind

__all__ = ["RELATIONS", "TopoMatrix", "parse_cpu_list", "parse_nvidia_smi_topo"]


#: cell values besides ``NV#``; ``SOC`` is the pre-2017 spelling of ``SYS``
RELATIONS = ("X", "SYS", "SOC", "NODE", "PHB", "PXB", "PIX")

_NV = re.compile(r"^NV(\d{1,3})$")
_TRAILING_NAMES = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_HEADER_TOKEN = re.compile("|".join(re.escape(n) for n in _TRAILING_NAMES) + r"|\S+")
_DEVICE_NAME = re.compile(r"^[A-Za-z][\w.\-]*$")
_CPU_LIST = re.compile(r"^\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*$")
_LEGEND_LINE = re.compile(r"^\s*\S+\s*=\s*\S.*$")
_NIC_LEGEND_LINE = re.compile(r"^\s*(\S+)\s*:\s*(\S+)\s*$")
_GPU_NAME = re.compile(r"^GPU\d+$")
_NIC_NAME = re.compile(r"^(?:NIC\d+|mlx\d+_\d+|ib\w*|hfi\d+_\d+|bnxt_re\d+|efa_?\d+|irdma\d+)$")

_EXPECTED_HEADER = (
    "the header row of 'nvidia-smi topo -m': device names (GPU0, NIC0, ...) "
    "followed by 'CPU Affinity'"
)


@dataclass(frozen=True)
class TopoMatrix:
    """What ``nvidia-smi topo -m`` says, verbatim.

    ``devices`` are the header's names in order. ``relation[(a, b)]`` is the
    cell in row ``a``, column ``b`` (``"NV12"``, ``"PXB"``, ...) for every
    ordered pair of distinct devices. ``cpu_affinity`` and ``numa_affinity``
    hold the row's text (``"48-63,176-191"``, ``"3"``) or ``None`` when the
    row leaves it empty or says ``N/A``; ``gpu_numa_id`` is the NUMA node of
    a GPU's own memory (coherent GPUs only), usually ``None``. ``nic_names``
    maps ``NIC0`` to its RDMA device (``mlx5_0``) from the NIC legend.
    """

    devices: tuple[str, ...]
    relation: Mapping[tuple[str, str], str]
    cpu_affinity: Mapping[str, str | None] = field(default_factory=dict)
    numa_affinity: Mapping[str, str | None] = field(default_factory=dict)
    gpu_numa_id: Mapping[str, int | None] = field(default_factory=dict)
    nic_names: Mapping[str, str] = field(default_factory=dict)

    def kind(self, device: str) -> NodeKind:
        """``gpu`` for ``GPU#``, ``nic`` for ``NIC#`` and RDMA names, else ``other``."""
        if _GPU_NAME.match(device):
            return NodeKind.GPU
        if _NIC_NAME.match(device):
            return NodeKind.NIC
        return NodeKind.OTHER

    @property
    def gpus(self) -> tuple[str, ...]:
        """GPU names in nvidia-smi's order (``GPU0``, ``GPU1``, ...)."""
        return tuple(sorted((d for d in self.devices if self.kind(d) == NodeKind.GPU),
                            key=lambda d: int(d[3:])))

    def numa_node(self, device: str) -> int | None:
        """The one NUMA node in a device's NUMA affinity, ``None`` if none or several.

        >>> TopoMatrix(("GPU0",), {}, numa_affinity={"GPU0": "3"}).numa_node("GPU0")
        3
        """
        nodes = parse_cpu_list(self.numa_affinity.get(device) or "")
        return nodes[0] if len(nodes) == 1 else None

    def nvlink_count(self, a: str, b: str) -> int:
        """Number of NVLinks bonded between ``a`` and ``b`` (0 when the cell is not ``NV#``)."""
        m = _NV.match(self.relation.get((a, b), ""))
        return int(m.group(1)) if m else 0


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """The numbers of a Linux CPU/NUMA list such as ``"48-63,176-191"``.

    Empty, ``N/A`` and malformed lists give ``()``; the parser validates
    lists before they get here.

    >>> parse_cpu_list("0-2,8")
    (0, 1, 2, 8)
    """
    text = text.strip()
    if not _CPU_LIST.match(text):
        return ()
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        a, b = int(lo), int(hi or lo)
        if b < a or b - a > 1_000_000:
            return ()
        out.extend(range(a, b + 1))
    return tuple(out)


def parse_nvidia_smi_topo(text: str, source: str = "<nvidia-smi topo -m>") -> TopoMatrix:
    """Parse the output of ``nvidia-smi topo -m``.

    Tab-separated output and space-aligned copies are both read: cells never
    contain spaces, and the affinity values are taken in order after the
    relation cells (tab output puts an empty field before ``GPU NUMA ID``,
    and NIC rows leave the affinities empty). Raises :class:`ParseError`
    naming ``source`` and the line for anything else.

    >>> m = parse_nvidia_smi_topo("  GPU0  NIC0  CPU Affinity\\nGPU0  X  PIX  0-7\\nNIC0  PIX  X\\n")
    >>> m.devices, m.cpu_affinity["NIC0"]
    (('GPU0', 'NIC0'), None)
    """
    lines = text.split("\n")
    for no, line in enumerate(lines, 1):
        if "\x00" in line:
            raise ParseError(source, no, "the text output of 'nvidia-smi topo -m'", "binary data (NUL bytes)")
    lines = [ln.rstrip("\r") for ln in lines]

    i = 0
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i == len(lines):
        raise ParseError(source, 1, _EXPECTED_HEADER, "empty input")
    header_no = i + 1
    devices, trailing = _parse_header(lines[i], source, header_no)

    relation: dict[tuple[str, str], str] = {}
    cpu: dict[str, str | None] = {}
    numa: dict[str, str | None] = {}
    gpu_numa: dict[str, int | None] = {}
    row_line: dict[str, int] = {}
    i += 1
    while i < len(lines):
        line = lines[i]
        no = i + 1
        if not line.strip() or line.strip() in ("Legend:", "NIC Legend:"):
            break
        name = _parse_row(line, no, devices, trailing, source, relation, cpu, numa, gpu_numa, row_line)
        row_line[name] = no
        i += 1

    missing = [d for d in devices if d not in row_line]
    if missing:
        raise ParseError(source, i + 1 if i < len(lines) else len(lines),
                         f"a matrix row for {missing[0]} (every header device has a row)",
                         lines[i] if i < len(lines) else "end of input")
    for (a, b), cell in relation.items():
        if relation[(b, a)] != cell:
            later = a if row_line[a] > row_line[b] else b
            other = b if later == a else a
            raise ParseError(source, row_line[later],
                             f"{later}'s relation to {other} to mirror {other}'s ({relation[(other, later)]})",
                             relation[(later, other)])

    nic_names = _parse_legends(lines, i, devices, source)
    return TopoMatrix(tuple(devices), relation, cpu, numa, gpu_numa, nic_names)


def _parse_row(line: str, no: int, devices: list[str], trailing: list[str], source: str,
               relation: dict[tuple[str, str], str], cpu: dict[str, str | None],
               numa: dict[str, str | None], gpu_numa: dict[str, int | None],
               row_line: dict[str, int]) -> str:
    """One row of the matrix into the tables; returns its device."""
    n = len(devices)
    tokens = line.split()
    name = tokens[0]
    if name not in devices:
        raise ParseError(
            source, no, f"a matrix row starting with one of the header's devices ({', '.join(devices)})", line
        )
    if name in row_line:
        raise ParseError(source, no, f"one row per device, but {name} already has a row on line {row_line[name]}", line)
    if len(tokens) < n + 1:
        raise ParseError(source, no, f"{n} relation cells after {name}", line)
    for col, cell in zip(devices, tokens[1:n + 1], strict=True):
        if not (cell in RELATIONS or _NV.match(cell)):
            raise ParseError(source, no, f"a relation (X, SYS, SOC, NODE, PHB, PXB, PIX or NV#) in column {col}", cell)
        if (cell == "X") != (col == name):
            want = "X on the diagonal" if col == name else f"a relation other than X between {name} and {col}"
            raise ParseError(source, no, want, cell)
        if col != name:
            relation[(name, col)] = cell
    values = tokens[n + 1:]
    if len(values) > len(trailing):
        raise ParseError(
            source, no, f"at most {len(trailing)} value(s) ({', '.join(trailing)}) after the relation cells", line
        )
    row = dict(zip(trailing, values, strict=False))
    cpu[name] = _affinity(row.get("CPU Affinity"), "a CPU list like '0-23' or '48-63,176-191'", source, no)
    numa[name] = _affinity(row.get("NUMA Affinity"), "a NUMA node list like '3'", source, no)
    gid = row.get("GPU NUMA ID")
    if gid is None or gid == "N/A":
        gpu_numa[name] = None
    elif gid.isdigit():
        gpu_numa[name] = int(gid)
    else:
        raise ParseError(source, no, "a GPU NUMA ID (a number or N/A)", gid)
    return name


def _parse_header(line: str, source: str, no: int) -> tuple[list[str], list[str]]:
    tokens = _HEADER_TOKEN.findall(line)
    if "CPU Affinity" not in tokens:
        raise ParseError(source, no, _EXPECTED_HEADER, line)
    cut = tokens.index("CPU Affinity")
    devices, trailing = tokens[:cut], tokens[cut:]
    if not devices:
        raise ParseError(source, no, _EXPECTED_HEADER, line)
    for d in devices:
        if not _DEVICE_NAME.match(d) or d in RELATIONS or _NV.match(d) or d in _TRAILING_NAMES:
            raise ParseError(source, no, "device names such as GPU0 or NIC0 in the header", d)
    dup = [d for d, c in Counter(devices).items() if c > 1]
    if dup:
        raise ParseError(source, no, "each device once in the header", dup[0])
    if len(set(trailing)) != len(trailing):
        raise ParseError(source, no, "each affinity column once in the header", line)
    return devices, trailing


def _affinity(value: str | None, expected: str, source: str, no: int) -> str | None:
    if value is None or value == "N/A":
        return None
    if not parse_cpu_list(value):
        raise ParseError(source, no, expected, value)
    return value


def _parse_legends(lines: list[str], i: int, devices: list[str], source: str) -> dict[str, str]:
    nic_names: dict[str, str] = {}
    section = None  # None until "Legend:" or "NIC Legend:"
    for j in range(i, len(lines)):
        line, no = lines[j], j + 1
        s = line.strip()
        if not s:
            continue
        if s == "Legend:":
            section = "legend"
        elif s == "NIC Legend:":
            section = "nic"
        elif section == "legend" and _LEGEND_LINE.match(line):
            continue
        elif section == "nic" and (m := _NIC_LEGEND_LINE.match(line)):
            dev, rdma = m.group(1), m.group(2)
            if dev not in devices:
                raise ParseError(
                    source, no, f"a NIC legend entry for a device of the matrix ({', '.join(devices)})", line
                )
            if dev in nic_names:
                raise ParseError(source, no, f"one NIC legend entry per device, {dev} is listed twice", line)
            nic_names[dev] = rdma
        else:
            expected = {
                None: "a blank line, 'Legend:' or 'NIC Legend:' after the matrix",
                "legend": "a legend line like '  PIX  = Connection traversing ...'",
                "nic": "a NIC legend line like '  NIC0: mlx5_0'",
            }[section]
            raise ParseError(source, no, expected, line)
    return nic_names


# -- NVLink rates -----------------------------------------------------------
