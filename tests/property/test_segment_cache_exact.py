"""The segment-cached tokenizer equals one plain full encode of the rendered prompt (by
``tokenizers``), with the real 128k-vocab DeepSeek tokenizer: random multi-turn chats (unicode,
whitespace at the edges, added-token strings inside user text, empty messages), warm and cold,
one cache shared across examples (and a tiny one that evicts all the time). The cold and shared
caches encode new pieces with fastokens (``exact_bpe``, as a loaded profile does after its start
check), the tiny ones with ``tokenizers``. The request path's compiled ``encode_now`` is held to
the same: inline, handed off as a ``Lookup`` (then finished as a worker thread would), with BOS.
Caches with a ``LineCutter`` of a few characters (long pieces cached as chunks) are held to the
same."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from cortex.tokenize.line_cuts import LineCutter
from cortex.tokenize.segment_cache import SegmentCachedTokenizer
from cortex.tokenize.segments import Segmenter, added_tokens_from_json
from tests import deepseek_profile as ds
from tests.tokenize_helpers import encode_now_ids

_TOKENIZER = ds.tokenizer()
_JSON = json.loads(ds.tokenizer_json_bytes())
_ADDED = [t.content for t in added_tokens_from_json(_JSON)]
_SEGMENTER = Segmenter.from_tokenizer_json(ds.tokenizer_json_bytes())
_BPE = ds.fast_bpe()
_SHARED = SegmentCachedTokenizer(_BPE, _SEGMENTER, capacity_bytes=1 << 20)
_TINY = SegmentCachedTokenizer(_TOKENIZER, _SEGMENTER, capacity_bytes=600)
_TEMPLATE = ds.chat_template()
_NOW_SHARED = SegmentCachedTokenizer(_BPE, _SEGMENTER, capacity_bytes=1 << 20, bos_id=0)
_NOW_TINY = SegmentCachedTokenizer(_TOKENIZER, _SEGMENTER, capacity_bytes=600)
_CUTTER = LineCutter(_TOKENIZER, _SEGMENTER, min_chars=3)
_CUT_SHARED = SegmentCachedTokenizer(_BPE, _SEGMENTER, capacity_bytes=1 << 20, cutter=_CUTTER)

# Added tokens that matter most (chat markers, BOS/EOS, non-special raw ones) and some others,
# plus near misses that must not split.
_MARKERS = [ds.BOS, ds.EOS, "<｜User｜>", "<｜Assistant｜>", "<｜tr｜>", "<｜/table>｜",
            "<｜fim▁hole｜>", "<｜User｜", "｜>", "<｜", "<|im_start|>"]
_fragment = st.one_of(
    st.text(max_size=12),
    st.text(alphabet="\n\n  \tx}中é\u0301\u3000🙂7", max_size=16),
    st.text(alphabet=" \t\n\r\u00a0\u3000", max_size=4),
    st.text(alphabet="aé中文🙂1 2.\n'", max_size=12),
    st.text(alphabet=st.characters(max_codepoint=127), max_size=12),
    st.text(alphabet="ab Z09 .,'!?\t\r\n\x0b\x1c", max_size=12),
    st.sampled_from(_MARKERS),
    st.sampled_from(_ADDED),
)
_content = st.lists(_fragment, max_size=6).map("".join)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant"]), "content": _content}
)
_conversation = st.tuples(
    st.one_of(st.none(), _content), st.lists(_message, min_size=0, max_size=6), st.booleans()
)


def _render(system: str | None, messages: list[dict[str, str]], gen: bool) -> str:
    full = ([{"role": "system", "content": system}] if system is not None else []) + messages
    return _TEMPLATE.render(full, add_generation_prompt=gen)


def _plain(text: str) -> list[int]:
    return _TOKENIZER.encode(text, add_special_tokens=False).ids


@settings(max_examples=300, deadline=None)
@given(_conversation)
def test_cached_encode_equals_plain_full_encode(conv: tuple) -> None:
    text = _render(*conv)
    expected = _plain(text)
    cold_cache = SegmentCachedTokenizer(_BPE, _SEGMENTER)
    assert cold_cache.encode(text) == expected  # cold
    assert cold_cache.encode(text) == expected  # warm, every piece a hit
    assert _SHARED.encode(text) == expected  # pieces seen in earlier examples
    assert _TINY.encode(text) == expected  # constant eviction
    cut_cache = SegmentCachedTokenizer(_BPE, _SEGMENTER, cutter=_CUTTER)
    assert cut_cache.encode(text) == expected  # chunks
    assert cut_cache.encode(text) == expected  # every chunk a hit
    assert _CUT_SHARED.encode(text) == expected


@settings(max_examples=300, deadline=None)
@given(_conversation, st.integers(min_value=0, max_value=40))
def test_encode_now_equals_plain_full_encode(conv: tuple, offload_min: int) -> None:
    text = _render(*conv)
    expected = _plain(text)
    cold_cache = SegmentCachedTokenizer(_BPE, _SEGMENTER)
    assert encode_now_ids(cold_cache, text, False, offload_min) == expected  # cold
    assert encode_now_ids(cold_cache, text, False, offload_min) == expected  # warm
    assert encode_now_ids(_NOW_SHARED, text, True, offload_min) == [0, *expected]  # BOS first
    assert encode_now_ids(_NOW_TINY, text, False, offload_min) == expected  # eviction
    assert encode_now_ids(_CUT_SHARED, text, False, offload_min) == expected  # chunks
    assert cold_cache.misses == len({p for p, t in _SEGMENTER.split(text) if t is None})


@settings(max_examples=300, deadline=None)
@given(st.lists(_fragment, max_size=10).map("".join))
def test_any_text_splits_like_the_tokenizer(text: str) -> None:
    pieces = _SEGMENTER.split(text)
    assert "".join(p for p, _ in pieces) == text
    assert all(p for p, _ in pieces)
    assert _SHARED.encode(text) == _plain(text)


@settings(max_examples=100, deadline=None)
@given(_conversation, st.lists(_message, min_size=1, max_size=3))
def test_growing_chat_pays_only_for_new_text(conv: tuple, more: list) -> None:
    system, messages, _ = conv
    cache = SegmentCachedTokenizer(_TOKENIZER, _SEGMENTER)
    first = _render(system, messages, False)
    cache.encode(first)
    misses = cache.misses
    second = _render(system, messages + more, True)
    assert cache.encode(second) == _plain(second)
    new_pieces = {p for p, t in _SEGMENTER.split(second) if t is None} - {
        p for p, t in _SEGMENTER.split(first) if t is None
    }
    assert cache.misses - misses == len(new_pieces)
