"""Cutting an ordinary piece at line starts (``line_cuts``) is exact: the ids of the chunks,
each encoded alone and concatenated, equal one ``Tokenizer.encode`` of the whole
text — with both tokenizer families (DeepSeek-V3's 128k vocabulary: no normalizer, three Split
regexes; Qwen2.5's: NFC, one regex), on texts built to stress the cut: CJK and kana, emoji,
combining marks right after a newline, ideographic and other Unicode spaces, ``\\r\\n`` and blank
lines of spaces, digits, punctuation runs ending in newlines, code, and every cut taken
(``min_chars`` 1)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cortex.tokenize.line_cuts import CUT, LineCutter
from cortex.tokenize.segment_cache import SegmentCachedTokenizer
from cortex.tokenize.segments import Segmenter
from tests import deepseek_profile as ds
from tests import qwen_profile as qw


def _families() -> list[tuple[str, object, bytes]]:
    out = [("deepseek", ds.tokenizer(), ds.tokenizer_json_bytes())]
    if qw.tokenizer() is not None:
        out.append(("qwen", qw.tokenizer(), qw.tokenizer_json_bytes()))
    return out


FAMILIES = _families()
_DS_SEGMENTER = Segmenter.from_tokenizer_json(ds.tokenizer_json_bytes())
_SEGMENTERS = {name: Segmenter.from_tokenizer_json(raw) for name, _, raw in FAMILIES}
_CUTTERS = {name: (tok, LineCutter(tok, _SEGMENTERS[name], min_chars=1))
            for name, tok, _ in FAMILIES}

_line_starts = st.sampled_from(
    ["", " ", "  ", "\t", " \t ", "\u3000", "\u00a0", "\u2028", "\u0085", "\r", "\r\n", "\n",
     "\u0301", "\u0308e", "e\u0301", "\u1100\u1161", "\u1161", "\uf900", "\u212b", "\u3099"])
_words = st.sampled_from(
    ["foo", "Bar", "x", "def f(a, b):", "return a+b", "}", "{", "// note", "# 注释", "中文",
     "\u4e00", "\u9fa5", "\u9fa6", "日本語テキスト", "ｶﾀｶﾅ", "한국어", "🙂", "👍🏽", "é", "naïve",
     "123", "4567890", "3.14", "'s", "'LL", "!!", "?\n", ".\n\n", "...", "\"key\": [1, 2]",
     "Ω", "ſ", "K", "\x0b", "\x0c", "\x1c", "؟", "א", "ก่", "\u200d", "\ufeff"])
_line = st.tuples(_line_starts, st.lists(_words, max_size=5).map(" ".join),
                  st.sampled_from(["", " ", "  ", "\t", "\u3000"])).map("".join)
_texts = st.one_of(
    st.lists(_line, min_size=1, max_size=12).map("\n".join),
    st.lists(st.one_of(_line, st.text(max_size=8)), min_size=1, max_size=8).map("\n".join),
    st.text(alphabet=" \t\n\r\u3000abZ09中文🙂é\u0301.,'!{}", max_size=60),
)


def _ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("family", sorted(_CUTTERS))
@settings(max_examples=150, deadline=None)
@given(text=_texts, min_chars=st.integers(min_value=1, max_value=12))
def test_chunks_encode_like_the_whole(family: str, text: str, min_chars: int) -> None:
    tok, cutter = _CUTTERS[family]
    assert cutter.enabled, cutter.why_not_cutting
    expected = _ids(tok, text)
    every = [text[a:b] for a, b in zip([0, *(m.end() for m in CUT.finditer(text))],
                                       [*(m.end() for m in CUT.finditer(text)), len(text)])]
    assert "".join(every) == text
    assert [i for line in every for i in _ids(tok, line)] == expected
    sized = LineCutter(tok, _SEGMENTERS[family], min_chars=min_chars)
    chunks = sized.chunks(text)
    assert "".join(chunks) == text and (all(chunks) or not text)
    assert [i for c in chunks for i in _ids(tok, c)] == expected


@settings(max_examples=200, deadline=None)
@given(st.lists(_line, min_size=2, max_size=30).map("\n".join), st.integers(1, 40),
       st.lists(_line, min_size=1, max_size=5).map("\n".join))
def test_a_grown_text_keeps_its_earlier_chunks(text: str, min_chars: int, more: str) -> None:
    tok, _ = _CUTTERS["deepseek"]
    cutter = LineCutter(tok, _DS_SEGMENTER, min_chars=min_chars)
    before = cutter.chunks(text)
    after = cutter.chunks(text + more)
    assert after[:len(before) - 1] == before[:-1]


def test_qwen_family_present_or_said_why() -> None:
    if "qwen" not in _CUTTERS:
        pytest.skip(qw.MISSING)


def test_a_cut_needs_a_known_pre_tokenizer() -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    gpt2 = Tokenizer(models.BPE())
    gpt2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    cutter = LineCutter(gpt2, Segmenter({}))
    assert not cutter.enabled and "ByteLevel" in str(cutter.why_not_cutting)
    assert cutter.chunks("a\n" * 2000) == ["a\n" * 2000]


@settings(max_examples=2000, deadline=None)
@given(st.one_of(_texts, st.lists(_line, max_size=40).map("\n".join)), st.integers(1, 30))
def test_the_compiled_chunker_equals_its_reference(text: str, size: int) -> None:
    from cortex._fast.piece_cache import line_chunks

    tok, _ = _CUTTERS["deepseek"]
    reference = LineCutter(tok, _DS_SEGMENTER, min_chars=size)
    assert line_chunks(text, size) == reference.chunks(text)


_CACHES = {}
for _name, _tok, _raw in FAMILIES:
    _segmenter = Segmenter.from_tokenizer_json(_raw)
    _bpe = ds.fast_bpe() if _name == "deepseek" else qw.fast_bpe()
    _CACHES[_name] = (_tok, SegmentCachedTokenizer(
        _bpe, _segmenter, capacity_bytes=1 << 20,
        cutter=LineCutter(_tok, _segmenter, min_chars=5)))


@pytest.mark.parametrize("family", sorted(_CACHES))
@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(_texts, st.sampled_from(["<|im_start|>", "<tool_call>", "<｜User｜>"])),
                max_size=4).map("".join))
def test_the_segment_cache_with_cuts_equals_one_encode(family: str, text: str) -> None:
    # chunks of long pieces, the new ones through fastokens in one call
    tok, cache = _CACHES[family]
    expected = _ids(tok, text)
    assert cache.encode(text) == expected
    assert cache.encode_now(text, False, 1 << 30).tolist() == expected
