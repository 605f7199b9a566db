"""A request's block keys: the ledger's chained keys over the prompt's reusable full blocks.

Same function and namespace as the ledger (``cortex._fast.blockkeys``): the namespace seed of
(model, LoRA name, cache salt) seeds the root block only, later blocks chain from their parent.
Only full blocks are keyed — a trailing partial block is never cached by an engine. So for the
same tokens in the same namespace, a request's keys equal the keys the ledger stored.

Which blocks an engine can reuse (``reusable_tokens``): never the one holding the prompt's last
token — the engine must compute that token to get the first output's logits. vLLM caps a hit at
``num_tokens - 1`` tokens (``KVCacheManager.get_computed_blocks``), SGLang matches at most
``len - 1`` tokens (``Req.init_next_round_input``), both then rounded down to whole blocks
(pages). So a prompt of ``n`` tokens can be served at most ``(n - 1) // B`` cached blocks, and
its keys stop there: a block-aligned prompt's last block is not keyed (it could never count).

Namespace seeds are memoized (bounded: reset when full), since a model sees few (lora, salt)
pairs and the seed costs a hash per call.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from cortex._fast.blockkeys import block_keys, namespace_seed
from cortex.profile.model_profile import ModelProfile
from cortex.prompt.request_text import RequestPrompt
from cortex.tokenize.segment_cache import SegmentCachedTokenizer

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


def reusable_tokens(token_count: int, cache_limit: int | None = None) -> int:
    """How many leading prompt tokens an engine may serve from its cache (then rounded down to
    whole blocks by keying full blocks only): all but the last, and no more than the request's
    own ``cache_limit`` (``request_text``: prompt logprobs)."""
    reusable = token_count - 1 if token_count > 0 else 0
    return reusable if cache_limit is None or cache_limit >= reusable else cache_limit


def request_block_keys(
    token_ids: Sequence[int],
    block_size: int,
    model: str,
    lora_name: str | None = None,
    cache_salt: str | None = None,
    max_tokens: int = -1,
) -> array[int]:
    """``array('Q')`` of the keys of the full blocks of ``token_ids`` (``array('I')`` is
    read fastest); with ``max_tokens`` >= 0, of the first ``max_tokens`` ids only."""
    return block_keys(token_ids, block_size, request_seed(model, lora_name, cache_salt), None,
                      max_tokens)


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
