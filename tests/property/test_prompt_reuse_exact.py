"""A prompt that extends a remembered one takes that prompt's ids up to a cut and encodes only
the rest (``cortex._fast.piece_cache``): always the plain full encode's ids. Held with the real
DeepSeek tokenizer (chats that grow, are edited in their last message, or are cut anywhere and
continued with random text and added tokens), Qwen2.5's (raw text with its added tokens), and a
tiny vocabulary built to collide (tokens that overlap one another, so that a token can span a
cut unless the cut is at an anchor) — through ``encode_array``, the request path's
``encode_now`` (inline and handed off, with BOS), and caches shared across examples (where any
earlier example may be taken as the prompt extended). The native common-prefix comparison
equals a character loop for strings of every width."""

from __future__ import annotations

import functools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from cortex._fast.piece_cache import REUSE_MIN_CHARS, common_prefix
from cortex.tokenize.segment_cache import SegmentCachedTokenizer
from cortex.tokenize.segments import Segmenter
from tests import deepseek_profile as ds
from tests import qwen_profile as qw
from tests.tokenize_helpers import colliding_tokenizer, encode_now_ids

_DS_TOKENIZER = ds.tokenizer()
_DS_SEGMENTER = Segmenter.from_tokenizer_json(ds.tokenizer_json_bytes())
_DS_BPE = ds.fast_bpe()
_DS_ADDED = [e["content"] for e in json.loads(ds.tokenizer_json_bytes())["added_tokens"]]
_TEMPLATE = ds.chat_template()


def _reusing(bpe, segmenter, **kw) -> SegmentCachedTokenizer:
    return SegmentCachedTokenizer(bpe, segmenter, reuse_min_chars=0, **kw)


_DS_SHARED = _reusing(_DS_BPE, _DS_SEGMENTER, capacity_bytes=1 << 20)
_DS_SMALL = _reusing(_DS_TOKENIZER, _DS_SEGMENTER, capacity_bytes=600, recent_bytes=4096)

_fragment = st.one_of(
    st.text(max_size=12),
    st.text(alphabet="\n\n  \tx}中é\u0301🙂7<｜>", max_size=16),
    st.sampled_from([ds.BOS, ds.EOS, "<｜User｜>", "<｜Assistant｜>", "<｜", "｜>", "｜DSML｜",
                     "<｜DSML｜", "<｜User｜"]),
    st.sampled_from(_DS_ADDED),
)
_content = st.lists(_fragment, max_size=6).map("".join)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant"]), "content": _content})


def _plain(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


@settings(max_examples=200, deadline=None)
@given(system=_content, messages=st.lists(_message, max_size=5),
       more=st.lists(_message, min_size=1, max_size=3), edit=_content,
       cut=st.integers(min_value=0), tail=st.lists(_fragment, max_size=6).map("".join),
       offload_min=st.integers(min_value=0, max_value=40))
def test_deepseek_extended_prompts_equal_plain_encodes(system, messages, more, edit, cut, tail,
                                                       offload_min) -> None:
    chat = [{"role": "system", "content": system}, *messages]
    first = _TEMPLATE.render(chat, add_generation_prompt=True)
    grown = _TEMPLATE.render(chat + more, add_generation_prompt=True)  # the next turn
    edited = _TEMPLATE.render([*chat + more][:-1] + [{"role": "user", "content": edit}],
                              add_generation_prompt=True)  # the last message replaced
    continued = grown[:cut % (len(grown) + 1)] + tail  # cut anywhere, then anything
    cache = _reusing(_DS_BPE, _DS_SEGMENTER)
    now = _reusing(_DS_BPE, _DS_SEGMENTER, bos_id=0)
    for text in (first, grown, edited, continued, first):
        want = _plain(_DS_TOKENIZER, text)
        assert cache.encode(text) == want
        assert encode_now_ids(now, text, True, offload_min) == [0, *want]
        assert _DS_SHARED.encode(text) == want
        assert _DS_SMALL.encode(text) == want  # evicts pieces and prompts all the time
    assert cache.reused_prompts >= 1  # the grown chat took the first one's ids


@functools.cache
def _qwen() -> tuple[Segmenter, list[str]]:  # parsed once: a 7 MB tokenizer.json
    raw = qw.tokenizer_json_bytes()
    return (Segmenter.from_tokenizer_json(raw),
            [e["content"] for e in json.loads(raw)["added_tokens"]])


@pytest.mark.skipif(qw.tokenizer() is None, reason=qw.MISSING)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_qwen_extended_texts_equal_plain_encodes(data: st.DataObject) -> None:
    reference, bpe = qw.tokenizer(), qw.fast_bpe()
    segmenter, added = _qwen()
    piece = st.one_of(st.text(max_size=16), st.text(alphabet="ab \n中<|>", max_size=8),
                      st.sampled_from(added))
    texts = st.lists(piece, max_size=10).map("".join)
    base = data.draw(texts)
    cache = _reusing(bpe, segmenter)
    for _ in range(4):
        text = base[:data.draw(st.integers(0, len(base)))] + data.draw(texts)
        assert cache.encode(text) == _plain(reference, text)
        base = text


# -- a vocabulary built to collide: tokens span one another's starts ---------------------------

_RAW = ["<a>", "<a>b", "bc", "a>b>", "|", "<<", "~", "#", "c#b"]  # segments' test's, and
_NORMALIZED = ["ab", "c<", "b|b", "<a", "~a>"]  # anchors "~", "~a>"; "#" is spanned by "c#b"
_ALPHABET = "abc<>| \n~#"


_TOY = colliding_tokenizer(_RAW, _NORMALIZED, _ALPHABET)
_TOY_SEGMENTER = Segmenter.from_tokenizer_json(_TOY.to_str())
_TOY_SHARED = _reusing(_TOY, _TOY_SEGMENTER, capacity_bytes=4096)
_toy_text = st.lists(
    st.one_of(st.text(alphabet=_ALPHABET, max_size=6), st.sampled_from(_RAW + _NORMALIZED)),
    max_size=12,
).map("".join)


def test_toy_anchors_are_the_tokens_nothing_spans_into() -> None:
    tokens = _RAW + _NORMALIZED
    want = {a for a in tokens
            if not any(t[k:].startswith(a) or a.startswith(t[k:])
                       for t in tokens for k in range(1, len(t)))}
    assert _TOY_SEGMENTER.anchors == want
    assert want == {"~", "~a>"}  # cuts at some tokens only


@settings(max_examples=500, deadline=None)
@given(_toy_text, st.lists(st.tuples(st.integers(min_value=0), _toy_text), max_size=4))
def test_toy_extended_texts_equal_plain_encodes(base: str, steps: list) -> None:
    cache = _reusing(_TOY, _TOY_SEGMENTER)
    text = base
    for cut, tail in [(len(base), ""), *steps]:
        text = text[:cut % (len(text) + 1)] + tail
        want = _plain(_TOY, text)
        assert cache.encode(text) == want
        assert _TOY_SHARED.encode(text) == want


def test_a_long_prompt_is_remembered_and_a_short_one_is_not() -> None:
    cache = SegmentCachedTokenizer(_DS_BPE, _DS_SEGMENTER)  # the default threshold
    chat = [{"role": "system", "content": "You are terse. " * 400},
            {"role": "user", "content": "hi"}]
    first = _TEMPLATE.render(chat, add_generation_prompt=True)
    assert len(first) >= REUSE_MIN_CHARS
    cache.encode(first)
    grown = _TEMPLATE.render([*chat, {"role": "assistant", "content": "hello"},
                              {"role": "user", "content": "more"}], add_generation_prompt=True)
    assert cache.encode(grown) == _plain(_DS_TOKENIZER, grown)
    assert (cache.reused_prompts, cache.recent_prompts) == (1, 1)  # the grown one replaced it
    assert cache.reused_tokens == len(_plain(_DS_TOKENIZER, first)) - 1  # all but <｜Assistant｜>
    short = _TEMPLATE.render([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    cache.encode(short)
    assert cache.recent_prompts == 1


_wide = st.one_of(st.text(alphabet="ab", max_size=2000), st.text(alphabet="ab中🙂", max_size=700))


@settings(max_examples=500, deadline=None)
@given(_wide, _wide, _wide, st.sampled_from(["", "a", "é", "中", "🙂"]))
def test_common_prefix_equals_a_character_loop(shared: str, x: str, y: str, widen: str) -> None:
    a, b = shared + x, shared + y + widen  # mixed widths: ASCII against UCS-2 and UCS-4
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    assert common_prefix(a, b) == common_prefix(b, a) == n
