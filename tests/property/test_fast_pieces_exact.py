"""The fast ASCII path equals ``Tokenizer.encode`` with the real 128k-vocab DeepSeek tokenizer,
for arbitrary ASCII text: all 128 code points, weighted towards realistic text (words, digit
runs, punctuation, whitespace runs with \\r\\n\\t, control characters) and the vocabulary's
ASCII added tokens (which the segmenter cuts out before the fast path sees a piece). The same
for Qwen2.5's tokenizer (NFC normalizer, one regex with a case-insensitive group; ``re`` splits,
no native splitter), when ``make engines`` has built it."""

from __future__ import annotations

import json
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cortex._fast.word_ids import WordIds
from cortex.profile.fast_pieces import FastPieceEncoder
from cortex.profile.segment_cache import SegmentCachedTokenizer
from cortex.profile.segments import Segmenter, added_tokens_from_json
from tests import deepseek_profile as ds
from tests import qwen_profile as qw

_TOKENIZER = ds.tokenizer()
_SEGMENTER = Segmenter.from_tokenizer_json(ds.tokenizer_json_bytes())
_FAST = FastPieceEncoder(_TOKENIZER, _SEGMENTER, word_cache_entries=512)
_ASCII_ADDED = [
    t.content for t in added_tokens_from_json(json.loads(ds.tokenizer_json_bytes()))
    if t.content.isascii()
][:40]
_WORDS = ["the", "The", "cache", "KV", "router's", "don't", "I'm", "x", "API", "HTTP/1.1",
          "e.g.", "foo_bar", "camelCase", "a-b", "URL", "http://x.io/a?b=c"]

_fragment = st.one_of(
    st.sampled_from(_WORDS),
    st.text(alphabet=string.ascii_letters, min_size=1, max_size=12),
    st.text(alphabet=string.digits, min_size=1, max_size=9),
    st.text(alphabet=string.punctuation, min_size=1, max_size=4),
    st.text(alphabet=" \t\r\n\x0b\x0c", min_size=1, max_size=6),
    # whitespace runs with the controls where Python's and onig's \s differ (0x1C-0x1F)
    st.text(alphabet="  \t\n\x0b\x1c\x1d\x1e\x1f\x00\x7f", min_size=1, max_size=6),
    st.sampled_from([" ", " ", "\n", "\r\n", "\n\n", ". ", ", "]),
    st.text(alphabet=st.characters(max_codepoint=127), max_size=8),  # all 128, controls too
    st.sampled_from(_ASCII_ADDED),
)
_ascii_text = st.lists(_fragment, max_size=24).map("".join)


def _plain(text: str) -> list[int]:
    return _TOKENIZER.encode(text, add_special_tokens=False).ids


@settings(max_examples=1500, deadline=None)
@given(_ascii_text)
def test_fast_path_equals_encode_on_ascii_pieces(text: str) -> None:
    assert _FAST.enabled, _FAST.why_not_fast
    for piece, token_id in _SEGMENTER.split(text):
        if token_id is None:
            assert list(_FAST.encode(piece)) == _plain(piece)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_fragment, st.text(max_size=6)), max_size=16).map("".join))
def test_cached_tokenizer_with_fast_path_equals_one_full_encode(text: str) -> None:
    cache = SegmentCachedTokenizer(_TOKENIZER, _SEGMENTER, fast=_FAST)
    assert cache.encode(text) == _plain(text)


@settings(max_examples=3000, deadline=None)
@given(st.lists(_fragment, max_size=32).map("".join))
def test_native_words_equal_the_regex_splits(text: str) -> None:
    # the native DeepSeek-V3 splitter (cortex._fast.ascii_words) against its reference, re
    assert _FAST.native
    assert _FAST._native.words(text) == _FAST.regex_words(text)


def test_native_words_equal_the_regex_splits_on_every_short_string() -> None:
    # every string of up to three characters over one representative of each class the
    # splitter tells apart (and the ones it must not confuse)
    alphabet = "aZ0!$_ \t\n\r\x0b\x1c\x00\x7f"
    texts = [""] + list(alphabet)
    for _ in range(2):
        texts += [t + c for t in texts if len(t) == len(texts[-1]) for c in alphabet]
    assert len(texts) == 1 + 14 + 14**2 + 14**3
    for text in texts:
        assert _FAST._native.words(text) == _FAST.regex_words(text), repr(text)


@settings(max_examples=1000, deadline=None)
@given(st.lists(_fragment, max_size=24).map("".join), st.randoms(use_true_random=False))
def test_native_cached_ids_are_the_words_ids_or_none_on_a_miss(text: str, rng) -> None:
    words = _FAST.regex_words(text)
    cache = {word: (index, len(word)) for index, word in enumerate(words)}
    for word in words:
        if rng.random() < 0.1:
            cache.pop(word, None)
    table = WordIds(4096, 1024)
    for word, ids in cache.items():
        assert table.put(word, ids)
    expected = None
    if all(word in cache for word in words):
        expected = [i for word in words for i in cache[word]]
    found = _FAST._native.cached_ids(text, table)
    assert (None if found is None else list(found)) == expected


_QWEN = qw.tokenizer()
_QWEN_SEGMENTER = (None if _QWEN is None else
                   Segmenter.from_tokenizer_json(qw.tokenizer_json_bytes()))
_QWEN_FAST = (None if _QWEN is None else
              FastPieceEncoder(_QWEN, _QWEN_SEGMENTER, word_cache_entries=512))
_qwen_fragment = st.one_of(_fragment, st.sampled_from(
    ["'s", "'S", "'ll", "'LL", "'Re", "'ve", "'m", "'d", "'x", "''s", " 's", "<|im_start|>",
     "<tool_call>", "<|im_end|>", "1234567"]))


@pytest.mark.skipif(_QWEN is None, reason=qw.MISSING)
@settings(max_examples=1500, deadline=None)
@given(st.lists(_qwen_fragment, max_size=24).map("".join))
def test_qwen_fast_path_equals_encode_on_ascii_pieces(text: str) -> None:
    assert _QWEN_FAST is not None and _QWEN_FAST.enabled, _QWEN_FAST.why_not_fast
    for piece, token_id in _QWEN_SEGMENTER.split(text):
        if token_id is None:
            assert list(_QWEN_FAST.encode(piece)) == _QWEN.encode(piece,
                                                                  add_special_tokens=False).ids
    cache = SegmentCachedTokenizer(_QWEN, _QWEN_SEGMENTER, fast=_QWEN_FAST)
    assert cache.encode(text) == _QWEN.encode(text, add_special_tokens=False).ids


_QWEN_ALPHABET = "aZ0!$_' \t\n\r\x0b\x1c\x00\x7fsStTlLeE"
_qwen_words_text = st.lists(st.one_of(_qwen_fragment, st.text(alphabet=_QWEN_ALPHABET,
                                                              max_size=8)), max_size=32)


def _regex_words(split: str):
    import re

    from cortex.profile.fast_pieces import _isolate
    from cortex.profile.onig_ascii import translate

    pattern = re.compile(f"({translate(split)})")
    return lambda text: _isolate(pattern, [text])


@settings(max_examples=3000, deadline=None)
@given(_qwen_words_text.map("".join))
def test_native_qwen2_and_llama3_words_equal_the_regex_splits(text: str) -> None:
    # cortex._fast.ascii_words.Qwen2Words against its reference, re (no tokenizer needed)
    from cortex._fast.ascii_words import Qwen2Words
    from cortex.profile.fast_pieces import LLAMA3_SPLIT, QWEN2_SPLIT, qwen2_flags

    for split, digits in ((QWEN2_SPLIT, 1), (LLAMA3_SPLIT, 3)):
        assert Qwen2Words(qwen2_flags(), digits).words(text) == _regex_words(split)(text)


def test_native_qwen2_words_equal_the_regex_splits_on_every_short_string() -> None:
    from cortex._fast.ascii_words import Qwen2Words
    from cortex.profile.fast_pieces import QWEN2_SPLIT, qwen2_flags

    native, reference = Qwen2Words(qwen2_flags(), 1), _regex_words(QWEN2_SPLIT)
    alphabet = "aS0!_' \t\n\r\x0b\x1c\x00"
    texts = [""] + list(alphabet)
    for _ in range(2):
        texts += [t + c for t in texts if len(t) == len(texts[-1]) for c in alphabet]
    for text in texts:
        assert native.words(text) == reference(text), repr(text)
