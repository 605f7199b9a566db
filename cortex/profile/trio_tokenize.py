"""The I/O shell of the segment-cached tokenizer: long new text is encoded in a worker thread.

The BPE (``exact_bpe``: fastokens once its start check passed, ``tokenizers`` until then or
where it failed) releases the GIL while it encodes, and hands back one flat buffer (no Python
int per token), so a worker thread keeps the loop free for all but the hand-back. Here
``lookup`` and ``finish`` (cache access) stay on the trio thread and only ``encode_pieces``
runs through ``trio.to_thread.run_sync``.

Rules: text whose cold part is shorter than the tokenizer's ``offload_min_chars`` (by the BPE in
use: 32,768 characters for fastokens, 2,048 for ``tokenizers``; a non-ASCII piece's
characters counted ``NON_ASCII_CHAR_COST`` (8) times each) is encoded inline — a thread hop
costs tens of microseconds and fastokens encodes that much in ~0.1-0.3 ms
(``perf/bench_agentic_tokenize.py --sections inline``); ``limiter`` bounds the threads used
(trio's default limiter otherwise). Cancellation while a thread encodes waits for it (trio's
default), so the cache never sees half a result. Concurrent requests may encode the same new
piece twice; the cache keeps one copy. A new worker thread's first fastokens encode costs
~15 ms (per-thread state; ``ExactBpe.activate`` pays the loop's own at start).

A pool of tokenizer processes (``server.tokenize_processes``) did this before fastokens; with
it a thread serves as well (``perf/bench_cold.py``: cold 8k-token prompts per second within
10% of one another, small requests' added latency within the noise; perf/RESULTS.md), and the
pool is gone: the setting is accepted and ignored, with a warning.

``upgrade_bpes`` moves each model to fastokens in the background after the start.

``encode_array`` is the whole path. The request path splits it: the tokenizer's compiled
``encode_now`` (synchronous) returns the ids when nothing has to be offloaded — the common
case, with no coroutine, no checkpoint and no Python frame — else the ``Lookup`` that
``encode_offloaded`` finishes in a worker thread.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Mapping

import trio

from cortex.profile.model_profile import ModelProfile
from cortex.tokenize.segment_cache import Lookup, SegmentCachedTokenizer

__all__ = ["Lookup", "encode_array", "encode_offloaded", "upgrade_bpes"]

log = logging.getLogger("cortex.tokenize")


async def upgrade_bpes(profiles: Mapping[str, ModelProfile]) -> None:
    """Move each profile to fastokens where its start check holds (``ExactBpe.upgrade``), one
    model after another in a worker thread (~1-2 s each: the gateway serves meanwhile, through
    ``tokenizers``); each verdict is logged once. The event loop's own first fastokens encode
    (~15 ms: per-thread state) is paid here, once, not by a request."""
    for model, profile in sorted(profiles.items()):
        bpe = profile.bpe
        # not abandoned on cancel: a thread left inside fastokens while the interpreter exits
        # aborts the process (SIGABRT, seen); a shutdown waits for it (~1-2 s at most)
        why_not = await trio.to_thread.run_sync(bpe.upgrade, False)
        if why_not is None:
            warm_s = bpe.activate()
            log.info("model %s: new text is tokenized by fastokens %s (it gave tokenizers' ids "
                     "on all %d texts of the start check; the event loop's first encode took "
                     "%.1f ms)", model, bpe.version, bpe.checked_texts, warm_s * 1e3)
        else:
            log.warning("model %s: new text is tokenized by tokenizers (slower, still exact): "
                        "%s", model, why_not)


async def encode_offloaded(
    tokenizer: SegmentCachedTokenizer,
    lookup: Lookup,
    limiter: trio.CapacityLimiter | None = None,
) -> array[int]:
    """The ids of a ``Lookup`` from ``encode_now``, its cold pieces encoded in a worker
    thread."""
    cold_ids = await trio.to_thread.run_sync(tokenizer.encode_pieces, lookup.cold,
                                             limiter=limiter)
    return tokenizer.finish(lookup, cold_ids)


async def encode_array(
    tokenizer: SegmentCachedTokenizer,
    text: str,
    add_special_tokens: bool = False,
    *,
    offload_min_chars: int | None = None,
    limiter: trio.CapacityLimiter | None = None,
) -> array[int]:
    if offload_min_chars is None:
        offload_min_chars = tokenizer.offload_min_chars
    found = tokenizer.encode_now(text, add_special_tokens, offload_min_chars)
    if isinstance(found, Lookup):
        return await encode_offloaded(tokenizer, found, limiter)
    return found
