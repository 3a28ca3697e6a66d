"""Byte sizes as people write them (``4KiB``, ``1.5GB``) and as Moment prints them.

Shared by every layer: capacities files and profiles (planner, hwprofile),
benchmarks (iostack) and command-line options (moment).
"""

from __future__ import annotations

import math
import re

from momentbase.errors import MomentError

__all__ = ["SizeError", "parse_size", "format_size"]

_SIZE_TEXT = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*$")
_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 2**10, "kib": 2**10, "kb": 10**3,
    "m": 2**20, "mib": 2**20, "mb": 10**6,
    "g": 2**30, "gib": 2**30, "gb": 10**9,
    "t": 2**40, "tib": 2**40, "tb": 10**12,
}


class SizeError(MomentError, ValueError):
    """Text that is not a size in bytes; the message quotes it and shows what a size looks like."""


def parse_size(text: str) -> int:
    """A size in bytes from ``"4KiB"``, ``"1 GiB"``, ``"1.5GB"``, ``"4k"`` or ``"4096"``.

    ``KiB``/``MiB``/``GiB``/``TiB`` and the single letters ``K``/``M``/``G``/``T``
    (as fio and dd read them) are powers of 1024; ``kB``/``MB``/``GB``/``TB``
    powers of 1000. The result must be a whole, positive number of bytes.
    Raises :class:`SizeError` (a :class:`~momentbase.errors.MomentError`) otherwise.

    >>> parse_size("4KiB"), parse_size("1 GiB"), parse_size("4k"), parse_size("1.5GB")
    (4096, 1073741824, 4096, 1500000000)
    >>> parse_size("4 parsecs")
    Traceback (most recent call last):
    ...
    momentbase.units.SizeError: '4 parsecs' is not a size: write a number of bytes with an optional unit, like 4096, 4KiB, 64MiB, 1GiB or 1GB
    """  # noqa: E501 (a doctest's or a capture's line, as printed)
    m = _SIZE_TEXT.match(str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _SIZE_UNITS:
        raise SizeError(f"{text!r} is not a size: write a number of bytes with an optional "
                        "unit, like 4096, 4KiB, 64MiB, 1GiB or 1GB")
    value = float(m.group(1)) * _SIZE_UNITS[unit]
    if not math.isfinite(value) or value <= 0 or value != int(value):
        raise SizeError(f"{text!r} is not a positive whole number of bytes")
    return int(value)


def format_size(n: float) -> str:
    """``n`` bytes in binary units, as short as exact allows.

    >>> format_size(4096), format_size(1 << 30), format_size(1536), format_size(1000)
    ('4 KiB', '1 GiB', '1.5 KiB', '1000 B')
    """
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            v = n / size
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.3g} {unit}"
    return f"{n:.0f} B"
