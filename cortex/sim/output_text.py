"""The text a simulated engine generates: deterministic words with stand-in token ids.

Pure. Output token ``i`` of every request is ``OUTPUT_WORDS[i % len(OUTPUT_WORDS)]``; its id is
a stand-in stable per word (``1000 + word index``). The HTTP side streams these words, and the
batching models (``cortex.sim.batching``) append these ids to a request's KV, so the blocks
they cache from decoded tokens hold what the request emitted.
"""

from __future__ import annotations

__all__ = ["OUTPUT_WORDS", "output_token", "output_token_id"]

OUTPUT_WORDS = (" The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog.")
FIRST_OUTPUT_TOKEN_ID = 1000


def output_token(index: int) -> tuple[str, int]:
    """Text and id of output token ``index`` (ids are stand-ins, stable per word)."""
    word = index % len(OUTPUT_WORDS)
    return OUTPUT_WORDS[word], FIRST_OUTPUT_TOKEN_ID + word


def output_token_id(index: int) -> int:
    """Id of output token ``index``."""
    return FIRST_OUTPUT_TOKEN_ID + index % len(OUTPUT_WORDS)
