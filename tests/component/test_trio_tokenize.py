"""trio_tokenize: the same ids as the synchronous path, inline or through a worker thread,
and concurrent requests sharing new pieces leave one consistent cache."""

from __future__ import annotations

import trio

from cortex.profile import trio_tokenize
from cortex.tokenize.segment_cache import (
    ENTRY_OVERHEAD_BYTES,
    NON_ASCII_CHAR_COST,
    OFFLOAD_MIN_CHARS,
    SegmentCachedTokenizer,
)
from cortex.tokenize.segments import Segmenter
from tests import deepseek_profile as ds

TOK = ds.tokenizer()
SEG = Segmenter.from_tokenizer_json(ds.tokenizer_json_bytes())
LONG = "Tokenization is the dominant cost of the request path. " * 60
TEXT = f"{ds.BOS}{LONG}<｜User｜>short question<｜Assistant｜>"


def plain(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False).ids


async def test_offloaded_and_inline_paths_give_the_plain_ids():
    for min_chars in (0, 10**9):
        cache = SegmentCachedTokenizer(TOK, SEG, bos_id=0)
        ids = await trio_tokenize.encode_array(cache, TEXT, offload_min_chars=min_chars)
        assert ids.tolist() == plain(TEXT)
        assert cache.misses == 2
        again = await trio_tokenize.encode_array(cache, TEXT, True, offload_min_chars=min_chars)
        assert again.tolist() == [0, *plain(TEXT)]
        assert cache.hits == 2 and cache.misses == 2


async def test_concurrent_requests_keep_one_copy_of_a_shared_piece():
    cache = SegmentCachedTokenizer(TOK, SEG)
    results: list[list[int]] = []

    async def one(suffix: str) -> None:
        ids = await trio_tokenize.encode_array(cache, TEXT + suffix, offload_min_chars=0)
        results.append(ids.tolist())

    async with trio.open_nursery() as nursery:
        for suffix in ("a", "b", "c"):
            nursery.start_soon(one, suffix)
    assert sorted(results) == sorted(plain(TEXT + s) for s in ("a", "b", "c"))
    expected_bytes = sum(
        len(p.encode()) + 4 * len(plain(p)) + ENTRY_OVERHEAD_BYTES
        for p in {LONG, "short question", "a", "b", "c"}
    )
    assert cache.cached_pieces == 5 and cache.cached_bytes == expected_bytes


async def test_encode_now_hands_a_long_new_text_to_a_worker_thread_without_counting_twice():
    cache = SegmentCachedTokenizer(TOK, SEG)
    found = cache.encode_now(TEXT, False, len(LONG))
    assert isinstance(found, trio_tokenize.Lookup) and LONG in found.cold
    ids = await trio_tokenize.encode_offloaded(cache, found)
    assert ids.tolist() == plain(TEXT) and cache.misses == 2 and cache.hits == 0
    inline = cache.encode_now(TEXT + "!", False, len(LONG))
    assert inline.tolist() == plain(TEXT + "!")  # only the "!" after <｜Assistant｜> is new
    assert cache.hits == 2 and cache.misses == 3


def test_a_non_ascii_character_weighs_more_toward_the_offload_threshold():
    """Chinese costs a BPE several times what ASCII does per character: 300 new Chinese
    characters go to a worker under a 2,048-character threshold (tokenizers'), 300 ASCII ones
    stay inline; under fastokens' threshold 4,100 Chinese characters do, 4,100 ASCII ones not."""
    for bpe, chars in ((TOK, 300), (ds.fast_bpe(), 4100)):
        chinese = ("分词是请求路径中最主要的开销" * 300)[:chars]  # no line to cut at
        english = ("Tokenization costs" * 300)[:chars]
        for text, offloaded in ((chinese, True), (english, False), ("中文" * 2, False)):
            cache = SegmentCachedTokenizer(bpe, SEG)
            threshold = cache.offload_min_chars
            assert chars * NON_ASCII_CHAR_COST >= threshold > chars
            found = cache.encode_now(f"{ds.BOS}{text}<｜Assistant｜>", False, threshold)
            assert isinstance(found, trio_tokenize.Lookup) is offloaded, text[:8]
    assert OFFLOAD_MIN_CHARS == {"fastokens": 32_768, "tokenizers": 2_048}
