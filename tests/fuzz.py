"""What the parsers' fuzz tests share: damaged real input, and "a result or a ParseError, nothing else".

Each parser's test file keeps its own checks of what a parse returns; the
ways of damaging a capture (:func:`mutate`, :func:`mutated_text`) and the
refusal check (:func:`parses_or_refuses`) are here, once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import strategies as st

#: the ways a capture gets damaged, one line at a time
MUTATIONS = ("delete", "duplicate", "swap", "truncate", "cut", "chop", "flip", "dedent")


def mutate(lines: list[str], op: str, pick: Callable[[int, int], int], char: Callable[[], str]) -> list[str]:
    """A copy of ``lines`` with one mutation ``op`` (of :data:`MUTATIONS`) at a line ``pick`` chooses.

    ``pick(lo, hi)`` returns an int in ``[lo, hi]`` and ``char()`` a character
    (a hypothesis draw, or a seeded ``random.Random``). ``truncate`` ends the
    input before the line, ``cut`` ends it inside the line, ``chop`` shortens
    the line and keeps the rest, ``flip`` replaces one character, ``dedent``
    strips the line's indentation; ``swap`` exchanges it with any line.

    >>> import random
    >>> r = random.Random(1)
    >>> mutate(["a", "bb", "c"], "duplicate", lambda lo, hi: 1, lambda: "x")
    ['a', 'bb', 'bb', 'c']
    >>> mutate(["a", "bb", "c"], "cut", lambda lo, hi: hi if hi == 1 else 1, lambda: "x")
    ['a', 'b']
    """
    if op not in MUTATIONS:
        raise ValueError(f"unknown mutation {op!r}; one of {', '.join(MUTATIONS)}")
    lines = list(lines)
    if not lines:
        return lines
    i = pick(0, len(lines) - 1)
    if op == "delete":
        del lines[i]
    elif op == "duplicate":
        lines.insert(i, lines[i])
    elif op == "swap":
        j = pick(0, len(lines) - 1)
        lines[i], lines[j] = lines[j], lines[i]
    elif op == "truncate":
        lines = lines[:i]
    elif op == "cut":
        lines = lines[:i] + [lines[i][:pick(0, len(lines[i]))]]
    elif op == "chop":
        lines[i] = lines[i][:pick(0, len(lines[i]))]
    elif op == "flip" and lines[i]:
        k = pick(0, len(lines[i]) - 1)
        lines[i] = lines[i][:k] + char() + lines[i][k + 1:]
    elif op == "dedent":
        lines[i] = lines[i].lstrip()
    return lines


@st.composite
def mutated_text(draw: Any, texts: Sequence[str], chars: str | None = None,
                 ops: Sequence[str] = MUTATIONS, times: tuple[int, int] = (1, 1),
                 keepends: bool = False) -> str:
    """A strategy: one of ``texts`` with ``times`` (a range) mutations of ``ops`` applied.

    ``chars`` are the characters ``flip`` writes (any character when None);
    ``keepends`` keeps each line's newline with it (so ``cut`` can drop it).
    """
    lines = draw(st.sampled_from(list(texts))).splitlines(keepends=keepends)
    pick = lambda lo, hi: draw(st.integers(lo, hi))  # noqa: E731 - a one-line draw
    char = (lambda: draw(st.sampled_from(list(chars)))) if chars else (lambda: draw(st.characters()))
    for _ in range(draw(st.integers(*times))):
        if not lines:
            break
        lines = mutate(lines, draw(st.sampled_from(list(ops))), pick, char)
    return ("" if keepends else "\n").join(lines)


def parses_or_refuses(parse: Callable[[str, str], Any], text: str, source: str = "fuzz") -> Any:
    """``parse(text, source)``'s result, or None when it raises the project's ParseError naming ``source``.

    The shared body of the parsers' fuzz tests: any other exception is a bug,
    and so is a refusal that names another input or a line the text does not
    have.
    """
    from planner.errors import ParseError

    try:
        result = parse(text, source)
    except ParseError as err:
        assert err.source == source
        assert err.line is None or 1 <= err.line <= text.count("\n") + 2, err
        return None
    assert result is not None
    return result
