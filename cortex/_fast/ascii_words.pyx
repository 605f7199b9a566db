# cython: language_level=3
"""The words of a pure-ASCII piece under the DeepSeek-V3 pre-tokenizer, in one C pass.

Contract: ``ascii_words.pyi``. The reference is ``FastPieceEncoder``'s regex path (the two
translated ``Split`` patterns applied with ``re``); ``tests/property`` proves them equal.
"""

from cpython cimport array
from cpython.unicode cimport PyUnicode_GET_LENGTH
from libc.stdint cimport uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy

from cortex._fast.word_ids cimport WordIds, word_hash

import array as py_array

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object)
    void* PyUnicode_DATA(object)

# Flags of one ASCII code point (the table is built in Python from the same character
# classes the regex translation uses, so both paths read one definition).
cdef enum:
    F_LETTER = 1      # [\p{L}\p{M}]             (A-Za-z)
    F_PUNCT = 2       # [\p{P}\p{S}]
    F_LEAD = 4        # the first class of the first alternative (ASCII punctuation)
    F_OPTIONAL = 8    # [^\r\n\p{L}\p{P}\p{S}]    (the second alternative's optional char)
    F_SPACE = 16      # \s as onig defines it for ASCII
    F_NEWLINE = 32    # [\r\n]
    F_DIGIT = 64      # \p{N}


cdef array.array _IDS_TEMPLATE = py_array.array("I")


cdef struct WordSpan:
    Py_ssize_t start
    Py_ssize_t length
    uint64_t hash


cdef int _grow_buffer(void** buffer, Py_ssize_t* cap, Py_ssize_t needed,
                      size_t item) except -1:
    """Make ``*buffer`` hold at least ``needed`` items of ``item`` bytes (doubling)."""
    cdef Py_ssize_t size = cap[0]
    cdef void* grown
    if needed <= size:
        return 0
    while size < needed:
        size *= 2
    grown = realloc(buffer[0], <size_t>size * item)
    if grown is NULL:
        raise MemoryError()
    buffer[0] = grown
    cap[0] = size
    return 0


cdef class DeepSeekV3Words:
    """``words(piece)``: the pre-tokenizer's words of ``piece``, or ``None`` if it is not ASCII;
    ``cached_ids(piece, table)``: their ids taken from a ``WordIds`` table in the same pass."""

    cdef unsigned char flags[128]
    # one ``cached_ids`` call's words and ids (buffers that grow and are kept)
    cdef WordSpan* spans
    cdef Py_ssize_t spans_used, spans_cap
    cdef uint32_t* ids
    cdef Py_ssize_t ids_used, ids_cap

    def __cinit__(self):
        self.spans_cap = 128
        self.spans = <WordSpan*>malloc(self.spans_cap * sizeof(WordSpan))
        self.ids_cap = 256
        self.ids = <uint32_t*>malloc(self.ids_cap * sizeof(uint32_t))
        if self.spans is NULL or self.ids is NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.spans)
        free(self.ids)

    def __init__(self, bytes table):
        if len(table) != 128:
            raise ValueError("the flag table has one byte per ASCII code point")
        cdef int i
        for i in range(128):
            self.flags[i] = table[i]

    def words(self, str piece):
        if not PyUnicode_IS_ASCII(piece):
            return None
        cdef list out = []
        self._scan(piece, out, None)
        return out

    def cached_ids(self, str piece, WordIds table not None):
        """The ids of ``piece``'s words from ``table``, concatenated, as ``array('I')``;
        ``None`` if a word is not in ``table`` or ``piece`` is not ASCII.

        Three passes: the words' spans; their hashes, each word's slot prefetched; the reads.
        The table's cache misses (one per word, ``word_ids``) then overlap."""
        if not PyUnicode_IS_ASCII(piece):
            return None
        self.spans_used = 0
        self._scan(piece, None, table)
        cdef const char* data = <const char*>PyUnicode_DATA(piece)
        cdef WordSpan* span
        cdef Py_ssize_t k, count = 0
        cdef const uint32_t* found
        for k in range(self.spans_used):
            span = &self.spans[k]
            span.hash = word_hash(data + span.start, span.length)
            table.prefetch(span.hash)
        self.ids_used = 0
        for k in range(self.spans_used):
            span = &self.spans[k]
            found = table.find_hashed(data + span.start, span.length, span.hash, &count)
            if found is NULL:
                return None
            _grow_buffer(<void**>&self.ids, &self.ids_cap, self.ids_used + count,
                         sizeof(uint32_t))
            memcpy(self.ids + self.ids_used, found, count * sizeof(uint32_t))
            self.ids_used += count
        cdef array.array out = array.clone(_IDS_TEMPLATE, self.ids_used, False)
        if self.ids_used:
            memcpy(out.data.as_uints, self.ids, self.ids_used * sizeof(uint32_t))
        return out

    cdef int _emit(self, str piece, Py_ssize_t start, Py_ssize_t end, list out,
                   WordIds table) except -1:
        """One word: appended to ``out``, or (with ``table``) its span is to ``spans``."""
        if table is None:
            out.append(piece[start:end])
            return 0
        _grow_buffer(<void**>&self.spans, &self.spans_cap, self.spans_used + 1,
                     sizeof(WordSpan))
        self.spans[self.spans_used].start = start
        self.spans[self.spans_used].length = end - start
        self.spans_used += 1
        return 0

    cdef int _scan(self, str piece, list out, WordIds cache) except -1:
        """Every word of ``piece`` to ``_emit`` in order."""
        cdef const unsigned char* text = <const unsigned char*>PyUnicode_DATA(piece)
        cdef Py_ssize_t n = PyUnicode_GET_LENGTH(piece)
        cdef Py_ssize_t i = 0, j, end
        # Split(\p{N}{1,3}, Isolated): digit runs in threes; each gap between them is split by
        # the second pattern as a text of its own (its lookahead sees the gap's end as the end).
        while i < n:
            if self.flags[text[i]] & F_DIGIT:
                end = i
                while end < n and self.flags[text[end]] & F_DIGIT:
                    end += 1
                while i < end:
                    j = i + 3 if i + 3 < end else end
                    # a digit group: nothing in the second pattern matches inside it, so it
                    # stays one word
                    self._emit(piece, i, j, out, cache)
                    i = j
            else:
                end = i
                while end < n and not (self.flags[text[end]] & F_DIGIT):
                    end += 1
                self._split_gap(piece, text, i, end, out, cache)
                i = end
        return 0

    cdef int _split_gap(self, str piece, const unsigned char* text, Py_ssize_t lo,
                        Py_ssize_t hi, list out, WordIds cache) except -1:
        """Split(second pattern, Isolated) of ``piece[lo:hi]`` (no digits in it):

        ``[lead][A-Za-z]+ | [optional]?[\\p{L}\\p{M}]+ | ' '?[\\p{P}\\p{S}]+[\\r\\n]*
        | \\s*[\\r\\n]+ | \\s+(?!\\S) | \\s+`` — leftmost-first at each position, as ``re``.
        """
        cdef const unsigned char* flags = self.flags
        cdef Py_ssize_t i = lo, gap = lo, j, k, last_newline
        cdef unsigned char here, after
        while i < hi:
            here = flags[text[i]]
            after = flags[text[i + 1]] if i + 1 < hi else 0
            j = -1
            if (here & (F_LEAD | F_OPTIONAL)) and (after & F_LETTER):
                # [lead][A-Za-z]+, or [optional][\p{L}\p{M}]+ (the two classes are disjoint:
                # the lead is punctuation, the optional class excludes it)
                j = i + 2
                while j < hi and flags[text[j]] & F_LETTER:
                    j += 1
            elif here & F_LETTER:
                j = i + 1
                while j < hi and flags[text[j]] & F_LETTER:
                    j += 1
            elif (here & F_PUNCT) or (text[i] == 32 and (after & F_PUNCT)):
                j = i if here & F_PUNCT else i + 1
                while j < hi and flags[text[j]] & F_PUNCT:
                    j += 1
                while j < hi and flags[text[j]] & F_NEWLINE:
                    j += 1
            elif here & F_SPACE:
                k = i
                last_newline = -1
                while k < hi and flags[text[k]] & F_SPACE:
                    if flags[text[k]] & F_NEWLINE:
                        last_newline = k
                    k += 1
                if last_newline >= 0:      # \s*[\r\n]+ : up to the run's last newline
                    j = last_newline + 1
                elif k == hi:              # \s+(?!\S) at the end of the text
                    j = hi
                elif k - 1 > i:            # \s+(?!\S) : all but the space before a non-space
                    j = k - 1
                else:                      # \s+ : one space before a non-space
                    j = k
            if j < 0:
                i += 1  # no alternative matches here: the character joins the gap
                continue
            if gap < i:
                self._emit(piece, gap, i, out, cache)
            self._emit(piece, i, j, out, cache)
            i = gap = j
        if gap < hi:
            self._emit(piece, gap, hi, out, cache)
        return 0


cdef inline unsigned char _lower(unsigned char c) noexcept:
    return c + 32 if 65 <= c <= 90 else c


cdef class Qwen2Words(DeepSeekV3Words):
    """The same for Qwen2's (``max_digits`` 1) or Llama-3's (3) one ``Split`` pattern:
    ``(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,max_digits}
    | ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+``; flag 2 marks
    ``[^\\s\\p{L}\\p{N}]``, flag 8 ``[^\\r\\n\\p{L}\\p{N}]`` (flag 4 unused)."""

    cdef int max_digits

    def __init__(self, bytes table, int max_digits):
        DeepSeekV3Words.__init__(self, table)
        if max_digits < 1:
            raise ValueError("max_digits must be >= 1")
        self.max_digits = max_digits

    cdef int _scan(self, str piece, list out, WordIds cache) except -1:
        """Every match of the pattern, leftmost-first at each position, as ``re`` finds them
        (every ASCII character starts one: letters, digits, ``\\s`` and the rest each have an
        alternative, so there are no gaps)."""
        cdef const unsigned char* text = <const unsigned char*>PyUnicode_DATA(piece)
        cdef const unsigned char* flags = self.flags
        cdef Py_ssize_t n = PyUnicode_GET_LENGTH(piece)
        cdef Py_ssize_t i = 0, j, k, last_newline
        cdef unsigned char here, after, c1, c2
        while i < n:
            here = flags[text[i]]
            after = flags[text[i + 1]] if i + 1 < n else 0
            j = -1
            if text[i] == 39 and i + 1 < n:  # (?i:'s|'t|'re|'ve|'m|'ll|'d)
                c1 = _lower(text[i + 1])
                if c1 == 115 or c1 == 116 or c1 == 109 or c1 == 100:      # s t m d
                    j = i + 2
                elif i + 2 < n:
                    c2 = _lower(text[i + 2])
                    if (c2 == 101 and (c1 == 114 or c1 == 118)) or (c1 == 108 and c2 == 108):
                        j = i + 3                                        # re ve ll
            if j >= 0:
                pass
            elif (here & F_OPTIONAL) and (after & F_LETTER):
                j = i + 2                  # [^\r\n\p{L}\p{N}]\p{L}+
                while j < n and flags[text[j]] & F_LETTER:
                    j += 1
            elif here & F_LETTER:
                j = i + 1                  # \p{L}+
                while j < n and flags[text[j]] & F_LETTER:
                    j += 1
            elif here & F_DIGIT:
                j = i + 1                  # \p{N}{1,max_digits}
                while j < n and j - i < self.max_digits and flags[text[j]] & F_DIGIT:
                    j += 1
            elif (here & F_PUNCT) or (text[i] == 32 and (after & F_PUNCT)):
                j = i if here & F_PUNCT else i + 1   # ' '?[^\s\p{L}\p{N}]+[\r\n]*
                while j < n and flags[text[j]] & F_PUNCT:
                    j += 1
                while j < n and flags[text[j]] & F_NEWLINE:
                    j += 1
            elif here & F_SPACE:
                k = i
                last_newline = -1
                while k < n and flags[text[k]] & F_SPACE:
                    if flags[text[k]] & F_NEWLINE:
                        last_newline = k
                    k += 1
                if last_newline >= 0:      # \s*[\r\n]+ : up to the run's last newline
                    j = last_newline + 1
                elif k == n:               # \s+(?!\S) at the end of the text
                    j = n
                elif k - 1 > i:            # \s+(?!\S) : all but the space before a non-space
                    j = k - 1
                else:                      # \s+ : one space before a non-space
                    j = k
            else:
                raise ValueError("the flag table leaves an ASCII character unmatched")
            self._emit(piece, i, j, out, cache)
            i = j
        return 0
