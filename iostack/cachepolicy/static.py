"""``static``: the warm start and nothing else; a miss is read through and not inserted."""

from __future__ import annotations

import numpy as np

from iostack.cachepolicy.base import EvictionPolicy


class StaticPolicy(EvictionPolicy):
    """Never evicts: only the warm fill (the placement's hot rows) is ever cached."""

    admits = False

    def _victims(self, k: int, limit: int) -> np.ndarray:
        return np.empty(0, np.int64)


__all__ = ["StaticPolicy"]
