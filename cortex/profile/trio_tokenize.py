"""The I/O shell of the segment-cached tokenizer: cold pieces are encoded in a worker thread.

A cold 4k-token prompt costs ~8 ms of tokenizer work; run on the trio thread it stalls every
other request for that long. Here ``lookup`` and ``finish`` (cache access) stay on the trio
thread and only ``encode_pieces`` runs through ``trio.to_thread.run_sync``, with
``encode_batch``: it releases the GIL while it works (a single ``encode`` holds it for the whole
encode, so offloading that would not help). ``perf/bench_tokenize.py`` measures the event
loop's longest stall both ways (``loop_stall``): about half, not zero — the GIL handoff at the
end of the batch still waits for the interpreter's switch interval (5 ms).

Rules: text whose cold part is shorter than ``offload_min_chars`` is encoded inline (a thread
hop costs tens of microseconds); ``limiter`` bounds the threads used (trio's default limiter
otherwise). Cancellation while a thread encodes waits for it (trio's default), so the cache
never sees half a result. Concurrent requests may encode the same new piece twice; the cache
keeps one copy.
"""

from __future__ import annotations

from array import array

import trio

from cortex.profile.segment_cache import SegmentCachedTokenizer

OFFLOAD_MIN_CHARS = 2048  # ~500 tokens, ~1 ms of tokenizer work


async def encode_array(
    tokenizer: SegmentCachedTokenizer,
    text: str,
    add_special_tokens: bool = False,
    *,
    offload_min_chars: int = OFFLOAD_MIN_CHARS,
    limiter: trio.CapacityLimiter | None = None,
) -> array[int]:
    lookup = tokenizer.lookup(text, add_special_tokens)
    if not lookup.cold:
        return tokenizer.finish(lookup, [])
    if sum(len(p) for p in lookup.cold) < offload_min_chars:
        return tokenizer.finish(lookup, tokenizer.encode_pieces(lookup.cold))
    cold_ids = await trio.to_thread.run_sync(
        tokenizer.encode_pieces, lookup.cold, True, limiter=limiter
    )
    return tokenizer.finish(lookup, cold_ids)
