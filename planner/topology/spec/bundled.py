"""The machine specs shipped with the planner, found without loading the topology model.

Kept apart from :mod:`planner.topology.spec.load` so that ``moment machines`` lists them
without importing networkx, numpy or the YAML reader (start-up time).
"""

from __future__ import annotations

from pathlib import Path

#: where the bundled ``<name>.yaml`` specs live
MACHINES_DIR = Path(__file__).resolve().parents[2] / "machines"


def bundled_machines() -> dict[str, Path]:
    """The specs shipped with the planner, by name (the file name without ``.yaml``).

    >>> sorted(bundled_machines())[:2]
    ['moment-a', 'moment-b']
    """
    if not MACHINES_DIR.is_dir():
        return {}
    return {p.stem: p for p in sorted(MACHINES_DIR.glob("*.yaml"))}
