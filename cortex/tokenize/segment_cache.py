"""``SegmentCachedTokenizer``: exact tokenization that pays only for text it has not seen.

The rendered prompt is cut where the tokenizer itself cuts (``segments.Segmenter``: at added
tokens matched in the raw text); each ordinary piece is encoded on its own and cached, each
added-token piece maps straight to its id. A multi-turn chat therefore pays only for its new
message. With a ``cutter`` (``line_cuts.LineCutter``, exact for the tokenizers it is enabled
for), an ordinary piece longer than its ``min_chars`` is cached as chunks cut at line starts,
so a message that grew between turns pays for its new text and one chunk, not for all of it.
New pieces are encoded by the profile's BPE (``exact_bpe.ExactBpe``: fastokens where proven
exact, else ``tokenizers``), all of a call's in one call.

A long prompt (``REUSE_MIN_CHARS``, 4,096 characters, or more) is also remembered whole, with
its ids (``recent_bytes``: ``models.prompt_reuse_bytes``). The next turn of a conversation
begins with the last one's text, so it is split and looked up only from the last added token
they share — an anchor (``Segmenter.anchors``), where no added-token match can span the seam —
and takes the remembered ids before it: a warm turn of a 36k-token agent context no longer
re-reads the context's 130k characters, pieces and ids (``perf/RESULTS.md``). The reused ids are
the remembered prompt's own, so they are exactly what a full split would give (the proof is in
``PieceCache._split``; ``tests/property/test_prompt_reuse_exact.py``).

Invariants:

* ``encode(text)`` == ``tokenizer.encode(text, add_special_tokens=False).ids``, with ``bos_id``
  in front when the profile adds BOS and the caller asks for special tokens
  (``add_special_tokens=True``) — proven by ``tests/property/test_segment_cache_exact.py``
  against one plain full encode.
* The cache is an LRU bounded by the bytes it holds (piece text as UTF-8 plus 4 bytes per token
  id plus a fixed per-entry overhead); a piece larger than the whole budget is encoded but not
  kept. ``hits``/``misses`` count pieces (a long piece's chunks one by one),
  ``hit_tokens``/``miss_tokens`` their tokens.
* Returned id arrays are not to be modified: a remembered prompt shares its array.
* ``encode_array`` = ``lookup`` (split, take hits) → ``encode_pieces`` (tokenizer only, no
  cache access) → ``finish`` (remember, assemble); an I/O shell may run the middle step in a
  worker thread (``trio_tokenize``). The cache and the request path's ``encode_now`` (all three
  steps in one call, unless the new text is long enough for a worker thread) are compiled
  (``cortex._fast.piece_cache``); the Python steps here call into the same cache.

Single owner: not thread-safe (the request path calls it from one thread).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer

from cortex._fast.piece_cache import (
    ENTRY_OVERHEAD_BYTES,
    NON_ASCII_CHAR_COST,
    REUSE_MIN_CHARS,
    PieceCache,
    Reuse,
)
from cortex.tokenize.exact_bpe import FASTOKENS, TOKENIZERS, ExactBpe
from cortex.tokenize.line_cuts import LineCutter
from cortex.tokenize.segments import FIND_MAX_MISSES, Piece, Segmenter

__all__ = ["ENTRY_OVERHEAD_BYTES", "NON_ASCII_CHAR_COST", "OFFLOAD_MIN_CHARS", "RECENT_BYTES",
           "Lookup", "SegmentCachedTokenizer"]
# New text this long or longer goes to a worker thread (``trio_tokenize``); shorter is encoded
# inline (a thread hop costs tens of microseconds). A non-ASCII piece's characters count
# NON_ASCII_CHAR_COST times each. By the BPE in use (``SegmentCachedTokenizer.offload_min_chars``),
# each ~0.2-0.3 ms of its work here (perf/RESULTS.md): fastokens ~2-8 ns per ASCII character,
# 35-60 per Chinese one; tokenizers ~0.1-0.3 µs and ~1 µs.
OFFLOAD_MIN_CHARS = {FASTOKENS: 32_768, TOKENIZERS: 2_048}
RECENT_BYTES = 16 << 20  # remembered prompts (``PieceCache``); models.prompt_reuse_bytes


@dataclass(slots=True)
class Lookup:
    """A prompt split into pieces, with the ids already known (an added token's id as an
    ``int``); ``cold`` lists each uncached piece once, in order of first appearance. With a
    ``reuse`` that extends a remembered prompt, ``pieces`` are those after the part reused."""

    pieces: list[Piece]
    found: list[array[int] | int | None]
    cold: list[str]
    bos_id: int | None
    reuse: Reuse | None = None


class SegmentCachedTokenizer:
    """``encode_now`` is the compiled ``PieceCache.encode_now`` itself (an attribute, not a
    method: the request path calls it without a Python frame)."""

    __slots__ = (
        "_bos_id",
        "_bpe",
        "_cutter",
        "_pieces",
        "encode_now",
    )

    def __init__(
        self,
        bpe: ExactBpe | Tokenizer,
        segmenter: Segmenter,
        *,
        capacity_bytes: int = 64 << 20,
        bos_id: int | None = None,
        cutter: LineCutter | None = None,
        recent_bytes: int = RECENT_BYTES,
        reuse_min_chars: int = REUSE_MIN_CHARS,
    ) -> None:
        # a bare ``Tokenizer`` is its own reference BPE (tests, tools)
        self._bpe = bpe if isinstance(bpe, ExactBpe) else ExactBpe(bpe, None)
        self._bos_id = bos_id
        self._cutter = cutter if cutter is not None and cutter.enabled else None
        self._pieces = PieceCache(  # (ValueError for capacity_bytes < 0)
            capacity_bytes, segmenter.passes, FIND_MAX_MISSES, bos_id,
            self._bpe.ids, self._bpe.ids_many, Lookup,
            0 if self._cutter is None else self._cutter.min_chars,  # LineCutter.chunks's cut
            segmenter.anchors, recent_bytes, reuse_min_chars)
        self.encode_now = self._pieces.encode_now

    @property
    def offload_min_chars(self) -> int:
        """``encode_now``'s threshold for the BPE in use now (``OFFLOAD_MIN_CHARS``)."""
        return OFFLOAD_MIN_CHARS[self._bpe.backend]

    @property
    def cached_bytes(self) -> int:
        return self._pieces.cached_bytes

    @property
    def cached_pieces(self) -> int:
        return self._pieces.cached_pieces

    @property
    def recent_bytes(self) -> int:
        return self._pieces.recent_bytes

    @property
    def recent_prompts(self) -> int:
        return self._pieces.recent_prompts

    @property
    def reused_prompts(self) -> int:
        return self._pieces.reused_prompts

    @property
    def reused_tokens(self) -> int:
        return self._pieces.reused_tokens

    @property
    def hits(self) -> int:
        return self._pieces.hits

    @property
    def misses(self) -> int:
        return self._pieces.misses

    @property
    def hit_tokens(self) -> int:
        return self._pieces.hit_tokens

    @property
    def miss_tokens(self) -> int:
        return self._pieces.miss_tokens

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.encode_array(text, add_special_tokens).tolist()

    def encode_array(self, text: str, add_special_tokens: bool = False) -> array[int]:
        """Token ids of ``text`` as ``array('I')`` (what ``block_keys`` reads fastest)."""
        lookup = self.lookup(text, add_special_tokens)
        cold_ids = self.encode_pieces(lookup.cold) if lookup.cold else []
        return self.finish(lookup, cold_ids)

    # The three steps of ``encode_array``, public so that an I/O shell can run the middle one
    # (pure tokenizer work, no cache access) in a worker thread: ``lookup`` and ``finish`` touch
    # the cache and stay with its single owner. ``encode_now(text, add_special_tokens,
    # offload_min_chars)`` is all three in one compiled call when the new text is shorter than
    # ``offload_min_chars``; otherwise it returns the ``Lookup`` (hits counted).

    def lookup(self, text: str, add_special_tokens: bool = False) -> Lookup:
        """Split ``text`` (after what it reuses of a remembered prompt) and take every piece
        the cache holds (counted as hits)."""
        return self._pieces.split_lookup(text, self._bos_id if add_special_tokens else None)

    def encode_pieces(self, pieces: list[str]) -> list[array[int]]:
        """Token ids of each piece, in one call that releases the GIL while it encodes (no
        cache access: safe to run in a worker thread)."""
        return self._bpe.ids_many(pieces)

    def finish(self, lookup: Lookup, cold_ids: Sequence[Sequence[int]]) -> array[int]:
        """Remember the cold pieces' ids (counted as misses) and assemble the prompt's ids."""
        return self._pieces.finish(lookup.pieces, lookup.found, lookup.cold, list(cold_ids),
                                   lookup.bos_id, lookup.reuse)
