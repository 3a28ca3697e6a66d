"""Errors raised by iostack: user-facing ones are :class:`StoreError`, a :class:`~momentbase.errors.MomentError`."""

from __future__ import annotations

from momentbase.errors import MomentError


class StoreError(MomentError):
    """A placement, a bin file or a backend that cannot serve the store.

    The message names the file (or field) and says how to fix it, e.g. a bin
    that is truncated, missing or does not match its manifest.
    """
