"""A request's block keys: the ledger's chained keys over the prompt's full blocks.

Same function and namespace as the ledger (``cortex._fast.blockkeys``): the namespace seed of
(model, LoRA name, cache salt) seeds the root block only, later blocks chain from their parent.
Only full blocks are keyed — a trailing partial block is never cached by an engine. So for the
same tokens in the same namespace, a request's keys equal the keys the ledger stored.

Namespace seeds are memoized (bounded: reset when full), since a model sees few (lora, salt)
pairs and the seed costs a hash per call.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from cortex._fast.blockkeys import block_keys, namespace_seed
from cortex.profile.model_profile import ModelProfile
from cortex.profile.request_text import RequestPrompt
from cortex.profile.segment_cache import SegmentCachedTokenizer

_SEED_CACHE_LIMIT = 4096
_seeds: dict[tuple[str, str | None, str | None], int] = {}


def request_seed(model: str, lora_name: str | None, cache_salt: str | None) -> int:
    key = (model, lora_name, cache_salt)
    seed = _seeds.get(key)
    if seed is None:
        if len(_seeds) >= _SEED_CACHE_LIMIT:
            _seeds.clear()
        seed = _seeds[key] = namespace_seed(model, lora_name, cache_salt)
    return seed


def request_block_keys(
    token_ids: Sequence[int],
    block_size: int,
    model: str,
    lora_name: str | None = None,
    cache_salt: str | None = None,
) -> array[int]:
    """``array('Q')`` of the keys of the full blocks of ``token_ids`` (``array('I')`` is
    read fastest)."""
    return block_keys(token_ids, block_size, request_seed(model, lora_name, cache_salt))


def prompt_token_ids(prompt: RequestPrompt, tokenizer: SegmentCachedTokenizer) -> array[int]:
    """The prompt's token ids as ``array('I')``: the client's ids as sent, or the text through
    the segment-cached tokenizer (BOS per profile when special tokens are asked for)."""
    if prompt.token_ids is not None:
        return array("I", prompt.token_ids)
    return tokenizer.encode_array(prompt.text or "", prompt.add_special_tokens)


def prompt_block_keys(
    profile: ModelProfile, tokenizer: SegmentCachedTokenizer, prompt: RequestPrompt
) -> array[int]:
    return request_block_keys(
        prompt_token_ids(prompt, tokenizer),
        profile.block_size,
        profile.model,
        prompt.lora_name,
        prompt.cache_salt,
    )
