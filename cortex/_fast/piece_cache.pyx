# cython: language_level=3
"""``PieceCache``: the segment cache's LRU of pieces and the request path's tokenization in one
compiled call. Contract: ``piece_cache.pyi``; ``cortex.profile.segment_cache`` uses it.

``encode_now`` does in one call what ``SegmentCachedTokenizer`` did in eight Python frames
(split, lookup, encode the new pieces, remember, assemble): in the running server each frame
costs its cache misses (the other processes evicted its code and data), so the frames, not the
arithmetic, were the cost."""

from cpython cimport array
from cpython.unicode cimport PyUnicode_GET_LENGTH
from libc.string cimport memcpy

import array as py_array
from collections import OrderedDict

from cortex._fast.token_spans import split_pieces

cdef extern from "Python.h":
    ctypedef unsigned int Py_UCS4
    bint PyUnicode_IS_ASCII(object)
    Py_ssize_t PyUnicode_FindChar(object, Py_UCS4, Py_ssize_t, Py_ssize_t, int) except -2
    Py_UCS4 PyUnicode_READ_CHAR(object, Py_ssize_t)

ENTRY_OVERHEAD_BYTES = 96  # a piece's fixed charge: dict slot, OrderedDict links, array header
cdef Py_ssize_t _OVERHEAD = ENTRY_OVERHEAD_BYTES
NON_ASCII_CHAR_COST = 8  # a non-ASCII character against ASCII ones, in BPE work (~4-20x)
cdef Py_ssize_t _NON_ASCII = NON_ASCII_CHAR_COST
cdef array.array _IDS_TEMPLATE = py_array.array("I")


cdef inline bint _solid(Py_UCS4 c) noexcept:
    return 0x21 <= c <= 0x7E or 0x4E00 <= c <= 0x9FA5


cdef list _line_chunks(str text, Py_ssize_t size):
    """``line_cuts.LineCutter.chunks`` (its reference): cut just after the first ``\\n`` at least
    ``size`` characters into each chunk that is followed by ``[ \\t]*`` and a solid character
    (ASCII ``!``..``~`` or U+4E00..U+9FA5)."""
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(text), start = 0, at, k
    cdef Py_UCS4 c
    cdef list out = []
    if n <= size:
        return [text]
    at = size - 1
    while at < n:
        at = PyUnicode_FindChar(text, 10, at, n, 1)
        if at < 0:
            break
        k = at + 1
        while k < n:
            c = PyUnicode_READ_CHAR(text, k)
            if c != 32 and c != 9:
                break
            k += 1
        if k < n and _solid(PyUnicode_READ_CHAR(text, k)):
            out.append(text[start:at + 1])
            start = at + 1
            at = start + size - 1
        else:
            at += 1
    out.append(text[start:])
    return out


def line_chunks(str text, Py_ssize_t size):
    """The native chunker alone (for its property test against ``LineCutter.chunks``)."""
    if size < 1:
        raise ValueError("size must be >= 1")
    return _line_chunks(text, size)


cdef inline array.array _as_ids(object ids):
    """``ids`` as ``array('I')``: kept as it is when it is one, else copied into one."""
    if type(ids) is array.array:
        return <array.array>ids
    return py_array.array("I", ids)


cdef inline int _append_ids(array.array out, array.array ids) except -1:
    cdef Py_ssize_t n = len(ids), at = len(out)
    if n:
        array.resize_smart(out, at + n)
        memcpy(&out.data.as_uints[at], ids.data.as_uints, n * sizeof(unsigned int))
    return 0


cdef inline int _append_id(array.array out, unsigned int token_id) except -1:
    cdef Py_ssize_t at = len(out)
    array.resize_smart(out, at + 1)
    out.data.as_uints[at] = token_id
    return 0


cdef class PieceCache:
    cdef object _entries             # OrderedDict: piece -> array('I'), least recent first
    cdef object _move_to_end, _pop_oldest
    cdef readonly Py_ssize_t capacity_bytes
    cdef readonly Py_ssize_t cached_bytes
    cdef readonly Py_ssize_t hits, misses, hit_tokens, miss_tokens
    cdef tuple _passes
    cdef int _max_misses
    cdef object _bos_id
    cdef object _encode_one          # a cold piece's ids (the Python path)
    cdef object _encode_many         # the cold pieces' ids together, or None
    cdef object _lookup_class
    cdef Py_ssize_t _chunk_chars     # longer ordinary pieces are cut into chunks; 0: never

    def __init__(self, Py_ssize_t capacity_bytes, tuple passes, int max_misses, bos_id,
                 encode_one, encode_many, lookup_class,
                 Py_ssize_t chunk_chars=0):
        if capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        self._entries = OrderedDict()
        self._move_to_end = self._entries.move_to_end
        self._pop_oldest = self._entries.popitem
        self.capacity_bytes = capacity_bytes
        self._passes = passes
        self._max_misses = max_misses
        self._bos_id = bos_id
        self._encode_one = encode_one
        self._encode_many = encode_many
        self._lookup_class = lookup_class
        if chunk_chars < 0:
            raise ValueError("chunk_chars must be >= 0")
        self._chunk_chars = chunk_chars

    @property
    def cached_pieces(self):
        return len(self._entries)

    def chunked(self, list pieces):
        """``pieces`` with every ordinary piece longer than ``chunk_chars`` replaced by its
        chunks (the list itself when none is)."""
        return self._chunked(pieces)

    cdef list _chunked(self, list pieces):
        cdef tuple one
        cdef Py_ssize_t i, n = len(pieces), over = self._chunk_chars
        cdef list out
        if over == 0:
            return pieces
        for i in range(n):
            one = <tuple>pieces[i]
            if one[1] is None and PyUnicode_GET_LENGTH(one[0]) > over:
                break
        else:
            return pieces
        out = pieces[:i]
        for i in range(i, n):
            one = <tuple>pieces[i]
            if one[1] is None and PyUnicode_GET_LENGTH(one[0]) > over:
                for chunk in _line_chunks(<str>one[0], over):
                    out.append((chunk, None))
            else:
                out.append(one)
        return out

    # -- the steps, for a caller that encodes the cold pieces elsewhere (a worker thread) -----

    def lookup(self, list pieces):
        """``(found, cold)``: each piece's cached ids (``None`` if not cached; an added token's
        one id), and the uncached pieces once each, in order of first appearance."""
        cdef list found = [], cold = []
        self._lookup(pieces, found, cold)
        return found, cold

    def finish(self, list pieces, list found, list cold, list cold_ids, bos_id):
        """Remember the cold pieces' ids and assemble the prompt's ids (``bos_id`` first)."""
        if len(cold_ids) != len(cold):
            raise ValueError("one id list per cold piece is needed")
        return self._finish(pieces, found, cold, cold_ids, bos_id)

    # -- the request path ---------------------------------------------------------------------

    def encode_now(self, str text, bint add_special_tokens, Py_ssize_t offload_min_chars):
        """The prompt's ids as ``array('I')``, or, when its cold pieces hold
        ``offload_min_chars`` characters or more (a non-ASCII piece's counted
        ``NON_ASCII_CHAR_COST`` times each), its ``Lookup`` (hits counted) for a worker thread
        to encode."""
        cdef list pieces = self._chunked(split_pieces(text, self._passes, self._max_misses))
        cdef list found = [], cold = []
        cdef Py_ssize_t cold_chars = 0
        bos_id = self._bos_id if add_special_tokens else None
        self._lookup(pieces, found, cold)
        if not cold:
            return self._finish(pieces, found, cold, [], bos_id)
        for piece in cold:  # a non-ASCII character costs the tokenizer several ASCII ones
            cold_chars += PyUnicode_GET_LENGTH(piece) * (
                1 if PyUnicode_IS_ASCII(piece) else _NON_ASCII)
        if cold_chars >= offload_min_chars:
            return self._lookup_class(pieces, found, cold, bos_id)
        return self._finish(pieces, found, cold, self._encode_cold(cold), bos_id)

    cdef list _encode_cold(self, list cold):
        if self._encode_many is not None and len(cold) > 1:
            return self._encode_many(cold)
        encode_one = self._encode_one
        return [encode_one(piece) for piece in cold]

    cdef int _lookup(self, list pieces, list found, list cold) except -1:
        cdef tuple one
        cdef dict seen = None
        entries = self._entries
        for one in pieces:
            piece, token_id = one
            if token_id is not None:
                found.append(token_id)  # an added token: its id (an int)
                continue
            ids = entries.get(piece)
            if ids is None:
                if seen is None:
                    seen = {}
                if piece not in seen:
                    seen[piece] = None
                    cold.append(piece)
            else:
                self._move_to_end(piece)
                self.hits += 1
                self.hit_tokens += len(ids)
            found.append(ids)
        return 0

    cdef array.array _finish(self, list pieces, list found, list cold, list cold_ids, bos_id):
        cdef dict encoded = None
        cdef array.array ids, out
        cdef Py_ssize_t i, n = len(cold)
        if n:
            encoded = {}
            for i in range(n):
                piece = cold[i]
                ids = _as_ids(cold_ids[i])
                encoded[piece] = ids
                self.misses += 1
                self.miss_tokens += len(ids)
                self._remember(piece, ids)
        out = array.clone(_IDS_TEMPLATE, 0, False)
        if bos_id is not None:
            _append_id(out, bos_id)
        for i in range(len(pieces)):
            got = found[i]
            if got is None:
                _append_ids(out, <array.array>encoded[(<tuple>pieces[i])[0]])
            elif type(got) is int:
                _append_id(out, got)
            else:
                _append_ids(out, <array.array>got)
        return out

    cdef int _remember(self, str piece, array.array ids) except -1:
        entries = self._entries
        if piece in entries:  # encoded meanwhile by a concurrent request (a worker thread)
            self._move_to_end(piece)
            return 0
        cdef Py_ssize_t cost = _cost(piece, len(ids))
        if cost > self.capacity_bytes:
            return 0
        while self.cached_bytes + cost > self.capacity_bytes and entries:
            old_piece, old_ids = self._pop_oldest(False)
            self.cached_bytes -= _cost(old_piece, len(old_ids))
        entries[piece] = ids
        self.cached_bytes += cost
        return 0


cdef inline Py_ssize_t _cost(str piece, Py_ssize_t ids) except -1:
    """A piece's charge: its UTF-8 bytes, 4 per id, a fixed overhead."""
    cdef Py_ssize_t utf8 = (PyUnicode_GET_LENGTH(piece) if PyUnicode_IS_ASCII(piece)
                            else len(piece.encode()))
    return utf8 + 4 * ids + _OVERHEAD
