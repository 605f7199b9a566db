# cython: language_level=3
"""Decode a msgpack array of unsigned 32-bit ints straight into ``array('I')``.

The event decoder's hot spot: a BlockStored of 32 blocks of 16 tokens carries 512 token ids,
and materialising them as Python ints costs more than everything else in decoding. This unit
reads the raw msgpack bytes of the array (``msgspec.Raw``) and writes the values into a
compact ``array('I')`` that the ledger reads without conversion.

Accepted: an array header (fixarray, array16, array32) followed by exactly that many integers,
each in [0, 2**32), in any msgpack integer encoding (fixint, uint8..64, int8..64), and nothing
after the last one. Anything else raises ``ValueError`` (the caller falls back to its generic,
fully checked path).
"""

from cpython.array cimport array, clone
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t

cdef array _TEMPLATE = array("I")
assert _TEMPLATE.itemsize == 4


cdef inline uint64_t _be(const uint8_t* p, int width) noexcept nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(width):
        v = (v << 8) | p[i]
    return v


def unpack_u32_array(const uint8_t[::1] raw not None) -> array:
    cdef Py_ssize_t n = raw.shape[0]
    cdef Py_ssize_t pos, count, i
    cdef const uint8_t* p = &raw[0] if n > 0 else NULL
    cdef uint8_t b
    cdef uint64_t u
    cdef int64_t s
    cdef int width
    if n == 0:
        raise ValueError("empty input")
    b = p[0]
    if 0x90 <= b <= 0x9F:
        count, pos = b & 0x0F, 1
    elif b == 0xDC and n >= 3:
        count, pos = <Py_ssize_t>_be(p + 1, 2), 3
    elif b == 0xDD and n >= 5:
        count, pos = <Py_ssize_t>_be(p + 1, 4), 5
    else:
        raise ValueError("not a msgpack array")
    if count > n - pos:  # every element takes at least one byte
        raise ValueError("array longer than its bytes")
    cdef array out = clone(_TEMPLATE, count, False)
    cdef uint32_t* dst = out.data.as_uints
    for i in range(count):
        if pos >= n:
            raise ValueError("truncated")
        b = p[pos]
        # The common encodings of token ids first, with fixed widths the compiler can inline.
        if b <= 0x7F:
            dst[i] = b
            pos += 1
            continue
        if b == 0xCE and pos + 5 <= n:
            dst[i] = ((<uint32_t>p[pos + 1] << 24) | (<uint32_t>p[pos + 2] << 16)
                      | (<uint32_t>p[pos + 3] << 8) | p[pos + 4])
            pos += 5
            continue
        if b == 0xCD and pos + 3 <= n:
            dst[i] = (<uint32_t>p[pos + 1] << 8) | p[pos + 2]
            pos += 3
            continue
        if b == 0xCC and pos + 2 <= n:
            dst[i] = p[pos + 1]
            pos += 2
            continue
        if 0xCC <= b <= 0xCF:  # uint8/16/32/64
            width = 1 << (b - 0xCC)
            if pos + 1 + width > n:
                raise ValueError("truncated")
            u = _be(p + pos + 1, width)
        elif 0xD0 <= b <= 0xD3:  # int8/16/32/64
            width = 1 << (b - 0xD0)
            if pos + 1 + width > n:
                raise ValueError("truncated")
            u = _be(p + pos + 1, width)
            if width == 1:
                s = <int8_t>u
            elif width == 2:
                s = <int16_t>u
            elif width == 4:
                s = <int32_t>u
            else:
                s = <int64_t>u
            if s < 0:
                raise ValueError("negative token id")
            u = <uint64_t>s
        else:
            raise ValueError("not an unsigned integer")
        if u > 0xFFFFFFFF:
            raise ValueError("token id >= 2**32")
        dst[i] = <uint32_t>u
        pos += 1 + width
    if pos != n:
        raise ValueError("trailing bytes")
    return out
