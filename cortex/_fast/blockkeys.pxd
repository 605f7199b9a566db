# cython: language_level=3
"""C-level block keys, shared by ``blockkeys.pyx`` (Python API) and ``ledger.pyx`` (store path).

Both units ``cimport`` these inline functions, so the ledger and the request path compute
bit-identical keys. Definition (normative, see ``blockkeys.pyi``): the namespace seed enters at
the root block only; a chained block's namespace is carried by its parent's key.

    key(block 0)  = XXH3_64(u32le(t) for t in block tokens, seed=ns)
    key(block i)  = XXH3_64(u64le(key(block i-1)) + u32le(t) for t in block tokens, seed=0)
    opaque_key(None, engine_hash, ns)   = XXH3_64(OPAQUE + u64le(0) + u64le(engine_hash), seed=ns)
    opaque_key(parent, engine_hash, ns) = XXH3_64(OPAQUE + u64le(parent) + u64le(engine_hash), seed=0)
    with OPAQUE = b"cortex-opaque\\x00"

Scratch contract: ``scratch`` must hold at least ``key_scratch_bytes(block_size)`` bytes; the
functions write the hashed input there (explicit little-endian bytes, so keys do not depend on
the host's byte order).
"""

from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy

cdef extern from "xxhash.h" nogil:
    ctypedef uint64_t XXH64_hash_t
    XXH64_hash_t XXH3_64bits_withSeed(const void* data, size_t length, XXH64_hash_t seed)

# Length of the opaque key input: 14-byte tag + parent + engine hash. Never a multiple of 4, so it
# can never equal the input of a token block (4 * n or 8 + 4 * n bytes).
cdef enum:
    OPAQUE_INPUT_BYTES = 30


cdef inline void put_u32le(uint8_t* out, uint32_t value) noexcept nogil:
    out[0] = <uint8_t>(value & 0xFF)
    out[1] = <uint8_t>((value >> 8) & 0xFF)
    out[2] = <uint8_t>((value >> 16) & 0xFF)
    out[3] = <uint8_t>((value >> 24) & 0xFF)


cdef inline void put_u64le(uint8_t* out, uint64_t value) noexcept nogil:
    put_u32le(out, <uint32_t>(value & 0xFFFFFFFFu))
    put_u32le(out + 4, <uint32_t>(value >> 32))


cdef inline size_t key_scratch_bytes(Py_ssize_t block_size) noexcept nogil:
    """Scratch bytes the key functions need for blocks of ``block_size`` tokens."""
    cdef size_t token_bytes = 8 + 4 * <size_t>block_size
    return token_bytes if token_bytes > OPAQUE_INPUT_BYTES else OPAQUE_INPUT_BYTES


cdef inline uint64_t token_block_key(
    bint has_parent,
    uint64_t parent_key,
    const uint32_t* tokens,
    Py_ssize_t block_size,
    uint64_t seed,
    uint8_t* scratch,
) noexcept nogil:
    """Key of one full block of ``block_size`` tokens: a root block in namespace ``seed``, or
    a block chained from ``parent_key`` (``seed`` unused)."""
    cdef size_t offset = 0
    cdef Py_ssize_t j
    if has_parent:
        put_u64le(scratch, parent_key)
        offset = 8
        seed = 0
    for j in range(block_size):
        put_u32le(scratch + offset + 4 * j, tokens[j])
    return XXH3_64bits_withSeed(scratch, offset + 4 * <size_t>block_size, seed)


cdef inline uint64_t opaque_block_key(
    bint has_parent, uint64_t parent_key, uint64_t engine_hash, uint64_t seed, uint8_t* scratch
) noexcept nogil:
    """Key of a block Cortex cannot reproduce from tokens (never equals a token block's key);
    ``seed`` is used for a root block only, like ``token_block_key``."""
    memcpy(scratch, b"cortex-opaque\x00", 14)
    put_u64le(scratch + 14, parent_key if has_parent else 0)
    put_u64le(scratch + 22, engine_hash)
    return XXH3_64bits_withSeed(scratch, OPAQUE_INPUT_BYTES, 0 if has_parent else seed)
