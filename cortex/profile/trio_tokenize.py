"""The I/O shell of the segment-cached tokenizer: cold pieces are encoded in a worker thread.

A cold 4k-token prompt costs ~8 ms of tokenizer work; run on the trio thread it stalls every
other request for that long. Here ``lookup`` and ``finish`` (cache access) stay on the trio
thread and only ``encode_pieces`` runs through ``trio.to_thread.run_sync``, with
``encode_batch``: it releases the GIL while it works (a single ``encode`` holds it for the whole
encode, so offloading that would not help). ``perf/bench_tokenize.py`` measures the event
loop's longest stall both ways (``loop_stall``): about half, not zero — the GIL handoff at the
end of the batch still waits for the interpreter's switch interval (5 ms).

Rules: text whose cold part is shorter than ``offload_min_chars`` is encoded inline (a thread
hop costs tens of microseconds), a non-ASCII piece's characters counted ``NON_ASCII_CHAR_COST``
(4) times each: just under the threshold the loop is held ~0.3–0.5 ms by English, code or JSON
and ~0.85 ms by Chinese (2.2 ms when its characters counted once;
``perf/bench_agentic_tokenize.py --sections inline``); ``limiter`` bounds the threads used
(trio's default limiter otherwise). Cancellation while a thread encodes waits for it (trio's default), so the cache
never sees half a result. Concurrent requests may encode the same new piece twice; the cache
keeps one copy.

With a tokenize pool (``cortex.profile.tokenize_pool``, ``server.tokenize_processes`` > 0) the
cold pieces go to one of its processes instead, and to a thread only when the pool cannot take
them: a thread keeps the loop waiting for the GIL (above), a process does not. Through the
gateway (``perf/bench_cold.py``) small requests' p90 rose by 1.5–6 ms while a thread tokenized
cold 32k-token prompts, by 0.1–2.5 ms with one pool process (up to 3.8 ms with two on two
busy cores: perf/RESULTS.md); and ``encode_batch`` skips the ASCII fast path (32k tokens of
English: 556 ms in a thread, 39–49 ms in a pool process).

``encode_array`` is the whole path. The request path splits it: the tokenizer's compiled
``encode_now`` (synchronous) returns the ids when nothing has to be offloaded — the common
case, with no coroutine, no checkpoint and no Python frame — else the ``Lookup`` that
``encode_offloaded`` finishes in a worker thread.
"""

from __future__ import annotations

from array import array

import trio

from cortex.profile.segment_cache import OFFLOAD_MIN_CHARS, Lookup, SegmentCachedTokenizer
from cortex.profile.tokenize_pool import TokenizePool

__all__ = ["OFFLOAD_MIN_CHARS", "Lookup", "encode_array", "encode_offloaded"]


async def encode_offloaded(
    tokenizer: SegmentCachedTokenizer,
    lookup: Lookup,
    limiter: trio.CapacityLimiter | None = None,
    pool: TokenizePool | None = None,
    model: str = "",
) -> array[int]:
    """The ids of a ``Lookup`` from ``encode_now``, its cold pieces encoded by ``pool`` (as
    ``model``) when given and able, else in a worker thread."""
    cold_ids = None if pool is None else await pool.encode(model, lookup.cold)
    if cold_ids is None:
        cold_ids = await trio.to_thread.run_sync(
            tokenizer.encode_pieces, lookup.cold, True, limiter=limiter
        )
    return tokenizer.finish(lookup, cold_ids)


async def encode_array(
    tokenizer: SegmentCachedTokenizer,
    text: str,
    add_special_tokens: bool = False,
    *,
    offload_min_chars: int = OFFLOAD_MIN_CHARS,
    limiter: trio.CapacityLimiter | None = None,
    pool: TokenizePool | None = None,
    model: str = "",
) -> array[int]:
    found = tokenizer.encode_now(text, add_special_tokens, offload_min_chars)
    if isinstance(found, Lookup):
        return await encode_offloaded(tokenizer, found, limiter, pool, model)
    return found
