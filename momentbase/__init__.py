"""momentbase: what every package of Moment shares, below all of them.

The bottom of the one-way import order ``momentbase → planner → iostack →
hwprofile / training → moment`` (``docs/architecture.md``): the root of the
project's user errors (:class:`MomentError`) and the byte-size units that
every layer reads and prints (:func:`parse_size`, :func:`format_size`).
Standard library only; it imports no other package of the project.

>>> from momentbase import MomentError, parse_size
>>> try:
...     parse_size("4 parsecs")
... except MomentError as exc:  # the one class a front end catches
...     print(type(exc).__name__)
SizeError
"""

from momentbase.errors import MomentError
from momentbase.units import SizeError, format_size, parse_size

#: the version of the whole project (one distribution, moment-gnn); ``moment --version`` prints it
__version__ = "0.1.0"

__all__ = ["__version__", "MomentError", "SizeError", "format_size", "parse_size"]
