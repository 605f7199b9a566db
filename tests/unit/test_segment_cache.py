"""SegmentCachedTokenizer: LRU bounded by bytes, counters, BOS, the batched cold path."""

from __future__ import annotations

from array import array

import pytest

from cortex.tokenize.segment_cache import ENTRY_OVERHEAD_BYTES, SegmentCachedTokenizer
from cortex.tokenize.segments import Segmenter
from tests import deepseek_profile as ds

TOK = ds.tokenizer()
SEG = Segmenter.from_tokenizer_json(ds.tokenizer_json_bytes())
U, A = "<｜User｜>", "<｜Assistant｜>"


def plain(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False).ids


def cost(piece: str) -> int:
    return len(piece.encode()) + 4 * len(plain(piece)) + ENTRY_OVERHEAD_BYTES


def test_second_turn_pays_only_for_the_new_message():
    cache = SegmentCachedTokenizer(TOK, SEG)
    first = f"{ds.BOS}You are terse.{U}Hello there{A}"
    assert cache.encode(first) == plain(first)
    assert (cache.hits, cache.misses) == (0, 2)
    second = first + f"Hi!{ds.EOS}{U}How are you?{A}"
    assert cache.encode(second) == plain(second)
    assert (cache.hits, cache.misses) == (2, 4)
    assert cache.hit_tokens == len(plain("You are terse.")) + len(plain("Hello there"))
    assert cache.miss_tokens == sum(
        len(plain(p)) for p in ["You are terse.", "Hello there", "Hi!", "How are you?"]
    )


def test_lru_is_bounded_by_bytes_and_evicts_the_least_recent():
    budget = cost("alpha") + cost("beta") + cost("gamma") - 1  # room for two of the three
    cache = SegmentCachedTokenizer(TOK, SEG, capacity_bytes=budget)
    cache.encode(f"alpha{U}beta")
    assert cache.cached_pieces == 2 and cache.cached_bytes == cost("alpha") + cost("beta")
    cache.encode("alpha")  # alpha becomes most recent
    cache.encode("gamma")  # evicts beta
    assert cache.cached_bytes == cost("alpha") + cost("gamma")
    misses = cache.misses
    cache.encode("alpha")
    assert cache.misses == misses
    cache.encode("beta")
    assert cache.misses == misses + 1


def test_piece_larger_than_the_budget_is_encoded_not_kept():
    cache = SegmentCachedTokenizer(TOK, SEG, capacity_bytes=10)
    assert cache.encode("a long piece of text") == plain("a long piece of text")
    assert cache.cached_pieces == 0 and cache.cached_bytes == 0
    with pytest.raises(ValueError):
        SegmentCachedTokenizer(TOK, SEG, capacity_bytes=-1)


def test_bos_only_when_special_tokens_are_asked_for():
    cache = SegmentCachedTokenizer(TOK, SEG, bos_id=0)
    assert cache.encode("hi", add_special_tokens=True) == [0, *plain("hi")]
    assert cache.encode("hi") == plain("hi")
    assert SegmentCachedTokenizer(TOK, SEG).encode("hi", add_special_tokens=True) == plain("hi")


def test_cold_pieces_are_encoded_once_each_in_one_call():
    text = f"one{U}two{A}one{U}three"
    batched = SegmentCachedTokenizer(TOK, SEG)
    ids = batched.encode_array(text)
    assert isinstance(ids, array) and ids.typecode == "I"
    assert ids.tolist() == plain(text)
    assert batched.misses == 3  # "one" encoded once
    assert batched.encode(text) == plain(text)
    assert batched.misses == 3 and batched.hits == 4
