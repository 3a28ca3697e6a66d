"""NVLink figures: the per-link bandwidth of each NVLink generation, and an NVLink link between two GPUs.

Shared by the sources that report NVLinks by count (``nvidia-smi topo -m``'s
``NV#`` cells, NVML), which know the GPU model or NVLink version at best.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from planner.topology.model import Link, LinkKind

__all__ = ["DEFAULT_NVLINK_BYTES_PER_S", "NVLINK_GENERATIONS", "NvLinkRate", "nvlink_link", "nvlink_rate"]


@dataclass(frozen=True)
class NvLinkRate:
    """Per-direction bandwidth of one NVLink, in bytes/s, and how it was chosen.

    ``basis`` is ``"generation"`` (a known NVLink version), ``"gpu-name"``
    (the GPU model implies it) or ``"default"`` (nothing known).
    ``max_links`` is how many NVLinks one GPU of that generation has.
    """

    per_link_bytes_per_s: float
    generation: int | None
    max_links: int
    basis: str


#: NVLink generation → (bytes/s per link per direction, links per GPU):
#: P100 4 × 20 GB/s; V100 6 × 25; A100 12 × 25; H100 18 × 25; B200 18 × 50.
NVLINK_GENERATIONS = {1: (20e9, 4), 2: (25e9, 6), 3: (25e9, 12), 4: (25e9, 18), 5: (50e9, 18)}

#: used when neither the generation nor the GPU model is known: V100, A100
#: and H100 all move 25 GB/s per link per direction
DEFAULT_NVLINK_BYTES_PER_S = 25e9
_MAX_NVLINKS = 18  # no GPU has more (NVML_NVLINK_MAX_LINKS)

_NVLINK_BY_NAME = (
    (re.compile(r"\bP100\b", re.I), 1, None),
    (re.compile(r"\bV100", re.I), 2, None),
    # GA102 boards bridge 4 links at 14.06 GB/s per direction (112.5 GB/s both ways in total)
    (re.compile(r"RTX A6000|\bA40\b|RTX 3090|\bGA102", re.I), 3, 14.0625e9),
    (re.compile(r"\bA100\b|\bA800\b|\bA30\b|\bGA100\b", re.I), 3, None),
    (re.compile(r"\bH100\b|\bH200\b|\bH800\b|\bH20\b|\bGH100\b|\bGH200\b", re.I), 4, None),
    (re.compile(r"\bB100\b|\bB200\b|\bGB200\b|\bB300\b|\bGB300\b", re.I), 5, None),
)


def nvlink_rate(gpu_name: str | None = None, generation: int | None = None) -> NvLinkRate:
    """The bandwidth of one NVLink, from its generation or the GPU's model name.

    >>> nvlink_rate(generation=5).per_link_bytes_per_s / 1e9
    50.0
    >>> r = nvlink_rate("NVIDIA A100-SXM4-40GB")
    >>> r.generation, r.per_link_bytes_per_s / 1e9, r.basis
    (3, 25.0, 'gpu-name')
    >>> nvlink_rate().basis
    'default'
    """
    for pattern, gen, bw in _NVLINK_BY_NAME:
        # the model decides unless it contradicts a known generation (GA102 bridges are NVLink 3
        # at a lower rate than A100's, which the generation alone would not tell)
        if gpu_name and pattern.search(gpu_name) and generation in (None, gen):
            base_bw, links = NVLINK_GENERATIONS[gen]
            return NvLinkRate(bw or base_bw, gen, links if bw is None else 4, "gpu-name")
    if generation in NVLINK_GENERATIONS:
        bw, links = NVLINK_GENERATIONS[generation]
        return NvLinkRate(bw, generation, links, "generation")
    return NvLinkRate(DEFAULT_NVLINK_BYTES_PER_S, None, _MAX_NVLINKS, "default")


def nvlink_link(a: str, b: str, count: int, rate: NvLinkRate, bandwidth_source: str, **attrs) -> Link:
    """An NVLink :class:`Link` of ``count`` bonded links at ``rate``."""
    return Link(a, b, LinkKind.NVLINK, count * rate.per_link_bytes_per_s,
                bandwidth_source=bandwidth_source,
                attrs={"nvlink_count": count, "per_link_bytes_per_s": rate.per_link_bytes_per_s,
                       "nvlink_generation": rate.generation, "rate_basis": rate.basis, **attrs})


# -- topology from the matrix alone ----------------------------------------------
