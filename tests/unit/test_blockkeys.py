"""Cortex's block keys (Cython) against the pure-Python definition (``xxhash`` package)."""

from __future__ import annotations

import json
from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cortex._fast.blockkeys import block_keys, namespace_seed, opaque_key
from tests import reference_ledger as ref


def list_keys(*args, **kwargs) -> list[int]:
    """``block_keys`` as a list (it returns an ``array('Q')``)."""
    keys = block_keys(*args, **kwargs)
    assert keys.typecode == "Q"
    return list(keys)

TOKENS = st.lists(st.integers(min_value=0, max_value=2**32 - 1), max_size=40)
U64 = st.integers(min_value=0, max_value=2**64 - 1)
NAMES = st.none() | st.text(max_size=12)


@given(model=st.text(max_size=12), lora=NAMES, salt=NAMES)
def test_namespace_seed_matches_the_definition(model, lora, salt):
    assert namespace_seed(model, lora, salt) == ref.namespace_seed(model, lora, salt)


@given(tokens=TOKENS, block_size=st.integers(1, 9), seed=U64, parent=st.none() | U64)
def test_block_keys_match_the_definition(tokens, block_size, seed, parent):
    assert list_keys(tokens, block_size, seed, parent) == ref.block_keys(
        tokens, block_size, seed, parent
    )


@given(parent=st.none() | U64, engine_hash=U64, seed=U64)
def test_opaque_key_matches_the_definition(parent, engine_hash, seed):
    assert opaque_key(parent, engine_hash, seed) == ref.opaque_key(parent, engine_hash, seed)


def test_first_block_key_is_plain_xxh3_of_u32le_tokens(hash_examples_path):
    # The shared fixture has XXH3-64(seed 1337) over u32-LE tokens, computed independently:
    # exactly a root block's key, and the unchained key of the second block.
    refs = json.loads(hash_examples_path.read_text())["references"]
    (values,) = [v for name, v in refs.items() if name.startswith("dynamo_style")]
    assert list_keys([1, 2, 3, 4, 5, 6, 7, 8], 4, 1337)[0] == values["block1"]
    assert list_keys([5, 6, 7, 8], 4, 1337) == [values["block2"]]


def test_keys_chain_so_equal_blocks_at_other_positions_differ():
    seed = namespace_seed("m")
    first, second = block_keys([7, 7, 7, 7], 2, seed)
    assert first != second
    assert list_keys([7, 7], 2, seed, parent_key=first) == [second]


def test_the_namespace_seeds_the_root_block_and_the_chain_carries_it():
    salted, plain = namespace_seed("m", None, "salt"), namespace_seed("m")
    root_salted, child_salted = block_keys([1, 2, 3, 4], 2, salted)
    root_plain, child_plain = block_keys([1, 2, 3, 4], 2, plain)
    assert root_salted != root_plain and child_salted != child_plain
    # A chained block needs only its parent's key: the seed passed along is not used.
    assert list_keys([3, 4], 2, plain, parent_key=root_salted) == [child_salted]
    assert opaque_key(root_salted, 9, plain) == opaque_key(root_salted, 9, salted)
    assert opaque_key(None, 9, plain) != opaque_key(None, 9, salted)


def test_trailing_partial_block_is_ignored():
    seed = namespace_seed("m")
    assert list_keys([1, 2, 3, 4, 5], 2, seed) == list_keys([1, 2, 3, 4], 2, seed)
    assert list_keys([1], 2, seed) == []


def test_namespaces_separate_models_loras_and_salts():
    seeds = {
        namespace_seed("m"),
        namespace_seed("m2"),
        namespace_seed("m", "lora"),
        namespace_seed("m", None, "lora"),  # the same text as a salt is another namespace
        namespace_seed("m", ""),
        namespace_seed("m", "lora", "salt"),
    }
    assert len(seeds) == 6
    assert len({block_keys([1, 2], 2, seed)[0] for seed in seeds}) == 6


@pytest.mark.parametrize("bad", [-1, 2**32, 2**64, -(2**40)])
def test_token_ids_outside_u32_raise_value_error(bad):
    with pytest.raises(ValueError):
        block_keys([1, bad, 3, 4], 2, 0)
    with pytest.raises(ValueError):
        block_keys((1, bad, 3, 4), 2, 0)


def test_block_size_must_be_positive():
    with pytest.raises(ValueError):
        block_keys([1, 2], 0, 0)


def test_buffers_and_sequences_give_the_same_keys():
    tokens = [1, 2**31, 2**32 - 1, 0, 5, 6]
    seed = namespace_seed("m")
    want = ref.block_keys(tokens, 3, seed)
    assert list_keys(tokens, 3, seed) == want
    assert list_keys(tuple(tokens), 3, seed) == want
    assert list_keys(array("I", tokens), 3, seed) == want
    assert list_keys(array("q", tokens), 3, seed) == want  # other item type: read as ints


def test_opaque_keys_never_equal_token_keys_of_the_same_parent():
    seed = namespace_seed("m")
    parent = block_keys([1, 2], 2, seed)[0]
    token_keys = {block_keys([a, b], 2, seed, parent)[0] for a in range(20) for b in range(20)}
    assert opaque_key(parent, 5, seed) not in token_keys
    assert opaque_key(None, 5, seed) != opaque_key(None, 6, seed)
