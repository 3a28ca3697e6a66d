"""The ``moment`` console script and ``python -m moment``: Ctrl-C while the command line loads is one line.

The script a package installer writes imports its entry point before calling it, so an entry
point in :mod:`moment.cli` would take a Ctrl-C pressed while that module and its imports load
(the first tenth of a second) as a traceback. This module imports nothing of Moment's at load
time: the whole command line loads inside :func:`run`'s ``try``. What remains outside it is the
interpreter's own start and ``moment/__init__.py`` (one small import).
"""

from __future__ import annotations

import sys


def run() -> int:
    """Load the command line and run it on ``sys.argv``; the exit status (130 after Ctrl-C)."""
    try:
        from moment.cli import main
    except KeyboardInterrupt:
        print("moment: interrupted", file=sys.stderr)
        return 130
    return main()
