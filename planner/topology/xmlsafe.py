"""Read a local XML file into an ElementTree, keeping each element's line.

The hardware XML formats the planner reads (hwloc's ``lstopo --of xml``,
NCCL's topology dump) are plain element trees. :func:`parse_xml` turns the
text into :mod:`xml.etree.ElementTree` elements and remembers the 1-based
line each element starts on, so that a parser can say *where* a value is
wrong. Every problem comes out as :class:`~planner.errors.ParseError`.

Entity declarations are refused outright (``<!ENTITY``, or any DOCTYPE with
an internal subset), which rules out entity-expansion attacks without
needing ``defusedxml``. A DOCTYPE that only names an external DTD, as hwloc
writes (``<!DOCTYPE topology SYSTEM "hwloc2.dtd">``), is accepted and the DTD
is never fetched.

>>> doc = parse_xml('<a>\\n  <b x="1"/>\\n</a>', "t.xml")
>>> b = doc.root.find("b")
>>> b.get("x"), doc.line(b)
('1', 2)
>>> parse_xml("<a><b></a>", "t.xml")
Traceback (most recent call last):
...
planner.errors.ParseError: t.xml:1: expected well-formed XML (mismatched tag), found '<a><b></a>'
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from xml.parsers import expat

from planner.errors import ParseError


@dataclass(frozen=True)
class XmlDocument:
    """An element tree plus the line each element starts on."""

    root: ET.Element
    lines: dict[int, int] = field(default_factory=dict)  # id(element) -> 1-based line
    text_lines: tuple[str, ...] = ()

    def line(self, element: ET.Element) -> int | None:
        """The 1-based line ``element``'s start tag is on (``None`` if unknown)."""
        return self.lines.get(id(element))

    def line_text(self, line: int | None) -> str | None:
        """The text of a 1-based line, stripped, for error messages."""
        if line is None or not 1 <= line <= len(self.text_lines):
            return None
        return self.text_lines[line - 1].strip()


def parse_xml(text: str, source: str) -> XmlDocument:
    """Parse ``text`` (the content of ``source``) into an :class:`XmlDocument`.

    Raises :class:`ParseError` for anything that is not a single well-formed
    XML document: empty or binary input, entity declarations, syntax errors.
    """
    if not isinstance(text, str):
        raise ParseError(source, None, "XML text", type(text).__name__)
    lines = text.splitlines()
    nul = text.find("\x00")
    if nul >= 0:
        line = text.count("\n", 0, nul) + 1
        raise ParseError(source, line, "text (this looks like a binary file)", "NUL byte")
    if not text.strip():
        raise ParseError(source, 1, "an XML document", "empty input")
    for marker in ("<!ENTITY", "<!entity"):
        at = text.find(marker)
        if at >= 0:
            line = text.count("\n", 0, at) + 1
            raise ParseError(source, line, "XML without entity declarations", marker)

    # The explicit encoding overrides any declaration in the text: the text is
    # already decoded, pyexpat hands it over as UTF-8.
    parser = expat.ParserCreate(encoding="utf-8")
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    line_of: dict[int, int] = {}
    stack: list[ET.Element] = []
    roots: list[ET.Element] = []

    def start(tag: str, attrs: dict[str, str]) -> None:
        elem = ET.Element(tag, attrs)
        line_of[id(elem)] = parser.CurrentLineNumber
        if stack:
            stack[-1].append(elem)
        else:
            roots.append(elem)
        stack.append(elem)

    def end(tag: str) -> None:
        stack.pop()

    def chars(data: str) -> None:
        if stack:
            elem = stack[-1]
            if len(elem):
                last = elem[-1]
                last.tail = (last.tail or "") + data
            else:
                elem.text = (elem.text or "") + data

    def doctype(name: str, sysid: str | None, pubid: str | None, has_internal_subset: int) -> None:
        if has_internal_subset:
            raise ParseError(source, parser.CurrentLineNumber,
                             "a DOCTYPE without an internal subset", f"<!DOCTYPE {name} [...]>")

    def entity_decl(*args: object) -> None:
        raise ParseError(source, parser.CurrentLineNumber, "XML without entity declarations",
                         "<!ENTITY")

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = chars
    parser.StartDoctypeDeclHandler = doctype
    parser.EntityDeclHandler = entity_decl
    try:
        parser.Parse(text, True)
    except expat.ExpatError as exc:
        line = exc.lineno or 1
        found = lines[line - 1].strip() if 1 <= line <= len(lines) else None
        raise ParseError(source, line, f"well-formed XML ({expat.ErrorString(exc.code)})",
                         found) from None
    except UnicodeError as exc:
        raise ParseError(source, None, "text that is valid Unicode", str(exc)) from None
    if len(roots) != 1:  # expat already refuses this; kept for clarity
        raise ParseError(source, 1, "one XML root element")
    return XmlDocument(roots[0], line_of, tuple(lines))


def build_from_xml(text: str, source: str, build, what: str):
    """Parse ``text`` safely and hand the document to ``build(doc, source)``.

    A :class:`~planner.errors.TopologyError` from ``build`` (the document
    contradicts itself) becomes a :class:`ParseError` saying ``what`` was
    expected, and so does a tree too deep to walk.
    """
    from planner.errors import TopologyError

    doc = parse_xml(text, source)
    try:
        return build(doc, source)
    except TopologyError as exc:
        raise ParseError(source, None, what, str(exc)) from None
    except RecursionError:
        raise ParseError(source, None, "an XML tree of reasonable depth") from None
