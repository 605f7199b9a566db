"""fastokens gives ``tokenizers``' ids, for both tokenizer families of the real-engine work
(DeepSeek-V3's 128k vocabulary: no normalizer, three Split regexes; Qwen2.5's: NFC, one regex,
ChatML added tokens): random mixed-script text (CJK, kana, Hangul, Arabic, Devanagari, combining
marks, control characters, emoji, digit and whitespace runs), added and special tokens inside
it, with and without ``add_special_tokens`` — and ``ExactBpe`` (what the request path calls)
returns the same ids one text at a time and many at once."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import deepseek_profile as ds
from tests import qwen_profile as qw


def _families() -> dict[str, tuple[object, object, list[str]]]:
    out = {}
    for name, module in (("deepseek", ds), ("qwen", qw)):
        reference, raw = module.tokenizer(), module.tokenizer_json_bytes()
        if reference is None or raw is None:
            continue
        added = [entry["content"] for entry in json.loads(raw)["added_tokens"]]
        out[name] = (reference, module.fast_bpe(), added)
    return out


FAMILIES = _families()

_scripts = st.characters(codec="utf-8", categories=["L", "M", "N", "P", "S", "Z", "Cc", "Cf"])
_fragment = st.one_of(
    st.text(_scripts, max_size=24),
    st.text(alphabet="abc XYZ\n\n\t  \r\n'sll", max_size=16),
    st.text(alphabet="中文缓存かなカナ한국어ab\u0301\u0308🙂👩\u200d💻🇫🇷", max_size=16),
    st.text(alphabet="0123456789٣४ .,-", max_size=16),
    st.text(alphabet="\x00\x01\x1f\x7f\x85\u2028\u3000\u00a0\ufeff \n", max_size=8),
    st.text(alphabet="{}[]():;\"'<>|=+-*/#@!?`~_", max_size=12),
)


def _with_tokens(added: list[str]) -> st.SearchStrategy[str]:
    return st.lists(st.one_of(_fragment, st.sampled_from(added)), max_size=8).map("".join)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@settings(max_examples=400, deadline=None)
@given(data=st.data(), special=st.booleans())
def test_fastokens_gives_the_ids_of_tokenizers(family: str, data: st.DataObject,
                                               special: bool) -> None:
    reference, bpe, added = FAMILIES[family]
    text = data.draw(_with_tokens(added))
    want = reference.encode(text, add_special_tokens=special).ids
    fast = bpe._fast  # the library itself, as the start check runs it
    assert fast.encode(text, add_special_tokens=special).ids == want


@pytest.mark.parametrize("family", sorted(FAMILIES))
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_exact_bpe_ids_equal_the_reference_one_and_many(family: str,
                                                        data: st.DataObject) -> None:
    reference, bpe, added = FAMILIES[family]
    texts = data.draw(st.lists(_with_tokens(added), max_size=5))
    want = [reference.encode(text, add_special_tokens=False).ids for text in texts]
    assert [bpe.ids(text).tolist() for text in texts] == want
    assert [ids.tolist() for ids in bpe.ids_many(texts)] == want
    assert bpe.fallbacks == 0


def test_qwen_family_present_or_said_why() -> None:
    if "qwen" not in FAMILIES:
        pytest.skip(qw.MISSING)
