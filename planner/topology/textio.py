"""Reading captured command outputs as text, and telling what command made them.

Parsers take ``str``; :func:`read_text` is how a file becomes one. It refuses
what is not text (binary data, undecodable bytes, a directory, a missing
file) with a :class:`~planner.errors.ParseError` naming the file, so that a
wrong path gives a one-line message rather than a traceback.

:func:`guess_format` names the command that most likely printed a text, so
that a parser fed the wrong capture can say so ("this looks like the output
of dmidecode, not lspci").

>>> guess_format("# dmidecode 3.3\\nHandle 0x0000, DMI type 0, 26 bytes\\n")
'the output of dmidecode'
>>> guess_format('{"a": 1}')
'a JSON document'
>>> guess_format("hello") is None
True
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from planner.errors import ParseError

__all__ = ["read_text", "text_lines", "guess_format"]

#: control bytes that never appear in command output (TAB, LF, VT, FF, CR
#: and ESC, for colour codes, are allowed)
_CONTROL = re.compile(rb"[\x01-\x08\x0e-\x1a\x1c-\x1f\x7f]")


def read_text(path: str | os.PathLike[str]) -> str:
    """The contents of the text file ``path``.

    UTF-8 (with or without a byte-order mark) is tried first; a file with a
    UTF-16 byte-order mark is decoded as UTF-16 (Windows consoles save
    redirected output that way); text that is not UTF-8 but has no control
    bytes is read as Latin-1, as older tools print names in it. Anything
    else raises :class:`ParseError` with ``expected="a text file"``.

    >>> import tempfile, os
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = os.path.join(d, "x.txt")
    ...     _ = open(p, "wb").write(b"00:00.0 Host bridge\\n")
    ...     read_text(p)
    '00:00.0 Host bridge\\n'
    >>> read_text("/nonexistent/lspci.txt")
    Traceback (most recent call last):
      ...
    planner.errors.ParseError: /nonexistent/lspci.txt: expected a text file, found 'no such file'
    """
    name = str(path)
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise ParseError(name, None, "a text file", "no such file") from None
    except IsADirectoryError:
        raise ParseError(name, None, "a text file", "a directory") from None
    except PermissionError:
        raise ParseError(name, None, "a text file", "a file it is not allowed to read") from None
    except (OSError, ValueError) as exc:  # ValueError: a path with a NUL in it
        raise ParseError(name, None, "a text file", f"an unreadable file ({exc.__class__.__name__})") from None

    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError:
            raise ParseError(name, None, "a text file", "undecodable UTF-16 data") from None
    nul = data.find(b"\x00")
    if nul >= 0:
        raise ParseError(name, data.count(b"\n", 0, nul) + 1, "a text file", "binary data (a NUL byte)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    # Not UTF-8: Latin-1 decodes any byte, so only accept it for bytes that
    # look like text (no control codes), not for a binary file.
    control = _CONTROL.search(data)
    if control is not None:
        line = data.count(b"\n", 0, control.start()) + 1
        raise ParseError(name, line, "a text file", "binary data (control bytes, not UTF-8)")
    return data.decode("latin-1")


def text_lines(text: str) -> list[str]:
    """``text`` split at newlines (only ``\\n``; a trailing ``\\r`` is dropped).

    ``str.splitlines`` also splits at form feeds and Unicode separators,
    which would make line numbers in messages disagree with an editor's.

    >>> text_lines("a\\r\\nb\\x0cc\\n")
    ['a', 'b\\x0cc', '']
    """
    return [ln[:-1] if ln.endswith("\r") else ln for ln in text.split("\n")]


# What each capture we know of looks like near its top. Order matters: the
# more specific signatures come first.
_SIGNATURES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^# dmidecode|^Handle 0x[0-9A-Fa-f]{4}, DMI type \d+", re.M), "the output of dmidecode"),
    (re.compile(r"^[ \t]*GPU0\s.*\b(?:CPU Affinity|NUMA Affinity)\b", re.M), "the output of nvidia-smi topo -m"),
    (re.compile(r"NVIDIA-SMI \d|^\|[ \t]*NVIDIA-SMI", re.M), "the output of nvidia-smi"),
    (re.compile(r"^[ \t]*<topology\b", re.M), "hwloc XML (lstopo --of xml)"),
    (re.compile(r"^[ \t]*<system\b", re.M), "an NCCL topology XML file"),
    (re.compile(r"^[ \t]*<\?xml\b|^[ \t]*<[A-Za-z][\w:-]*[\s>]", re.M), "an XML document"),
    (re.compile(r"^Architecture:\s", re.M), "the output of lscpu"),
    (re.compile(r"^[ \t]*CPU\s+NODE\s+SOCKET\b", re.M), "the output of lscpu -e"),
    (re.compile(r"^available: \d+ nodes?\b", re.M), "the output of numactl --hardware"),
    (re.compile(r"^NAME\s+MAJ:MIN\b", re.M), "the output of lsblk"),
    (re.compile(r"^hca_id:\s", re.M), "the output of ibv_devinfo"),
    (re.compile(r"^[ \t]*(?:-[+\\]?-?|[+\\]-)\[(?:[0-9a-f]{4,8}:)?[0-9a-f]{2}\]-", re.M), "the output of lspci -t"),
    (re.compile(r"^Slot:\t(?:[0-9a-f]{4,8}:)?[0-9a-f]{2}:", re.M), "the output of lspci -vmm"),
    (re.compile(r"^(?:[0-9a-f]{4,8}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7] [^:\n]+: ", re.M), "the output of lspci"),
    (re.compile(r"^[ \t]+(?:LnkCap|LnkSta|ACSCtl|DevCap|Capabilities):", re.M),
     "detail lines of lspci -vvv without their device lines (filtered with grep?)"),
)


def guess_format(text: str, max_chars: int = 20000) -> str | None:
    """A phrase naming what printed ``text`` ("the output of dmidecode"), or ``None``.

    Only the first ``max_chars`` characters are looked at.

    >>> guess_format("-+-[0000:00]-+-00.0\\n")
    'the output of lspci -t'
    >>> guess_format("available: 2 nodes (0-1)\\n")
    'the output of numactl --hardware'
    """
    head = text[:max_chars]
    stripped = head.lstrip()
    if stripped[:1] in ("{", "["):
        try:
            json.loads(text)
        except (ValueError, RecursionError):
            if stripped[:1] == "{":
                return "a JSON document (truncated or invalid)"
        else:
            return "a JSON document"
    for pattern, what in _SIGNATURES:
        if pattern.search(head):
            return what
    return None
