"""PCIe link bandwidth from generation and width.

Per direction, a link of ``lanes`` lanes at generation ``gen`` moves

    lanes × GT/s × encoding / 8 × protocol_efficiency   bytes/s

with the line encoding 8b/10b for Gen1–2, 128b/130b for Gen3–5 and the
242B/256B FLIT of Gen6. The protocol efficiency (TLP headers, DLLPs, flow
control) defaults to 0.8, a typical figure for 256-byte payloads; measured
values replace the whole product when a profile is available.

>>> round(pcie_bytes_per_s(3, 16, efficiency=1.0) / 1e9, 2)
15.75
>>> round(pcie_bytes_per_s(4, 16) / 1e9, 2)
25.21
"""

from __future__ import annotations

from planner.errors import TopologyError

#: transfer rate in GT/s per lane for each generation
GT_PER_S = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0, 7: 128.0}

#: payload bits per line bit, per generation
ENCODING = {1: 8 / 10, 2: 8 / 10, 3: 128 / 130, 4: 128 / 130, 5: 128 / 130, 6: 242 / 256, 7: 242 / 256}

#: default share of the encoded rate left for payload after protocol overhead
DEFAULT_EFFICIENCY = 0.8

VALID_WIDTHS = (1, 2, 4, 8, 12, 16, 32)


def gen_from_gts(gt_per_s: float) -> int:
    """The PCIe generation whose lane rate is ``gt_per_s`` GT/s.

    >>> gen_from_gts(16.0)
    4
    """
    for gen, rate in GT_PER_S.items():
        if abs(rate - gt_per_s) < 1e-6:
            return gen
    raise TopologyError(f"{gt_per_s} GT/s is not a PCIe lane rate (known: {sorted(GT_PER_S.values())})")


def pcie_bytes_per_s(gen: int, lanes: int, efficiency: float = DEFAULT_EFFICIENCY) -> float:
    """Payload bandwidth of one direction of a PCIe link, in bytes/s."""
    if gen not in GT_PER_S:
        raise TopologyError(f"PCIe generation {gen} is unknown (known: 1..{max(GT_PER_S)})")
    if lanes <= 0:
        raise TopologyError(f"a PCIe link needs at least one lane, got {lanes}")
    if not 0.0 < efficiency <= 1.0:
        raise TopologyError(f"protocol efficiency must be in (0, 1], got {efficiency}")
    return lanes * GT_PER_S[gen] * 1e9 * ENCODING[gen] / 8.0 * efficiency


def format_link(gen: int | None, lanes: int | None) -> str:
    """Human form of a link: ``"Gen4 x16"``; unknown parts shown as ``?``."""
    g = f"Gen{gen}" if gen else "Gen?"
    w = f"x{lanes}" if lanes else "x?"
    return f"{g} {w}"
