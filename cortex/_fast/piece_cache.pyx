# cython: language_level=3
"""``PieceCache``: the segment cache's LRU of pieces and the request path's tokenization in one
compiled call. Contract: ``piece_cache.pyi``; ``cortex.tokenize.segment_cache`` uses it.

``encode_now`` does in one call what ``SegmentCachedTokenizer`` did in eight Python frames
(split, lookup, encode the new pieces, remember, assemble): in the running server each frame
costs its cache misses (the other processes evicted its code and data), so the frames, not the
arithmetic, were the cost.

It also remembers recent long prompts whole (``_Prompt``): a prompt that begins as one of them
does is split only from the last usable cut they share, and the ids before it are copied from
the remembered prompt (``_split`` says why that is exact)."""

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
    int PyUnicode_KIND(object)

cdef extern from *:
    """
    /* How many leading characters two strings share, at most n (n <= both lengths). Equal
       kinds: memcmp over 512-byte blocks; mixed kinds (an ASCII prompt extended by a message
       with one wider character): blocks of 64 characters compared as an OR of differences,
       which the compiler vectorizes. The last block is then walked character by character. */
    #define CORTEX_MIXED_BLOCKS(TA, TB) { \
        const TA *x = (const TA *)da; const TB *y = (const TB *)db; \
        while (i + 64 <= n) { \
            Py_UCS4 acc = 0; \
            for (int j = 0; j < 64; j++) acc |= (Py_UCS4)x[i + j] ^ (Py_UCS4)y[i + j]; \
            if (acc) break; \
            i += 64; } }
    static Py_ssize_t cortex_common_prefix(PyObject *a, PyObject *b, Py_ssize_t n) {
        int ka = PyUnicode_KIND(a), kb = PyUnicode_KIND(b);
        const void *da = PyUnicode_DATA(a), *db = PyUnicode_DATA(b);
        Py_ssize_t i = 0;
        if (ka == kb) {
            const Py_ssize_t step = 512 / ka;
            while (i + step <= n && memcmp((const char *)da + i * ka, (const char *)db + i * ka,
                                           (size_t)(step * ka)) == 0)
                i += step;
        } else if (ka == 1 && kb == 2) CORTEX_MIXED_BLOCKS(Py_UCS1, Py_UCS2)
        else if (ka == 2 && kb == 1) CORTEX_MIXED_BLOCKS(Py_UCS2, Py_UCS1)
        else if (ka == 1) CORTEX_MIXED_BLOCKS(Py_UCS1, Py_UCS4)
        else if (kb == 1) CORTEX_MIXED_BLOCKS(Py_UCS4, Py_UCS1)
        else if (ka == 2) CORTEX_MIXED_BLOCKS(Py_UCS2, Py_UCS4)
        else CORTEX_MIXED_BLOCKS(Py_UCS4, Py_UCS2)
        while (i < n && PyUnicode_READ(ka, da, i) == PyUnicode_READ(kb, db, i))
            i++;
        return i;
    }
    """
    Py_ssize_t cortex_common_prefix(object, object, Py_ssize_t)

ENTRY_OVERHEAD_BYTES = 96  # a piece's fixed charge: dict slot, OrderedDict links, array header
cdef Py_ssize_t _OVERHEAD = ENTRY_OVERHEAD_BYTES
NON_ASCII_CHAR_COST = 8  # a non-ASCII character against ASCII ones, in BPE work (~4-20x)
cdef Py_ssize_t _NON_ASCII = NON_ASCII_CHAR_COST
cdef array.array _IDS_TEMPLATE = py_array.array("I")
cdef array.array _CUTS_TEMPLATE = py_array.array("q")


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


REUSE_MIN_CHARS = 4096  # a shorter prompt is neither remembered nor extended (cheap anyway)
HEAD_CHARS = 512  # a remembered prompt is tried only for prompts that begin as it does
cdef Py_ssize_t _HEAD = HEAD_CHARS  # (or the first reuse_min_chars, when fewer)
RECENT_MAX = 32  # remembered prompts, at most (each tried costs a comparison of their texts)
PROMPT_OVERHEAD_BYTES = 256
CUT_TRIES = 3  # cuts tried, last first, before a prompt is encoded piece by piece


cdef class _Prompt:
    """A prompt encoded lately, kept so that a prompt extending it reuses its ids. ``cuts``:
    where each added-token piece starts (characters, ascending); ``cut_ids``: how many ids
    (after the BOS) come before it. ``ids`` is the array handed to the caller (not copied:
    callers read token ids, never write them)."""
    cdef str text
    cdef Py_hash_t head
    cdef array.array ids
    cdef Py_ssize_t bos_len
    cdef array.array cuts
    cdef array.array cut_ids
    cdef Py_ssize_t cost


cdef class Reuse:
    """What ``split_lookup`` found for a prompt long enough to remember: ``parent``, when set,
    is a remembered prompt whose first ``at`` characters (``n_cuts`` cuts, ``n_ids`` ids)
    this prompt begins with; its pieces start there."""
    cdef readonly str text
    cdef Py_hash_t head
    cdef _Prompt parent
    cdef readonly Py_ssize_t at
    cdef Py_ssize_t n_cuts
    cdef readonly Py_ssize_t n_ids


cdef inline Py_ssize_t _cuts_upto(array.array cuts, Py_ssize_t at) noexcept:
    """How many of the ascending ``cuts`` are <= ``at``."""
    cdef Py_ssize_t lo = 0, hi = len(cuts), mid
    cdef long long *data = cuts.data.as_longlongs
    while lo < hi:
        mid = (lo + hi) >> 1
        if data[mid] <= at:
            lo = mid + 1
        else:
            hi = mid
    return lo


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
    cdef frozenset _anchors          # added tokens no match can span into (segments.py)
    cdef list _recent                # _Prompt, most recent first
    cdef readonly Py_ssize_t recent_capacity_bytes, recent_bytes
    cdef readonly Py_ssize_t reused_prompts, reused_tokens
    cdef Py_ssize_t _reuse_min, _head

    def __init__(self, Py_ssize_t capacity_bytes, tuple passes, int max_misses, bos_id,
                 encode_one, encode_many, lookup_class,
                 Py_ssize_t chunk_chars=0, anchors=frozenset(),
                 Py_ssize_t recent_capacity_bytes=0, Py_ssize_t reuse_min_chars=REUSE_MIN_CHARS):
        if capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        if recent_capacity_bytes < 0:
            raise ValueError("recent_capacity_bytes must be >= 0")
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
        self._anchors = frozenset(anchors)
        self._recent = []
        self.recent_capacity_bytes = recent_capacity_bytes if self._anchors else 0
        if reuse_min_chars < 0:
            raise ValueError("reuse_min_chars must be >= 0")
        self._reuse_min = reuse_min_chars
        self._head = min(_HEAD, reuse_min_chars)

    @property
    def cached_pieces(self):
        return len(self._entries)

    @property
    def recent_prompts(self):
        return len(self._recent)

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

    def split_lookup(self, str text, bos_id):
        """``lookup_class(pieces, found, cold, bos_id, reuse)`` for ``text``: its pieces — after
        the part of a remembered prompt it extends, when one is found (``reuse``) — looked
        up."""
        cdef list found = [], cold = []
        cdef Reuse reuse = self._reuse_for(text)
        pieces = self._split(text, reuse)
        self._lookup(pieces, found, cold)
        return self._lookup_class(pieces, found, cold, bos_id, reuse)

    def finish(self, list pieces, list found, list cold, list cold_ids, bos_id,
               Reuse reuse=None):
        """Remember the cold pieces' ids and assemble the prompt's ids (``bos_id`` first, then
        the ids ``reuse`` takes from the prompt it extends)."""
        if len(cold_ids) != len(cold):
            raise ValueError("one id list per cold piece is needed")
        return self._finish(pieces, found, cold, cold_ids, bos_id, reuse)

    # -- the request path ---------------------------------------------------------------------

    def encode_now(self, str text, bint add_special_tokens, Py_ssize_t offload_min_chars):
        """The prompt's ids as ``array('I')``, or, when its cold pieces hold
        ``offload_min_chars`` characters or more (a non-ASCII piece's counted
        ``NON_ASCII_CHAR_COST`` times each), its ``Lookup`` (hits counted) for a worker thread
        to encode."""
        cdef Reuse reuse = self._reuse_for(text)
        cdef list pieces = self._split(text, reuse)
        cdef list found = [], cold = []
        cdef Py_ssize_t cold_chars = 0
        bos_id = self._bos_id if add_special_tokens else None
        self._lookup(pieces, found, cold)
        if not cold:
            return self._finish(pieces, found, cold, [], bos_id, reuse)
        for piece in cold:  # a non-ASCII character costs the tokenizer several ASCII ones
            cold_chars += PyUnicode_GET_LENGTH(piece) * (
                1 if PyUnicode_IS_ASCII(piece) else _NON_ASCII)
        if cold_chars >= offload_min_chars:
            return self._lookup_class(pieces, found, cold, bos_id, reuse)
        return self._finish(pieces, found, cold, self._encode_cold(cold), bos_id, reuse)

    # -- remembered prompts -------------------------------------------------------------------

    cdef Reuse _reuse_for(self, str text):
        """``None`` for a prompt too short to remember; else its ``Reuse``, with the remembered
        prompt it extends when there is one (the longest shared beginning wins)."""
        cdef Py_ssize_t n = PyUnicode_GET_LENGTH(text), shared, best_shared = 0
        cdef _Prompt entry, best = None
        cdef Reuse reuse
        if self.recent_capacity_bytes == 0 or n < self._reuse_min:
            return None
        reuse = Reuse.__new__(Reuse)
        reuse.text = text
        reuse.head = hash(text[:self._head])
        for entry in self._recent:
            if entry.head != reuse.head:
                continue
            shared = cortex_common_prefix(entry.text, text,
                                          min(PyUnicode_GET_LENGTH(entry.text), n))
            if shared > best_shared:
                best, best_shared = entry, shared
                if shared == PyUnicode_GET_LENGTH(entry.text):
                    break  # it extends this one whole (its own last turn, as a rule): enough
        if best is not None:
            reuse.parent = best
            reuse.at = best_shared  # narrowed to a cut by _split
        return reuse

    cdef list _split(self, str text, Reuse reuse):
        """The pieces to look up: from the last usable cut of the prompt ``reuse`` extends (the
        pieces before it are the remembered prompt's), else of the whole text.

        A cut ``b`` (an added-token piece of the remembered prompt starts there) within the
        shared beginning is usable when ``text[b:]`` splits with an anchor first: an added
        token into which no added token can extend from the left. Then no match spans ``b``
        in ``text``, the matches before ``b`` are the remembered prompt's (same characters, and
        none spanned ``b`` there either), and the pieces from ``b`` on are ``text[b:]``'s own —
        so the concatenation is what the tokenizer cuts (property-tested)."""
        cdef _Prompt parent
        cdef Py_ssize_t k, b, tries = 0
        cdef list tail
        if reuse is not None and reuse.parent is not None:
            parent = reuse.parent
            k = _cuts_upto(parent.cuts, reuse.at)
            while k > 0 and tries < CUT_TRIES:
                k -= 1
                tries += 1
                b = parent.cuts.data.as_longlongs[k]
                if b >= PyUnicode_GET_LENGTH(text):
                    continue
                tail = split_pieces(text[b:], self._passes, self._max_misses)
                if (<tuple>tail[0])[1] is not None and (<tuple>tail[0])[0] in self._anchors:
                    reuse.at = b
                    reuse.n_cuts = k
                    reuse.n_ids = parent.cut_ids.data.as_longlongs[k]
                    return self._chunked(tail)
            reuse.parent = None
            reuse.at = 0
        return self._chunked(split_pieces(text, self._passes, self._max_misses))

    cdef int _remember_prompt(self, Reuse reuse, array.array ids, Py_ssize_t bos_len,
                              array.array cuts, array.array cut_ids) except -1:
        cdef _Prompt entry = _Prompt.__new__(_Prompt), old
        cdef str text = reuse.text
        cdef Py_ssize_t i
        entry.text = text
        entry.head = reuse.head
        entry.ids = ids
        entry.bos_len = bos_len
        entry.cuts = cuts
        entry.cut_ids = cut_ids
        entry.cost = (PyUnicode_GET_LENGTH(text) * PyUnicode_KIND(text) + 4 * len(ids)
                      + 16 * len(cuts) + PROMPT_OVERHEAD_BYTES)
        recent = self._recent
        if reuse.parent is not None:  # the new prompt holds what was reused of its parent
            for i in range(len(recent)):
                if recent[i] is reuse.parent:
                    self.recent_bytes -= (<_Prompt>recent[i]).cost
                    del recent[i]
                    break
        if entry.cost > self.recent_capacity_bytes:
            return 0
        recent.insert(0, entry)
        self.recent_bytes += entry.cost
        while len(recent) > RECENT_MAX or self.recent_bytes > self.recent_capacity_bytes:
            old = <_Prompt>recent.pop()
            self.recent_bytes -= old.cost
        return 0

    # -- internals ----------------------------------------------------------------------------

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

    cdef array.array _finish(self, list pieces, list found, list cold, list cold_ids, bos_id,
                             Reuse reuse):
        """The ids, in one array sized once (a 37k-id prompt is 150 KB: growing it piece by
        piece re-copied it); with ``reuse``, the prompt is remembered (``_remember_prompt``)."""
        cdef dict encoded = None
        cdef array.array ids, out, cuts = None, cut_ids = None
        cdef _Prompt parent = None
        cdef Py_ssize_t i, n = len(cold), bos_len = 0 if bos_id is None else 1
        cdef Py_ssize_t at = 0, total, added = 0, w, c = 0, size
        if n:
            encoded = {}
            for i in range(n):
                piece = cold[i]
                ids = _as_ids(cold_ids[i])
                encoded[piece] = ids
                self.misses += 1
                self.miss_tokens += len(ids)
                self._remember(piece, ids)
        if reuse is not None:
            parent = reuse.parent
        total = bos_len + (reuse.n_ids if parent is not None else 0)
        for i in range(len(pieces)):
            got = found[i]
            if got is None:
                total += len(<array.array>encoded[(<tuple>pieces[i])[0]])
            elif type(got) is int:
                total += 1
                added += 1  # an added-token piece: a cut
            else:
                total += len(<array.array>got)
        out = array.clone(_IDS_TEMPLATE, total, False)
        w = bos_len
        if bos_len:
            out.data.as_uints[0] = bos_id
        if reuse is not None:
            c = reuse.n_cuts if parent is not None else 0
            cuts = array.clone(_CUTS_TEMPLATE, c + added, False)
            cut_ids = array.clone(_CUTS_TEMPLATE, c + added, False)
        if parent is not None:
            memcpy(&out.data.as_uints[w], &parent.ids.data.as_uints[parent.bos_len],
                   reuse.n_ids * sizeof(unsigned int))
            w += reuse.n_ids
            memcpy(cuts.data.as_longlongs, parent.cuts.data.as_longlongs, c * sizeof(long long))
            memcpy(cut_ids.data.as_longlongs, parent.cut_ids.data.as_longlongs,
                   c * sizeof(long long))
            at = reuse.at
            self.reused_prompts += 1
            self.reused_tokens += reuse.n_ids
        for i in range(len(pieces)):
            got = found[i]
            if type(got) is int:
                if cuts is not None:
                    cuts.data.as_longlongs[c] = at
                    cut_ids.data.as_longlongs[c] = w - bos_len
                    c += 1
                out.data.as_uints[w] = <unsigned int>got
                w += 1
            else:
                ids = <array.array>(encoded[(<tuple>pieces[i])[0]] if got is None else got)
                size = len(ids)
                if size:
                    memcpy(&out.data.as_uints[w], ids.data.as_uints, size * sizeof(unsigned int))
                    w += size
            if cuts is not None:
                at += PyUnicode_GET_LENGTH((<tuple>pieces[i])[0])
        if cuts is not None:
            self._remember_prompt(reuse, out, bos_len, cuts, cut_ids)
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


def common_prefix(str a, str b):
    """How many leading characters ``a`` and ``b`` share (the native comparison alone, for its
    property test against a character loop)."""
    return cortex_common_prefix(a, b, min(PyUnicode_GET_LENGTH(a), PyUnicode_GET_LENGTH(b)))


cdef inline Py_ssize_t _cost(str piece, Py_ssize_t ids) except -1:
    """A piece's charge: its UTF-8 bytes, 4 per id, a fixed overhead."""
    cdef Py_ssize_t utf8 = (PyUnicode_GET_LENGTH(piece) if PyUnicode_IS_ASCII(piece)
                            else len(piece.encode()))
    return utf8 + 4 * ids + _OVERHEAD
