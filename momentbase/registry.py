"""A name → implementation table for each place an algorithm plugs in, loaded lazily.

Every extension point of Moment (flow models, read backends, placement
policies, hotness methods, batch sources, capture sources) keeps one
:class:`Registry` in the package that owns its interface. The command line
takes its ``choices=`` from :meth:`Registry.names` and the library resolves a
name with :meth:`Registry.get`, so a name is spelled in one place.

As in fsspec's ``known_implementations`` (``fsspec/registry.py``), an entry
may be given as a ``"module:attr"`` string and is imported only when first
asked for: listing the names (``moment --help``) imports nothing heavy.
Each entry may carry capability metadata (``caps``: what the caller may rely
on without naming the implementation, e.g. a read backend's
``device_reads``), read with :meth:`Registry.caps` without importing it.

>>> from momentbase.errors import MomentError
>>> class ShapeError(MomentError): pass
>>> shapes = Registry("shape", ShapeError)
>>> shapes.register("circle", "math:pi", round=True)
>>> @shapes.register("square")
... def square(side): return side * side
>>> shapes.names(), shapes.get("circle") > 3, shapes.get("square")(3), shapes.caps("circle")["round"]
(('circle', 'square'), True, 9, True)
>>> with shapes.registered("toy", len):
...     shapes.get("toy")("abc")
3
>>> shapes.get("toy")
Traceback (most recent call last):
    ...
momentbase.registry.ShapeError: unknown shape 'toy' (known: circle, square)
"""

from __future__ import annotations

import importlib
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, TypeVar, overload

from momentbase.errors import MomentError

__all__ = ["Entry", "Registry", "RegistryError", "resolve"]

T = TypeVar("T")

#: a capability flag's value (``device_reads=True``, ``options=("seed",)``): each registry declares its own
Cap = Any  # Any: the flags' types differ per registry and are read by the code that declared them

#: a lazily imported entry: ``package.module:attr`` (dotted on both sides of the colon)
_TARGET = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


class RegistryError(MomentError, LookupError):
    """An unknown or unloadable name in a registry that was given no error class of its own."""


def resolve(target: str) -> Any:  # Any: whatever the dotted path names (a class, a function)
    """The object a ``"package.module:attr"`` (or ``"package.module:Class.attr"``) string names.

    Raises
    ------
    ValueError
        ``target`` is not ``package.module:attr``.
    """
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{target!r}: expected 'package.module:attr'")
    obj: Any = importlib.import_module(module)  # Any: each attribute step may yield any object
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered implementation: its name, the object or where to import it from, its capabilities."""

    name: str
    target: T | str
    caps: Mapping[str, Cap] = field(default_factory=lambda: MappingProxyType({}))


class Registry(Generic[T]):
    """An ordered table of named implementations of one interface (``kind``, e.g. ``"flow model"``).

    ``error``: the exception class raised for an unknown name or an entry
    that cannot be imported (the owning package's error, so the command line
    prints it as one line). Names keep the order they were registered in.
    Thread-safe: resolving an entry imports it once.
    """

    def __init__(self, kind: str, error: type[Exception] = RegistryError) -> None:
        self.kind = kind
        self.error = error
        self._entries: dict[str, Entry[T]] = {}
        self._loaded: dict[str, T] = {}
        self._lock = threading.Lock()

    @overload
    def register(self, name: str, target: None = None, *, replace: bool = False,
                 **caps: Cap) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, target: T | str, *, replace: bool = False, **caps: Cap) -> None: ...

    def register(self, name: str, target: T | str | None = None, *, replace: bool = False,
                 **caps: Cap) -> Callable[[T], T] | None:
        """Add ``target`` (an object or a ``"module:attr"`` string) under ``name``, with capabilities ``caps``.

        Without ``target``, returns a decorator that registers what it
        decorates and returns it unchanged. A name already taken is refused
        unless ``replace=True``.

        Raises
        ------
        ValueError
            ``name`` is empty, ``target`` is a malformed string, or ``name`` is taken.
        """
        if target is None:
            def decorate(obj: T) -> T:
                self.register(name, obj, replace=replace, **caps)
                return obj
            return decorate
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} needs a non-empty name, got {name!r}")
        if isinstance(target, str) and not _TARGET.fullmatch(target):
            raise ValueError(f"{self.kind} {name!r}: {target!r} is not 'package.module:attr'")
        with self._lock:
            if name in self._entries and not replace:
                raise ValueError(f"{self.kind} {name!r} is registered already (pass replace=True to replace it)")
            self._entries[name] = Entry(name, target, MappingProxyType(dict(caps)))
            self._loaded.pop(name, None)
        return None

    def unregister(self, name: str) -> None:
        """Remove ``name`` (unknown: the registry's one-line error)."""
        self.check(name)
        with self._lock:
            del self._entries[name]
            self._loaded.pop(name, None)

    @contextmanager
    def registered(self, name: str, target: T | str, **caps: Cap) -> Iterator[None]:
        """Register ``name`` for the duration of a ``with`` block (tests, one-off experiments)."""
        self.register(name, target, **caps)
        try:
            yield
        finally:
            self.unregister(name)

    def names(self) -> tuple[str, ...]:
        """The registered names, in the order they were registered (what ``choices=`` lists)."""
        return tuple(self._entries)

    def check(self, name: str) -> str:
        """``name`` itself if registered, else the one-line error listing the known names. Imports nothing.

        Raises
        ------
        RegistryError
            ``name`` is not registered (the registry's own error class, when it was given one).
        """
        if name not in self._entries:
            raise self.error(f"unknown {self.kind} {name!r} (known: {', '.join(self._entries) or 'none'})")
        return name

    def entry(self, name: str) -> Entry[T]:
        """The entry of ``name`` as registered (its target not imported)."""
        return self._entries[self.check(name)]

    def caps(self, name: str) -> Mapping[str, Cap]:
        """The capabilities ``name`` was registered with (read-only; imports nothing)."""
        return self.entry(name).caps

    def get(self, name: str) -> T:
        """The implementation called ``name``, imported on first use.

        Raises
        ------
        RegistryError
            ``name`` is not registered, or its target cannot be imported (the registry's own error
            class, when it was given one).
        """
        target = self.entry(name).target
        if not isinstance(target, str):
            return target
        with self._lock:
            if name not in self._loaded:
                try:
                    self._loaded[name] = resolve(target)
                except (ImportError, AttributeError) as exc:
                    raise self.error(f"{self.kind} {name!r} cannot be loaded from {target} ({exc})") from exc
            return self._loaded[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"
