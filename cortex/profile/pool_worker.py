"""The body of a tokenizer process (``cortex.profile.tokenize_pool``): no trio, no sockets.

A process of the pool calls ``load`` once when it starts (every pooled model's profile, loaded
from the same files as the gateway's own) and then ``encode_cold`` per job: the ids of each
cold piece, through the profile's ``SegmentCachedTokenizer.encode_pieces`` one by one (the
ASCII fast path where it applies, else ``Tokenizer.encode``). Holding this process's GIL
is harmless: nothing else runs here.

Rules:

* The results are ``array('I')``: they pickle as one bytes copy each, so the gateway's event
  loop unpickles a 32k-token answer in microseconds (a list of ints would cost ~1 ms there).
* Exact or nothing: a job names the model and the fingerprint of the gateway's profile
  (tokenizer, template, block size, BOS); a process whose profile of that model is missing
  or differs — its files changed on disk before a replaced process loaded them — answers
  ``None`` and the caller (the pool) falls back to a worker thread. ``load`` skips a profile
  that does not load (the gateway's own load already reported why).
* Module state (``_TOKENIZERS``) exists only in pool processes; the gateway never calls
  ``load``.
"""

from __future__ import annotations

import os
import signal
from array import array
from collections.abc import Sequence

from cortex.profile.model_profile import ProfileError, ProfileSpec, load_profile
from cortex.profile.segment_cache import SegmentCachedTokenizer

__all__ = ["encode_cold", "load", "loaded_models"]

_TOKENIZERS: dict[str, tuple[str, SegmentCachedTokenizer]] = {}  # model -> (fingerprint, ...)


def load(specs: Sequence[ProfileSpec], nice: int = 0) -> None:
    """Load every profile of ``specs`` (``init`` of a pool process); ``nice`` lowers this
    process's CPU priority so that the gateway's event loop wins a contended core."""
    if nice:
        os.nice(nice)
    for signum in (signal.SIGINT, signal.SIGTERM):  # the gateway ends this process, not they
        signal.signal(signum, signal.SIG_IGN)
    for spec in specs:
        try:
            profile = load_profile(spec)
        except ProfileError:
            continue
        _TOKENIZERS[spec.model] = (profile.fingerprint, profile.new_cached_tokenizer(0))


def loaded_models() -> dict[str, str]:
    """The models this process can encode, with their profiles' fingerprints (the pool's
    warm-up job)."""
    return {model: fingerprint for model, (fingerprint, _) in _TOKENIZERS.items()}


def encode_cold(model: str, fingerprint: str, pieces: list[str]) -> list[array[int]] | None:
    """The ids of each piece of ``pieces``; ``None`` when this process has no profile of
    ``model`` with that ``fingerprint``."""
    loaded = _TOKENIZERS.get(model)
    if loaded is None or loaded[0] != fingerprint:
        return None
    return [array("I", ids) for ids in loaded[1].encode_pieces(pieces, batch=False)]
