"""``line_cuts`` in the segment cache: a message that grows between turns pays for its new text
and at most one chunk (it was re-encoded whole before), exactly, with both tokenizer families;
loaded profiles carry an enabled cutter."""

from __future__ import annotations

import random

import pytest

from cortex.profile.model_profile import ProfileSpec, load_profile
from cortex.tokenize.line_cuts import CHUNK_CHARS, LineCutter
from cortex.tokenize.segment_cache import SegmentCachedTokenizer
from cortex.tokenize.segments import Segmenter
from tests import deepseek_profile as ds
from tests import qwen_profile as qw


def _families():
    out = [("deepseek", ds.tokenizer(), ds.tokenizer_json_bytes())]
    if qw.tokenizer() is not None:
        out.append(("qwen", qw.tokenizer(), qw.tokenizer_json_bytes()))
    return out


def _lines(rng: random.Random, count: int) -> str:
    words = ["def", "return", "x = 1", "中文文本", "缓存命中率", "🙂", "    if a:", "}", "# note",
             "naïve", "2048", "JSON", "  ", "\t"]
    return "\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(1, 8)))
                     for _ in range(count))


@pytest.mark.parametrize(("family", "tokenizer", "raw"), _families())
def test_a_grown_message_pays_for_its_new_text_and_one_chunk(family, tokenizer, raw) -> None:
    rng = random.Random(5)
    segmenter = Segmenter.from_tokenizer_json(raw)
    cutter = LineCutter(tokenizer, segmenter)
    assert cutter.enabled, cutter.why_not_cutting
    with_cuts = SegmentCachedTokenizer(tokenizer, segmenter, cutter=cutter)
    without = SegmentCachedTokenizer(tokenizer, segmenter)
    base, more = _lines(rng, 3000), "\n" + _lines(rng, 100)
    for cache in (with_cuts, without):
        cache.encode(base)
    longest_line = max(len(line) for line in (base + more).split("\n")) + 1
    cold = with_cuts.lookup(base + more).cold
    assert sum(map(len, cold)) <= len(more) + CHUNK_CHARS + 2 * longest_line
    assert sum(map(len, without.lookup(base + more).cold)) == len(base + more)  # the cliff
    expected = tokenizer.encode(base + more, add_special_tokens=False).ids
    assert with_cuts.encode(base + more) == expected
    assert with_cuts.encode_now(base + more, False, 1 << 30).tolist() == expected


def test_loaded_profiles_cut_lines() -> None:
    profile = load_profile(ProfileSpec("deepseek", None, 16, builtin="deepseek"))
    assert profile.line_cuts is not None and profile.line_cuts.enabled
    if qw.tokenizer() is not None:
        qwen = load_profile(ProfileSpec("qwen", str(qw.MODEL_DIR), 16))
        assert qwen.line_cuts is not None and qwen.line_cuts.enabled, qwen.line_cuts


def test_a_profile_says_which_shortcut_is_off_and_why() -> None:
    profile = load_profile(ProfileSpec("deepseek", None, 16, builtin="deepseek"))
    assert profile.tokenization_notes() == []
    tokenizer = ds.tokenizer()
    from tokenizers import Tokenizer, normalizers

    lowered = Tokenizer.from_str(tokenizer.to_str())
    lowered.normalizer = normalizers.Lowercase()
    segmenter = Segmenter.from_tokenizer_json(ds.tokenizer_json_bytes())
    import dataclasses

    off = dataclasses.replace(profile, line_cuts=LineCutter(lowered, segmenter))
    assert off.tokenization_notes() == [
        "line cuts of long pieces off: normalizer Lowercase is not modelled"]
