"""How ``tokenizers`` cuts at added tokens, probed with random text over a tiny alphabet and a
vocabulary built to collide: raw tokens that overlap each other and overlap normalized ones,
prefixes of one another, and single characters. The segment-cached encode must equal the plain
encode for every text (the DeepSeek vocabulary has no such overlaps, so this is where
leftmost-longest and the raw-then-normalized order are pinned down)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cortex.tokenize import segments
from cortex.tokenize.segment_cache import SegmentCachedTokenizer
from cortex.tokenize.segments import Segmenter, _longest_first_pattern, _Pass
from tests.tokenize_helpers import colliding_tokenizer

RAW = ["<a>", "<a>b", "bc", "a>b>", "|", "<<"]
NORMALIZED = ["ab", "c<", "b|b", "<a"]


_TOK = colliding_tokenizer(RAW, NORMALIZED, "abc<>| \n")
_SEG = Segmenter.from_tokenizer_json(_TOK.to_str())
_SHARED = SegmentCachedTokenizer(_TOK, _SEG, capacity_bytes=4096)
_text = st.lists(
    st.one_of(st.text(alphabet="abc<>| \n", max_size=6), st.sampled_from(RAW + NORMALIZED)),
    max_size=12,
).map("".join)


@settings(max_examples=500, deadline=None)
@given(_text)
def test_segmented_encode_equals_plain_encode(text: str) -> None:
    expected = _TOK.encode(text, add_special_tokens=False).ids
    assert SegmentCachedTokenizer(_TOK, _SEG).encode(text) == expected
    assert _SHARED.encode(text) == expected
    assert "".join(p for p, _ in _SEG.split(text)) == text


@settings(max_examples=500, deadline=None)
@given(_text)
def test_the_compiled_split_equals_the_python_passes(text: str) -> None:
    # Segmenter.split is one compiled call (token_spans.split_pieces); _Pass.split_into is the
    # same cut written in Python
    reference: list[tuple[str, int | None]] = []
    _SEG._first.split_into(text, reference, _SEG._second)
    assert _SEG.split(text) == reference
    one_pass = Segmenter({t: i for i, t in enumerate(RAW)})
    reference = []
    one_pass._first.split_into(text, reference, None)
    assert one_pass.split(text) == reference
    assert Segmenter.never("off").split(text) == ([(text, None)] if text else [])


def _reference_leftmost_longest(tokens: set[str], text: str) -> list[tuple[int, str]]:
    """Brute force: at each position from the left, the longest token starting there."""
    found, pos = [], 0
    while pos < len(text):
        here = [t for t in tokens if text.startswith(t, pos)]
        if here:
            token = max(here, key=len)
            found.append((pos, token))
            pos += len(token)
        else:
            pos += 1
    return found


_tokens = st.sets(st.text(alphabet="ab<", min_size=1, max_size=5), min_size=1, max_size=8)


@settings(max_examples=500, deadline=None)
@given(_tokens, st.text(alphabet="ab<c", max_size=30))
def test_trie_pattern_and_flat_fallback_find_leftmost_longest(tokens: set[str], text: str) -> None:
    expected = _reference_leftmost_longest(tokens, text)
    trie = _longest_first_pattern(tokens)
    flat = re.compile("|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True)))
    for pattern in (trie, flat):
        assert [(m.start(), m.group()) for m in pattern.finditer(text)] == expected


@settings(max_examples=500, deadline=None)
@given(_tokens, st.text(alphabet="ab<c", max_size=30), st.data())
def test_a_pass_finds_the_same_matches_by_str_find_and_by_finditer(
    tokens: set[str], text: str, data: st.DataObject
) -> None:
    """First-character candidates + ``match`` (``token_spans``, few first characters) and ``finditer``
    (many) yield the brute-force reference's matches, over the whole text or a window."""
    pos = data.draw(st.integers(0, len(text)))
    end = data.draw(st.integers(pos, len(text)))
    expected = [(at, at + len(token))
                for at, token in _reference_leftmost_longest(tokens, text[pos:end])]
    expected = [(start + pos, stop + pos) for start, stop in expected]
    by_find = _Pass(dict.fromkeys(tokens, 0), find_firsts=(1, 8))
    by_finditer = _Pass(dict.fromkeys(tokens, 0), find_firsts=(1, 0))
    assert by_find._firsts is not None and by_finditer._firsts is None
    assert by_finditer.spans(text, pos, end) == expected
    assert by_find.spans(text, pos, end) == expected
    with pytest.MonkeyPatch.context() as patch:
        for budget in (0, 1, 2):  # dense misses: finditer takes over part way
            patch.setattr(segments, "FIND_MAX_MISSES", budget)
            assert by_find.spans(text, pos, end) == expected


def test_a_trie_too_deep_for_re_falls_back_to_the_flat_alternation() -> None:
    tokens = {"a" * k for k in range(1, 700)}  # nests 699 groups: too deep for re
    pattern = _longest_first_pattern(tokens)
    assert "(?:" not in pattern.pattern
    assert [m.group() for m in pattern.finditer("b" + "a" * 1000)] == ["a" * 699, "a" * 301]
