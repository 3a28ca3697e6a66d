"""The command line's own user errors: :class:`CommandError`, a :class:`~momentbase.errors.MomentError`.

:func:`moment.cli.main` catches the root, :class:`~momentbase.errors.MomentError`,
so an error from any package becomes one line and exit status 2.
"""

from __future__ import annotations

from momentbase.errors import MomentError


class CommandError(MomentError):
    """An option or argument that the command cannot use; the message names it and the fix."""
