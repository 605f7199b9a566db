"""A request's block keys match the ledger's: same chain, namespace in the root block only."""

from __future__ import annotations

from array import array

from cortex._fast.blockkeys import block_keys, namespace_seed
from cortex.ledger import LedgerBook
from cortex.ledger.kv_events import BlockStored, EngineFamily, EventBatch
from cortex.profile.model_profile import ProfileSpec, load_profile
from cortex.profile.request_keys import prompt_block_keys, prompt_token_ids, request_block_keys
from cortex.prompt.request_text import completions_prompt, generate_prompt
from tests import deepseek_profile as ds


def test_full_blocks_only_with_the_namespace_seed():
    tokens = list(range(100, 140))  # 2 full blocks of 16, 8 left over
    keys = request_block_keys(tokens, 16, "m", "lora", "salt")
    assert keys == block_keys(tokens, 16, namespace_seed("m", "lora", "salt"))
    assert len(keys) == 2
    assert request_block_keys(array("I", tokens), 16, "m", "lora", "salt") == keys
    assert request_block_keys(tokens, 16, "m")[0] != keys[0]
    assert request_block_keys(tokens[:15], 16, "m") == array("Q")


def test_request_keys_hit_what_the_ledger_stored():
    profile = load_profile(ProfileSpec(model="deepseek", tokenizer_path=ds.TOKENIZER_JSON,
                                       block_size=4))
    tokenizer = profile.new_cached_tokenizer()
    prompt = generate_prompt({"text": "The quick brown fox jumps over the lazy dog " * 3,
                              "lora_path": "ad", "cache_salt": "s"})
    ids = prompt_token_ids(prompt, tokenizer).tolist()
    n_blocks = len(ids) // 4
    assert n_blocks >= 3

    book = LedgerBook()
    target = book.register("w", 0, EngineFamily.VLLM, "deepseek")
    engine_hashes = list(range(1, n_blocks + 1))
    first = BlockStored(block_hashes=engine_hashes[:1], parent_hash=None, token_ids=ids[:4],
                        block_size=4, lora_name="ad", cache_salt="s")
    rest = BlockStored(block_hashes=engine_hashes[1:], parent_hash=1,
                       token_ids=ids[4 : 4 * n_blocks], block_size=4, lora_name="ad")
    book.apply(target, EventBatch(ts=0.0, events=(first, rest), dp_rank=0))

    keys = prompt_block_keys(profile, tokenizer, prompt)
    assert book.match(EngineFamily.VLLM, "deepseek", 4, keys) == {target: n_blocks}
    other_salt = generate_prompt({"text": prompt.text, "lora_path": "ad"})
    assert book.match(EngineFamily.VLLM, "deepseek", 4,
                      prompt_block_keys(profile, tokenizer, other_salt)) == {}


def test_token_id_prompts_are_keyed_as_sent():
    profile = load_profile(ProfileSpec(model="m", tokenizer_path=ds.TOKENIZER_JSON,
                                       block_size=2))
    prompt = completions_prompt({"prompt": [5, 6, 7, 8, 9]})
    keys = prompt_block_keys(profile, profile.new_cached_tokenizer(), prompt)
    assert keys == block_keys([5, 6, 7, 8], 2, namespace_seed("m"))
