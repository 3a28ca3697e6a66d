"""Errors raised by the planner.

Every error a user can cause with bad input to the planner is a
:class:`PlannerError`, which derives from the project's one root,
:class:`momentbase.errors.MomentError`; the command line turns any of them into
a one-line message and exit status 2. Anything else escaping the library is a
bug.
"""

from __future__ import annotations

from momentbase.errors import MomentError


class PlannerError(MomentError):
    """Base class of the planner's user-facing errors (a :class:`~momentbase.errors.MomentError`)."""


class ParseError(PlannerError):
    """Input text that a parser could not read.

    ``source`` names the input (a path, or a label such as ``"<stdin>"``),
    ``line`` is 1-based (``None`` when the problem is the input as a whole),
    ``expected`` says what the parser wanted to see.

    >>> str(ParseError("lspci.txt", 3, "a device line like '00:01.0 PCI bridge: ...'", "garbage"))
    "lspci.txt:3: expected a device line like '00:01.0 PCI bridge: ...', found 'garbage'"
    """

    def __init__(
        self,
        source: str,
        line: int | None,
        expected: str,
        found: str | None = None,
    ) -> None:
        self.source = source
        self.line = line
        self.expected = expected
        self.found = found
        where = f"{source}:{line}" if line is not None else source
        message = f"{where}: expected {expected}"
        if found is not None:
            shown = found if len(found) <= 80 else found[:77] + "..."
            message += f", found {shown!r}"
        super().__init__(message)


class TopologyError(PlannerError):
    """A topology that is inconsistent (unknown node, duplicate id, bad schema)."""


class ProfileError(PlannerError):
    """A measurement that could not be made (bad path, no space, a tool such as fio that failed).

    Raised by :mod:`planner.fio` and by the profiler, :mod:`hwprofile`.
    """
