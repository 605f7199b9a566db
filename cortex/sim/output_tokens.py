"""The simulated engines' output tokens: the same text and ids wherever a token is needed.

Pure (no trio). Token ``i`` of every answer is ``OUTPUT_WORDS[i % len(OUTPUT_WORDS)]``, its id
a stand-in stable per word (``1000 + word index``). The HTTP side streams them
(``cortex.sim.generation``); the continuous-batching engine models (``cortex.sim.batching``)
put the same ids into the KV cache, so a cached answer is what a next turn's prompt repeats.
"""

from __future__ import annotations

__all__ = ["OUTPUT_WORDS", "output_token", "output_token_id"]

OUTPUT_WORDS = (" The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog.")


def output_token(index: int) -> tuple[str, int]:
    """Text and id of output token ``index`` (ids are stand-ins, stable per word)."""
    return OUTPUT_WORDS[index % len(OUTPUT_WORDS)], output_token_id(index)


def output_token_id(index: int) -> int:
    """Id of output token ``index``."""
    return 1000 + index % len(OUTPUT_WORDS)
