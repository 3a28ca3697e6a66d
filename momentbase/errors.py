"""The root of Moment's user-facing errors.

Each package derives its own base from :class:`MomentError`
(:class:`planner.errors.PlannerError`, :class:`iostack.errors.StoreError`,
:class:`training.errors.TrainingError`, :class:`moment.errors.CommandError`),
so a front end catches one class and turns any of them into a one-line
message, while a library user can still catch one package's errors alone.
Anything else escaping the library is a bug.

>>> from momentbase.units import SizeError
>>> issubclass(SizeError, MomentError)
True
"""

from __future__ import annotations


class MomentError(Exception):
    """Base class of every error a user can cause with bad input, in any package of Moment.

    The message is one line that names the input and says how to fix it.
    """
