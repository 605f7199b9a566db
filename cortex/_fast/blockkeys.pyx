# cython: language_level=3
"""Cortex's own chained block keys (Python API over the C-level functions of ``blockkeys.pxd``).

Definition and contract: ``blockkeys.pyi``. The request path calls ``block_keys`` once per
prompt; the ledger computes the same keys in C from the events' token ids.
"""

from cpython.array cimport array, clone
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport uint8_t, uint32_t, uint64_t

from cortex._fast.blockkeys cimport (
    XXH3_64bits_withSeed,
    key_scratch_bytes,
    opaque_block_key,
    token_block_key,
)
from cortex._fast.pyints cimport copy_tokens

_NAMESPACE_TAG = b"cortex-ns-v1"
cdef array _KEYS_TEMPLATE = array("Q")
assert _KEYS_TEMPLATE.itemsize == 8


cdef bytes _part(object text):
    if text is None:
        return b"\x00"
    cdef bytes encoded = (<str?>text).encode("utf-8")
    return b"\x01" + len(encoded).to_bytes(4, "little") + encoded


def namespace_seed(model, lora_name=None, cache_salt=None):
    """Seed of every key of one namespace: (model, LoRA name, cache salt)."""
    cdef bytes data = _NAMESPACE_TAG + _part(model) + _part(lora_name) + _part(cache_salt)
    cdef const unsigned char* raw = data
    return XXH3_64bits_withSeed(raw, len(data), 0)


def block_keys(token_ids, Py_ssize_t block_size, uint64_t seed, parent_key=None,
               Py_ssize_t max_tokens=-1):
    """Chained keys of the full blocks of ``token_ids`` (a trailing partial block is ignored),
    as an ``array('Q')``: the form ``BlockTree.match`` reads without converting each key.
    ``max_tokens`` >= 0 keys only the full blocks of the first ``max_tokens`` ids."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    cdef Py_ssize_t n_ids = len(token_ids)
    if 0 <= max_tokens < n_ids:
        n_ids = max_tokens
    cdef Py_ssize_t n_blocks = n_ids // block_size
    cdef Py_ssize_t n_tokens = n_blocks * block_size
    cdef bint has_parent = parent_key is not None
    cdef uint64_t key = <uint64_t>parent_key if has_parent else 0
    cdef array keys = clone(_KEYS_TEMPLATE, n_blocks, False)
    # array('Q') stores unsigned long long (8 bytes, asserted above); uint64_t may be another
    # C type of the same width (unsigned long on LP64 Linux), so the pointer keeps the array's.
    cdef unsigned long long* out = keys.data.as_ulonglongs
    if n_blocks == 0:
        return keys
    # an array('I') (what the tokenizer hands out) is read in place; anything else is copied
    # (and checked) first. Copying a 37k-id prompt cost a 150 KB allocation per request.
    cdef bint in_place = type(token_ids) is array and (<array>token_ids).ob_descr.typecode == b"I"
    cdef uint32_t* tokens = (<uint32_t*>(<array>token_ids).data.as_uints if in_place
                             else <uint32_t*>PyMem_Malloc(4 * <size_t>n_tokens))
    cdef uint8_t* scratch = <uint8_t*>PyMem_Malloc(key_scratch_bytes(block_size))
    cdef Py_ssize_t i
    try:
        if tokens == NULL or scratch == NULL:
            raise MemoryError()
        if not in_place:
            copy_tokens(token_ids, tokens, n_tokens)
        for i in range(n_blocks):
            key = token_block_key(has_parent, key, tokens + i * block_size, block_size, seed,
                                  scratch)
            has_parent = True
            out[i] = key
    finally:
        if not in_place:
            PyMem_Free(tokens)
        PyMem_Free(scratch)
    return keys


def opaque_key(parent_key, uint64_t engine_hash, uint64_t seed):
    """Key of a block whose inputs Cortex cannot reproduce (multimodal, prompt embeddings)."""
    cdef uint8_t scratch[32]
    cdef bint has_parent = parent_key is not None
    cdef uint64_t parent = <uint64_t>parent_key if has_parent else 0
    return opaque_block_key(has_parent, parent, engine_hash, seed, scratch)
