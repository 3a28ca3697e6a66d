"""Machine-readable figures of a benchmark run, for ``tools/bench_all.py`` (not imported by the packages).

Every benchmark prints its own table for a reader and, with ``--json PATH``,
writes the same figures as rows: what was measured, ours, the reference
measured in the same run, the ratio and which way is better. ``bench_all``
collects them into one table.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Figure:
    """One comparison. ``ratio`` is ours/reference when ``higher_is_better`` else reference/ours,
    so a ratio above 1 always means ours is better; ``target`` is what the issue asks of the ratio
    (or of ``ours`` when there is no reference), free text."""

    bench: str
    figure: str
    unit: str
    ours: float
    reference: float | None
    reference_name: str
    higher_is_better: bool = True
    target: str = ""
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.reference is None or not self.ours or not self.reference:
            return None
        return self.ours / self.reference if self.higher_is_better else self.reference / self.ours


def _gpu() -> str | None:
    """The first CUDA device's name, or None (no GPU, or no torch)."""
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # a broken driver: no GPU figure then either
        return None


def machine() -> dict:
    """Where the figures came from (``gpu``: the CUDA device's name, None without one)."""
    return {"host": socket.gethostname(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "gpu": _gpu()}


def write(path: str | os.PathLike[str] | None, bench: str, figures: list[Figure], command: str,
          skipped: str | None = None) -> None:
    """Write ``figures`` to ``path`` (nothing when ``path`` is None), atomically; ``skipped``: why there are none."""
    if path is None:
        return
    data = {"bench": bench, "command": command, "machine": machine(),
            "figures": [asdict(f) | {"ratio": f.ratio} for f in figures]}
    if skipped:
        data["skipped"] = skipped
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, p)


def drop_from_page_cache(paths: list[Path]) -> None:
    """Evict these files' clean pages from the page cache (``posix_fadvise DONTNEED``): a cold start for them
    alone; the machine is shared, so no global ``drop_caches``."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
