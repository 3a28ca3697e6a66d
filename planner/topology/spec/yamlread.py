"""YAML with line numbers: the reader that machine specs and capacities files share.

Every error names the file and line, and quantities (bandwidths, sizes) are
read the same way everywhere ('6 GiB/s', '20 GB/s', '100 Gb/s', '80 GB').
"""

from __future__ import annotations

import difflib
import functools
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NoReturn

import yaml
from yaml.nodes import MappingNode, ScalarNode, SequenceNode
from yaml.nodes import Node as YamlNode

from planner.errors import ParseError
from planner.topology.spec.schema import _ID, SCHEMA

_NUMBER = r"([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?)"
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
           "ki": 2.0**10, "mi": 2.0**20, "gi": 2.0**30, "ti": 2.0**40}
_BANDWIDTH = re.compile(rf"^\s*{_NUMBER}\s*([kKmMgGtT]i?)?(B/s|b/s|bps)\s*$")
_SIZE = re.compile(rf"^\s*{_NUMBER}\s*([kKmMgGtT]i?)?B\s*$")
_MERGE_TAG = "tag:yaml.org,2002:merge"
_NULL_TAG = "tag:yaml.org,2002:null"


# ---------------------------------------------------------------------------
# YAML with line numbers


@functools.lru_cache(maxsize=16)
def _composed(text: str) -> tuple[yaml.SafeLoader, YamlNode | None]:
    """PyYAML's node tree of ``text`` and the loader that made it (it constructs the scalars).

    Cached because one command reads a spec more than once (its topology, then its
    inventory) and pure-Python composing is most of the read; the tree is only read.
    """
    loader = yaml.SafeLoader(text)
    return loader, loader.get_single_node()


@dataclass(frozen=True)
class _Fig:
    """A figure read from the spec, with its provenance and line."""

    value: Any
    inferred: bool = False
    note: str | None = None
    line: int | None = None


def _describe(node: YamlNode) -> str:
    if isinstance(node, ScalarNode):
        return "null" if node.tag == _NULL_TAG else str(node.value)
    if isinstance(node, MappingNode):
        return "a mapping"
    return "a list"


class _Reader:
    """Walks PyYAML's composed node tree, which keeps each node's line."""

    def __init__(self, text: str, source: str) -> None:
        self.yaml_text = text
        self.source = source
        self._merging: set[int] = set()
        self.loader: yaml.SafeLoader | None = None

    # -- whole document ---------------------------------------------------
    #: what the document is and the schema it starts with, for messages (subclasses reading
    #: other YAML formats of the project set their own)
    document = "a machine spec"
    schema = SCHEMA

    def compose(self) -> YamlNode:
        if not isinstance(self.yaml_text, str):
            raise ParseError(self.source, None, f"the text of {self.document} (a str)",
                             type(self.yaml_text).__name__)
        try:
            self.loader, root = _composed(self.yaml_text)
        except yaml.YAMLError as exc:
            raise self._yaml_error(exc) from None
        except RecursionError:
            raise ParseError(self.source, None, "YAML nested at most a few hundred levels deep",
                             "deeper nesting") from None
        if root is None:
            raise ParseError(self.source, None,
                             f"{self.document} (a YAML mapping starting 'schema: {self.schema}')",
                             "an empty file")
        return root

    def _yaml_error(self, exc: yaml.YAMLError) -> ParseError:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        if mark is not None:
            line: int | None = mark.line + 1
        elif isinstance(exc, yaml.reader.ReaderError):
            line = self.yaml_text.count("\n", 0, max(exc.position, 0)) + 1
        else:
            line = None
        problem = (getattr(exc, "problem", None) or getattr(exc, "reason", None)
                   or str(exc).splitlines()[0])
        return ParseError(self.source, line, f"valid YAML ({problem})")

    # -- errors -----------------------------------------------------------
    @staticmethod
    def line(node: YamlNode) -> int:
        return node.start_mark.line + 1

    def fail(self, node: YamlNode | int | None, expected: str, found: str | None = None) -> NoReturn:
        line = node if isinstance(node, int) or node is None else self.line(node)
        raise ParseError(self.source, line, expected, found)

    # -- shapes -----------------------------------------------------------
    def mapping(self, node: YamlNode, what: str) -> dict[str, tuple[ScalarNode, YamlNode]]:
        """Keys of a mapping node with (key node, value node); merges (``<<``) applied."""
        if not isinstance(node, MappingNode):
            self.fail(node, what, _describe(node))
        if id(node) in self._merging:
            self.fail(node, f"{what} that does not merge itself", "a recursive merge")
        explicit: dict[str, tuple[ScalarNode, YamlNode]] = {}
        merged: dict[str, tuple[ScalarNode, YamlNode]] = {}
        self._merging.add(id(node))
        try:
            for key, value in node.value:
                if isinstance(key, ScalarNode) and key.tag == _MERGE_TAG:
                    parts = value.value if isinstance(value, SequenceNode) else [value]
                    for part in parts:
                        for k, kv in self.mapping(part, f"a mapping to merge into {what}").items():
                            merged.setdefault(k, kv)
                    continue
                if not isinstance(key, ScalarNode) or key.tag == _NULL_TAG:
                    self.fail(key, f"a key name in {what}", _describe(key))
                name = str(key.value)
                if name in explicit:
                    self.fail(key, f"each key once in {what} ('{name}' is also on line "
                                   f"{self.line(explicit[name][0])})", name)
                explicit[name] = (key, value)
        finally:
            self._merging.discard(id(node))
        return {**merged, **explicit}

    def keys(self, m: dict[str, tuple[ScalarNode, YamlNode]], allowed: Iterable[str],
             what: str) -> None:
        allowed = list(allowed)
        for name, (key, _) in m.items():
            if name not in allowed:
                close = difflib.get_close_matches(name, allowed, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                self.fail(key, f"one of the keys of {what}: {', '.join(allowed)}{hint}", name)

    def require(self, m: dict[str, tuple[ScalarNode, YamlNode]], name: str, node: YamlNode,
                what: str) -> YamlNode:
        if name not in m:
            self.fail(node, f"a '{name}:' key in {what}")
        return m[name][1]

    def sequence(self, node: YamlNode, what: str) -> list[YamlNode]:
        if not isinstance(node, SequenceNode):
            self.fail(node, what, _describe(node))
        return list(node.value)

    @staticmethod
    def is_null(node: YamlNode) -> bool:
        return isinstance(node, ScalarNode) and node.tag == _NULL_TAG

    # -- scalars ----------------------------------------------------------
    def scalar(self, node: YamlNode, what: str) -> Any:
        if not isinstance(node, ScalarNode):
            self.fail(node, what, _describe(node))
        assert self.loader is not None
        try:
            return self.loader.construct_object(node, deep=True)
        except Exception:  # PyYAML's constructors raise assorted errors on odd tags and values
            self.fail(node, what, node.value)

    def integer(self, node: YamlNode, what: str, lo: int, hi: int) -> int:
        v = self.scalar(node, what)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            self.fail(node, what, _describe(node))
        return v

    def number(self, node: YamlNode, what: str, positive: bool = True, hi: float = math.inf) -> float:
        v = self.scalar(node, what)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or (positive and v <= 0) or v > hi:
            self.fail(node, what, _describe(node))
        return float(v)

    def boolean(self, node: YamlNode, what: str) -> bool:
        v = self.scalar(node, what)
        if not isinstance(v, bool):
            self.fail(node, what, _describe(node))
        return v

    def text(self, node: YamlNode, what: str) -> str:
        """A string; numbers are taken as written (``designation: 1`` is ``"1"``)."""
        v = self.scalar(node, what)
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            self.fail(node, what, _describe(node))
        s = str(node.value).strip()
        if not s:
            self.fail(node, what, "an empty string")
        return s

    def ident(self, node: YamlNode, what: str) -> str:
        s = self.text(node, what)
        if not _ID.match(s.replace("{i}", "0").replace("{n}", "1")):
            self.fail(node, f"{what} (letters, digits, '_', '.', '-', '/')", s)
        return s

    def choice(self, node: YamlNode, what: str, options: Iterable[str]) -> str:
        options = list(options)
        s = self.text(node, f"{what}: one of {', '.join(options)}").lower()
        if s not in options:
            self.fail(node, f"{what}: one of {', '.join(options)}", str(node.value))
        return s

    def quantity(self, node: YamlNode, what: str, pattern: re.Pattern[str], bits: bool) -> float:
        """A bandwidth (``6 GiB/s``, ``100 Gb/s``) or size (``3.84 TB``); a bare number is bytes."""
        v = self.scalar(node, what)
        if isinstance(v, bool) or v is None:
            self.fail(node, what, _describe(node))
        if isinstance(v, (int, float)):
            amount = float(v)
        else:
            m = pattern.match(str(v))
            if not m:
                self.fail(node, what, str(node.value))
            try:
                amount = float(m.group(1)) * _PREFIX[(m.group(2) or "").lower()]
            except (ValueError, OverflowError):
                self.fail(node, what, str(node.value))
            if bits and m.group(3) in ("b/s", "bps"):
                amount /= 8.0
        if not math.isfinite(amount) or amount <= 0:
            self.fail(node, what, str(node.value))
        return amount

    def bandwidth(self, node: YamlNode, what: str) -> float:
        return self.quantity(node, f"{what} (bytes/s, like '6 GiB/s', '20 GB/s', '100 Gb/s')",
                             _BANDWIDTH, bits=True)

    def size(self, node: YamlNode, what: str) -> int | float:
        v = self.quantity(node, f"{what} (bytes, like '3.84 TB' or '40 GiB')", _SIZE, bits=False)
        return int(v) if v.is_integer() else v

    # -- figures with provenance -----------------------------------------
    def figure(self, node: YamlNode, what: str, convert: Callable[[YamlNode, str], Any]) -> _Fig:
        """A figure written plain or as ``{value: ..., inferred: ..., note: ...}``."""
        if isinstance(node, MappingNode):
            m = self.mapping(node, f"{what} written with its provenance")
            self.keys(m, ("value", "inferred", "note"), f"{what} written with its provenance")
            value = convert(self.require(m, "value", node, f"{what} written with its provenance"),
                            what)
            inferred = self.boolean(m["inferred"][1], "inferred: true or false") \
                if "inferred" in m else False
            note = self.text(m["note"][1], "a note (text)") if "note" in m else None
            return _Fig(value, inferred, note, self.line(m["value"][1]))
        return _Fig(convert(node, what), False, None, self.line(node))
