"""The words the planner's settings take, in a module that imports nothing.

Each tuple is the one table its setting is checked against, by the code that
implements it (which imports it from here), and what ``moment`` offers for it: the
command line builds its parser from these without importing networkx
(tests/test_startup.py).
"""

from __future__ import annotations

__all__ = ["HANDOFF_LAYOUTS"]

#: the layouts a plan's hand-off can be made for: the recommended one, the machine's current
#: one, or one of the paper's layouts a-d (:mod:`planner.handoff`)
HANDOFF_LAYOUTS = ("recommended", "current", "a", "b", "c", "d")
