"""Onig's regex patterns (``tokenizers``' pre-tokenizer splits) restricted to ASCII text: Python
``re`` patterns that find the same matches on any ASCII text, which ``FastPieceEncoder`` splits
with.

Each character class of the onig pattern becomes the explicit set of ASCII code
points it matches — ``\\p{X}``/``\\P{X}`` (general categories, one or two letters) from
``unicodedata`` at import, ``\\s``/``\\S`` as onig defines them for ASCII (TAB, LF, VT, FF, CR,
space: Unicode ``White_Space``; Python's own ``\\s`` would add 0x1C-0x1F), literals and ranges
as written (ranges past ASCII clipped). Groups, alternation, lookaheads and greedy or lazy
quantifiers mean the same in both backtracking engines. A case-insensitive group ``(?i:...)``
of literal alternatives (Qwen2's and Llama-3's contractions, ``'s|'t|'re|...``) stays one: on
ASCII text both engines fold exactly A-Z to a-z (their Unicode folds, such as ``ſ`` for ``s``,
need a non-ASCII character). Anything else (anchors, ``.``, other escapes, other flags,
possessive quantifiers, nested or intersected classes, classes inside ``(?i:``) is refused.

Pure: strings in, strings (or ``UnsupportedPattern``) out.
"""

from __future__ import annotations

import re
import unicodedata

try:  # Python 3.11+
    from re import _parser as _sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python < 3.11
    import sre_parse as _sre_parse  # type: ignore[no-redef]

ASCII = frozenset(range(128))
# Oniguruma's \s (Unicode White_Space) restricted to ASCII: \t \n \v \f \r and space.
ONIG_SPACE = frozenset((0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20))
# General category (one and two letters) -> the ASCII code points in it, from unicodedata.
CATEGORIES: dict[str, frozenset[int]] = {}
for _cp in range(128):
    _cat = unicodedata.category(chr(_cp))
    for _name in (_cat, _cat[0]):
        CATEGORIES[_name] = CATEGORIES.get(_name, frozenset()) | {_cp}
_ALL_CATEGORY_NAMES = frozenset((
    "L", "Lu", "Ll", "Lt", "Lm", "Lo", "M", "Mn", "Mc", "Me", "N", "Nd", "Nl", "No",
    "P", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "S", "Sm", "Sc", "Sk", "So",
    "Z", "Zs", "Zl", "Zp", "C", "Cc", "Cf", "Cs", "Co", "Cn",
))
_SIMPLE_ESCAPES = {"t": 0x09, "n": 0x0A, "r": 0x0D, "f": 0x0C}


class UnsupportedPattern(ValueError):
    """A regex construct this translation does not model exactly."""


def _category(name: str) -> frozenset[int]:
    if name not in _ALL_CATEGORY_NAMES:
        raise UnsupportedPattern(f"property \\p{{{name}}}")
    return CATEGORIES.get(name, frozenset())


def _emit_class(codes: frozenset[int]) -> str:
    """A Python class matching exactly ``codes`` among ASCII characters."""
    if not codes:
        return r"[^\x00-\x7f]"  # matches no ASCII character
    return "[" + "".join(f"\\x{c:02x}" for c in sorted(codes)) + "]"


def _escape_set(pattern: str, i: int) -> tuple[frozenset[int] | int, int]:
    """The escape at ``pattern[i] == '\\'``: a set (class escape) or one code point."""
    if i + 1 >= len(pattern):
        raise UnsupportedPattern("trailing backslash")
    c = pattern[i + 1]
    if c in "pP":
        end = pattern.find("}", i)
        if pattern[i + 2 : i + 3] != "{" or end < 0:
            raise UnsupportedPattern(f"\\{c} without {{name}}")
        codes = _category(pattern[i + 3 : end])
        return (codes if c == "p" else ASCII - codes), end + 1
    if c == "s":
        return ONIG_SPACE, i + 2
    if c == "S":
        return ASCII - ONIG_SPACE, i + 2
    if c in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[c], i + 2
    if not c.isalnum() and c.isascii() and c.isprintable():
        return ord(c), i + 2  # an escaped punctuation character stands for itself
    raise UnsupportedPattern(f"escape \\{c}")


def parse_class(pattern: str, i: int) -> tuple[frozenset[int], int]:
    """The bracket class starting at ``pattern[i] == '['``: its ASCII members, next index."""
    i += 1
    negate = pattern[i : i + 1] == "^"
    if negate:
        i += 1
    members: set[int] = set()
    first = True
    while True:
        if i >= len(pattern):
            raise UnsupportedPattern("unterminated class")
        c = pattern[i]
        if c == "]" and not first:
            i += 1
            break
        if c == "[" or pattern.startswith("&&", i):
            raise UnsupportedPattern("nested or intersected class")
        first = False
        if c == "\\":
            item, i = _escape_set(pattern, i)
        else:
            item, i = ord(c), i + 1
        if isinstance(item, frozenset):
            if pattern[i : i + 1] == "-" and pattern[i + 1 : i + 2] != "]":
                raise UnsupportedPattern("class escape as a range start")
            members |= item
            continue
        if pattern[i : i + 1] == "-" and pattern[i + 1 : i + 2] not in ("]", ""):
            if pattern[i + 1] == "\\":
                high, i = _escape_set(pattern, i + 1)
                if isinstance(high, frozenset):
                    raise UnsupportedPattern("class escape as a range end")
            elif pattern[i + 1] == "[":
                raise UnsupportedPattern("nested class")
            else:
                high, i = ord(pattern[i + 1]), i + 2
            if high < item:
                raise UnsupportedPattern("reversed range")
            members.update(range(item, min(high, 127) + 1))
        else:
            members.add(item)
    codes = frozenset(c for c in members if c < 128)
    return (ASCII - codes if negate else codes), i


_QUANTIFIER = re.compile(r"\{(\d+)(,(\d*))?\}")
# ``(?i:`` + literal alternatives + ``)``: the only flagged group translated (see docstring)
_CASELESS_LITERALS = re.compile(r"\(\?i:((?:[^\\()\[\]{}.*+?^$|]+\|)*[^\\()\[\]{}.*+?^$|]+)\)")
# A translated pattern that is one class without ASCII members, repeated or not (``translate``
# has refused a minimum width of 0): it can match no ASCII text at all.
_NO_ASCII_ONLY = re.compile(re.escape(_emit_class(frozenset())) + r"(?:\+|\{\d+(?:,\d*)?\})?\??")


def matches_no_ascii(translated: str) -> bool:
    return _NO_ASCII_ONLY.fullmatch(translated) is not None


def translate(pattern: str) -> str:
    """A Python ``re`` pattern that finds the same matches as onig's ``pattern`` in any ASCII
    text; raises ``UnsupportedPattern`` for anything not modelled."""
    out: list[str] = []
    i = 0
    quantifiable = False  # the previous item may take a quantifier
    while i < len(pattern):
        c = pattern[i]
        if c == "[":
            codes, i = parse_class(pattern, i)
            out.append(_emit_class(codes))
            quantifiable = True
        elif c == "\\":
            item, i = _escape_set(pattern, i)
            out.append(_emit_class(item if isinstance(item, frozenset) else frozenset((item,))))
            quantifiable = True
        elif c == "(" and pattern.startswith("(?i:", i):
            m = _CASELESS_LITERALS.match(pattern, i)
            if m is None or not m.group(1).isascii():
                raise UnsupportedPattern("(?i: group that is not ASCII literal alternatives")
            out.append("(?i:" + "|".join(re.escape(a) for a in m.group(1).split("|")) + ")")
            i = m.end()
            quantifiable = True
        elif c == "(":
            for opener in ("(?:", "(?!", "(?="):
                if pattern.startswith(opener, i):
                    out.append(opener)
                    i += len(opener)
                    break
            else:
                if pattern.startswith("(?", i):
                    raise UnsupportedPattern("group flags or named/lookbehind groups")
                out.append("(?:")  # capturing or not, the match is the same
                i += 1
            quantifiable = False
        elif c in ")|":
            out.append(c)
            i += 1
            quantifiable = c == ")"
        elif c in "?*+{":
            if not quantifiable:
                raise UnsupportedPattern(f"quantifier {c!r} with nothing to repeat")
            if c == "{":
                m = _QUANTIFIER.match(pattern, i)
                if m is None:
                    raise UnsupportedPattern("'{' that is not an interval")
                out.append(m.group(0))
                i = m.end()
                if pattern[i : i + 1] == "+":
                    raise UnsupportedPattern("interval followed by '+'")
            else:
                out.append(c)
                i += 1
                if pattern[i : i + 1] == "+":
                    raise UnsupportedPattern("possessive quantifier")
            if pattern[i : i + 1] == "?":  # lazy
                out.append("?")
                i += 1
            quantifiable = False
        elif c in ".^$":
            raise UnsupportedPattern(f"{c!r}")
        else:
            # a literal: outside ASCII it can never match ASCII text, and stays so here
            out.append(re.escape(c))
            i += 1
            quantifiable = True
    translated = "".join(out)
    try:
        min_width = _sre_parse.parse(translated).getwidth()[0]
    except re.error as exc:
        raise UnsupportedPattern(f"not a valid pattern ({exc})") from exc
    if min_width == 0:
        raise UnsupportedPattern("the pattern can match the empty string")
    return translated
