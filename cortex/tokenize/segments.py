"""Cut text where the tokenizer itself cuts it: at its added tokens, before anything else.

How ``tokenizers`` treats added tokens (``AddedVocabulary::extract_and_normalize``):

1. In the raw text it finds every added token with ``normalized: false`` (leftmost-longest,
   non-overlapping) and turns each match into its fixed id.
2. It normalizes each remaining piece, then finds the added tokens with ``normalized: true`` in
   it the same way.
3. Only the text between matches is pre-tokenized and run through the model: no pre-token,
   merge or byte spans a match.

So encoding the pieces separately and concatenating the ids equals one plain encode of the
whole text. This module reproduces both passes, in that order (a single pass over the union
would differ: with ``ab`` normalized and ``bc`` not, ``abc`` splits as ``a|bc``).

Rules:

* Pass 2 is used only when the normalizer is the identity (absent or an empty ``Sequence``,
  as for DeepSeek, Llama 3 and Qwen); otherwise matches on normalized text cannot be found in
  the raw text and only pass 1 splits (still exact: pass-2 tokens are then left inside pieces,
  where the tokenizer finds them itself).
* An added token with ``lstrip``, ``rstrip`` or ``single_word`` set changes the text around
  it; that is not modelled, so such a vocabulary gets a segmenter that never splits (one piece
  = the whole text: exact, just not cached by piece). Likewise when the tokenizer encodes
  special tokens as text (``split=False``), and for a ``Metaspace`` pre-tokenizer with
  ``prepend_scheme: "first"`` (it prefixes ``▁`` only to the split at the start of the text,
  so a later piece encoded alone would differ). ``why_not_splitting`` says which.

Output: ``(text, token_id)`` pieces in order, ``token_id`` set for an added-token match and
``None`` for ordinary text (never empty); the texts concatenate back to the input.

Cost: per pass, one scan by a compiled ``re`` pattern: the tokens as a trie of alternations
(``<｜`` shared once, then one branch per next character), each node trying its longer
continuations before ending there. Only one branch of a node can match the next character, so
the first match found at a position is the longest token there: ``finditer`` yields exactly the
leftmost-longest, non-overlapping matches (≈2.6x faster than the former per-candidate dict
probes on DeepSeek's 1,283 added tokens). A vocabulary whose trie nests too deeply for ``re``
gets the flat alternation, longest first (the same matches, slower on big vocabularies).
Pass 2 scans the pass-1 gaps in place (``pos``/``endpos``), without slicing them out first.

``re`` itself searches fast only for a literal prefix (one first character: DeepSeek's pass 1),
and even that slower than ``str.find``; a pass whose tokens begin with more than one character
(DeepSeek's pass 2: ``<`` and ``｜``) gets a charset prefix, which ``re`` tests character by
character (~9 ns each: 146 µs for a 16 KB prompt, measured). So a pass whose tokens begin with
``FIND_FIRSTS`` (1 to 8) distinct characters is scanned by ``cortex._fast.token_spans``:
candidate positions from ``PyUnicode_FindChar`` (one per first character), each tried with the
pattern's ``match``. A token can only start at one of its first characters, and the match at
the leftmost candidate is the one ``finditer`` would yield there, so the matches are the same
(property-tested against ``finditer`` and a brute-force reference). After ``FIND_MAX_MISSES``
candidates that start no token (text full of ``<``, such as HTML) the rest of the range goes
to ``finditer``: a 16 KB HTML prompt would otherwise cost a ``match`` call per ``<``
(``perf/bench_tokenize.py``, ``split_16kb``). Matches do not count: a long chat's many turn
markers stay on the fast scan. (The scan was a Python loop over ``str.find`` before, used only
for ranges of 384 characters or more; in C it wins on every length: DeepSeek's small gateway
benchmark prompt, 396 characters, pass 2 in 3.5 -> 1.2 µs in a scratch loop; the kept figures
are ``perf/bench_request_steps.py``'s ``lookup``.)
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cortex._fast.token_spans import split_pieces, token_spans

Piece = tuple[str, int | None]
FIND_FIRSTS = (1, 8)  # passes whose tokens start with 1..8 characters: ``token_spans``
FIND_MAX_MISSES = 16  # then ``finditer`` for the rest of the range (HTML: '<' everywhere)
_UNMODELLED_FLAGS = ("lstrip", "rstrip", "single_word")


@dataclass(frozen=True, slots=True)
class AddedToken:
    content: str
    id: int
    special: bool
    normalized: bool
    lstrip: bool = False
    rstrip: bool = False
    single_word: bool = False


def added_tokens_from_json(tokenizer_json: Mapping[str, object]) -> list[AddedToken]:
    """The ``added_tokens`` of a parsed ``tokenizer.json``."""
    raw = tokenizer_json.get("added_tokens") or []
    if not isinstance(raw, list):
        raise ValueError("tokenizer.json: added_tokens is not a list")  # noqa: TRY004 (bad file content)
    return [
        AddedToken(
            content=str(entry["content"]),
            id=int(entry["id"]),
            special=bool(entry.get("special", False)),
            normalized=bool(entry.get("normalized", True)),
            lstrip=bool(entry.get("lstrip", False)),
            rstrip=bool(entry.get("rstrip", False)),
            single_word=bool(entry.get("single_word", False)),
        )
        for entry in raw
    ]


def normalizer_is_identity(tokenizer_json: Mapping[str, object]) -> bool:
    norm = tokenizer_json.get("normalizer")
    if norm is None:
        return True
    return (
        isinstance(norm, dict)
        and norm.get("type") == "Sequence"
        and not norm.get("normalizers")
    )


class _Pass:
    """Leftmost-longest, non-overlapping matching of a fixed set of literal (non-empty) tokens."""

    __slots__ = ("_firsts", "_pattern", "ids")

    def __init__(self, tokens: Mapping[str, int],
                 find_firsts: tuple[int, int] | None = None) -> None:
        self.ids = {text: tid for text, tid in tokens.items() if text}
        self._pattern = _longest_first_pattern(self.ids)
        firsts = sorted({text[0] for text in self.ids})
        low, high = find_firsts or FIND_FIRSTS
        self._firsts = tuple(firsts) if low <= len(firsts) <= high else None

    def spans(self, text: str, pos: int, end: int) -> list[tuple[int, int]]:
        """``(start, end)`` of each token match in ``text[pos:end]``: leftmost-longest,
        non-overlapping (what ``finditer`` yields)."""
        firsts = self._firsts
        if firsts is None:
            return [match.span() for match in self._pattern.finditer(text, pos, end)]
        return token_spans(self._pattern, firsts, text, pos, end, FIND_MAX_MISSES)

    def split_into(
        self, text: str, pieces: list[Piece], then: _Pass | None, pos: int = 0, end: int = -1
    ) -> None:
        """Append the pieces of ``text[pos:end]`` (``end`` -1: to the end of ``text``)."""
        if end < 0:
            end = len(text)
        ids = self.ids
        start = pos  # start of the pending ordinary text
        for cut, after in self.spans(text, pos, end):
            if cut > start:
                if then is None:
                    pieces.append((text[start:cut], None))
                else:
                    then.split_into(text, pieces, None, start, cut)
            token = text[cut:after]
            pieces.append((token, ids[token]))
            start = after
        if start < end:
            if then is None:
                pieces.append((text[start:end], None))
            else:
                then.split_into(text, pieces, None, start, end)


def _longest_first_pattern(tokens: Iterable[str]) -> re.Pattern[str]:
    """A pattern whose match at a position is the longest of ``tokens`` starting there."""
    trie: dict[str, dict] = {}
    for token in tokens:
        node = trie
        for char in token:
            node = node.setdefault(char, {})
        node[""] = {}  # a token ends here
    try:
        return re.compile(_trie_source(trie))
    except (RecursionError, re.error, OverflowError):
        flat = sorted(tokens, key=len, reverse=True)
        return re.compile("|".join(re.escape(t) for t in flat))


def _trie_source(node: dict[str, dict]) -> str:
    # Continuations first, the empty alternative (the token ending here) last: longest wins.
    branches = [re.escape(char) + _trie_source(child) for char, child in node.items() if char]
    if not branches:
        return ""
    if len(branches) == 1 and "" not in node:
        return branches[0]
    return "(?:" + "|".join(branches) + ("|)" if "" in node else ")")


def _anchors(tokens: frozenset[str]) -> frozenset[str]:
    inner = {t[k:] for t in tokens for k in range(1, len(t))}  # what follows an inner position
    inner_starts = {s[:m] for s in inner for m in range(1, len(s) + 1)}
    return frozenset(
        a for a in tokens
        if a not in inner_starts and not any(a[:m] in inner for m in range(1, len(a) + 1)))


def _prepends_to_first_split_only(pre_tokenizer: object) -> bool:
    if not isinstance(pre_tokenizer, dict):
        return False
    if pre_tokenizer.get("type") == "Metaspace":
        return pre_tokenizer.get("prepend_scheme") == "first"
    inner = pre_tokenizer.get("pretokenizers") or []
    return any(_prepends_to_first_split_only(p) for p in inner)


class Segmenter:
    """Splits text into pieces exactly where ``tokenizers`` splits it at added tokens."""

    __slots__ = ("_anchors", "_first", "_passes", "_second", "why_not_splitting")

    def __init__(
        self,
        raw_tokens: Mapping[str, int],
        normalized_tokens: Mapping[str, int] | None = None,
        why_not_splitting: str | None = None,
    ) -> None:
        passes = [_Pass(t) for t in (raw_tokens, normalized_tokens or {}) if t]
        passes = [p for p in passes if p.ids]
        self._first = passes[0] if passes else None
        self._second = passes[1] if len(passes) > 1 else None
        self._passes = tuple((p._pattern, p._firsts, p.ids) for p in passes)
        self.why_not_splitting = why_not_splitting
        self._anchors: frozenset[str] | None = None

    @property
    def tokens(self) -> frozenset[str]:
        """Every added token this segmenter cuts out (either pass)."""
        return frozenset(
            text for p in (self._first, self._second) if p is not None for text in p.ids
        )

    @property
    def anchors(self) -> frozenset[str]:
        """The added tokens no added token can extend into from the left: for an anchor ``a``,
        no token ``t`` has, at an inner position ``k`` (0 < k < len(t)), a suffix ``t[k:]``
        that agrees with ``a`` on their common length. So where ``a`` begins a text, no match
        spans that place, whatever precedes it — the seam ``PieceCache`` reuses a remembered
        prompt's pieces up to (``cortex._fast.piece_cache``). DeepSeek-V3: 1,282 of 1,283
        (``｜DSML｜`` continues ``<｜DSML｜…``). Computed once (~50 ms for DeepSeek-V3)."""
        if self._anchors is None:
            self._anchors = _anchors(self.tokens)
        return self._anchors

    @classmethod
    def never(cls, reason: str) -> Segmenter:

        return cls({}, None, reason)

    @classmethod
    def from_added_tokens(
        cls, added: Iterable[AddedToken], *, identity_normalizer: bool, split: bool = True
    ) -> Segmenter:
        if not split:
            return cls.never("the tokenizer encodes special tokens as text")
        raw: dict[str, int] = {}
        normalized: dict[str, int] = {}
        for tok in added:
            if any(getattr(tok, flag) for flag in _UNMODELLED_FLAGS):
                return cls.never(f"added token {tok.content!r} has lstrip/rstrip/single_word")
            (normalized if tok.normalized else raw)[tok.content] = tok.id
        return cls(raw, normalized if identity_normalizer else None)

    @classmethod
    def from_tokenizer_json(cls, text: str | bytes, split: bool = True) -> Segmenter:
        parsed = json.loads(text)
        if _prepends_to_first_split_only(parsed.get("pre_tokenizer")):
            return cls.never("Metaspace prepend_scheme 'first' treats the first piece apart")
        return cls.from_added_tokens(
            added_tokens_from_json(parsed),
            identity_normalizer=normalizer_is_identity(parsed),
            split=split,
        )

    @property
    def passes(self) -> tuple[tuple[re.Pattern[str], tuple[str, ...] | None, dict[str, int]], ...]:
        """What ``split_pieces`` reads: each pass's pattern, first characters and token ids."""
        return self._passes

    def split(self, text: str) -> list[Piece]:
        """Pieces of ``text`` in order; their texts concatenate back to ``text``. (One compiled
        call, ``split_pieces``; ``_Pass.split_into`` is the same cut in Python, its reference.)"""
        return split_pieces(text, self._passes, FIND_MAX_MISSES)
