"""``SegmentCachedTokenizer``: exact tokenization that pays only for text it has not seen.

The rendered prompt is cut where the tokenizer itself cuts (``segments.Segmenter``: at added
tokens matched in the raw text); each ordinary piece is encoded on its own and cached, each
added-token piece maps straight to its id. A multi-turn chat therefore pays only for its new
message. With a ``cutter`` (``line_cuts.LineCutter``, exact for the tokenizers it is enabled
for), an ordinary piece longer than its ``min_chars`` is cached as chunks cut at line starts,
so a message that grew between turns pays for its new text and one chunk, not for all of it;
and a cold piece that is not pure ASCII is encoded as runs of lines, the ASCII runs through
``fast`` (code with a few non-ASCII comments, English among Chinese).

Invariants:

* ``encode(text)`` == ``tokenizer.encode(text, add_special_tokens=False).ids``, with ``bos_id``
  in front when the profile adds BOS and the caller asks for special tokens
  (``add_special_tokens=True``) — proven by ``tests/property/test_segment_cache_exact.py``
  against one plain full encode.
* The cache is an LRU bounded by the bytes it holds (piece text as UTF-8 plus 4 bytes per token
  id plus a fixed per-entry overhead); a piece larger than the whole budget is encoded but not
  kept. ``hits``/``misses`` count pieces (a long piece's chunks one by one),
  ``hit_tokens``/``miss_tokens`` their tokens.
* Cold pieces of one call are encoded one by one (default: measured faster on this 2-core
  machine), or together through ``encode_batch_fast`` (Rust threads) with ``batch_cold``. One by
  one, a pure-ASCII piece goes through ``fast`` (``fast_pieces.FastPieceEncoder``, exact; ~3x
  faster than ``encode`` on short English text, ~10x with DeepSeek-V3's native splitter) when
  one is given and it applies.
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
from typing import Protocol

from cortex._fast.piece_cache import ENTRY_OVERHEAD_BYTES, NON_ASCII_CHAR_COST, PieceCache
from cortex.profile.fast_pieces import FastPieceEncoder
from cortex.profile.line_cuts import LineCutter
from cortex.profile.segments import FIND_MAX_MISSES, Piece, Segmenter

__all__ = ["ENTRY_OVERHEAD_BYTES", "NON_ASCII_CHAR_COST", "OFFLOAD_MIN_CHARS", "Lookup",
           "SegmentCachedTokenizer"]
OFFLOAD_MIN_CHARS = 2048  # new text this long (~500 tokens, ~1 ms of tokenizer work) or longer
# goes to a worker thread (``trio_tokenize``); shorter is encoded inline (a thread hop costs
# tens of microseconds). A non-ASCII piece's characters count NON_ASCII_CHAR_COST times each
# (Chinese: ~1 µs per character here against ~0.3 for code; perf/RESULTS.md)


@dataclass(slots=True)
class Lookup:
    """A prompt split into pieces, with the ids already known (an added token's id as an
    ``int``); ``cold`` lists each uncached piece once, in order of first appearance."""

    pieces: list[Piece]
    found: list[array[int] | int | None]
    cold: list[str]
    bos_id: int | None


class _Encoding(Protocol):
    ids: list[int]


class TokenizerLike(Protocol):
    """The part of ``tokenizers.Tokenizer`` this module uses."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> _Encoding: ...
    def encode_batch(self, texts: list[str], add_special_tokens: bool = ...) -> list[_Encoding]: ...


class SegmentCachedTokenizer:
    """``encode_now`` is the compiled ``PieceCache.encode_now`` itself (an attribute, not a
    method: the request path calls it without a Python frame)."""

    __slots__ = (
        "_batch_cold",
        "_bos_id",
        "_cutter",
        "_encode_batch",
        "_fast",
        "_pieces",
        "_segmenter",
        "_tokenizer",
        "encode_now",
    )

    def __init__(
        self,
        tokenizer: TokenizerLike,
        segmenter: Segmenter,
        *,
        capacity_bytes: int = 64 << 20,
        bos_id: int | None = None,
        batch_cold: bool = False,
        fast: FastPieceEncoder | None = None,
        cutter: LineCutter | None = None,
    ) -> None:
        self._tokenizer = tokenizer
        self._segmenter = segmenter
        self._bos_id = bos_id
        self._batch_cold = batch_cold
        self._fast = fast if fast is not None and fast.enabled else None
        self._cutter = cutter if cutter is not None and cutter.enabled else None
        self._encode_batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
        native = None if self._fast is None else self._fast.native_words
        self._pieces = PieceCache(  # (ValueError for capacity_bytes < 0)
            capacity_bytes, segmenter.passes, FIND_MAX_MISSES, bos_id,
            None if native is None else native[0], None if native is None else native[1],
            self._encode_one, self.encode_pieces if batch_cold else None, Lookup,
            0 if self._cutter is None else self._cutter.min_chars)  # LineCutter.chunks's cut
        self.encode_now = self._pieces.encode_now

    @property
    def cached_bytes(self) -> int:
        return self._pieces.cached_bytes

    @property
    def cached_pieces(self) -> int:
        return self._pieces.cached_pieces

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
        """Split ``text`` and take every piece the cache holds (counted as hits)."""
        pieces = self._pieces.chunked(self._segmenter.split(text))
        found, cold = self._pieces.lookup(pieces)
        return Lookup(pieces, found, cold, self._bos_id if add_special_tokens else None)

    def encode_pieces(self, pieces: list[str], batch: bool | None = None) -> list[Sequence[int]]:
        """Token ids of each piece (no cache access: safe to run in a worker thread).

        ``batch`` (default: the ``batch_cold`` setting) encodes them in one call, which releases
        the GIL while it works; a single ``encode`` holds it (measured)."""
        if batch is None:
            batch = self._batch_cold and len(pieces) > 1
        if batch:
            return self._plain(pieces)
        return [self._encode_one(piece) for piece in pieces]

    def _plain(self, texts: list[str]) -> list[list[int]]:
        """The tokenizer's own ids of each text: ``encode_batch_fast`` when it has it (no
        offsets computed: 25-30% less time on Chinese, the same ids), else ``encode_batch``."""
        encodings = self._encode_batch(texts, add_special_tokens=False)
        return [enc.ids for enc in encodings]

    def _encode_one(self, piece: str) -> Sequence[int]:
        fast = self._fast
        ids = None if fast is None or not piece.isascii() else fast.encode(piece)
        if ids is not None:
            return ids
        if fast is None or self._cutter is None:
            return self._plain([piece])[0]
        # exact cuts: the runs' ids concatenate; the slow runs go to the tokenizer in one call
        runs = self._cutter.runs(piece)
        found = [fast.encode(run) if is_ascii else None for run, is_ascii in runs]
        slow_runs = [run for (run, _), ids in zip(runs, found) if ids is None]
        slow = iter(self._plain(slow_runs) if slow_runs else ())
        out: list[int] = []
        for ids in found:
            out += next(slow) if ids is None else ids
        return out

    def finish(self, lookup: Lookup, cold_ids: Sequence[Sequence[int]]) -> array[int]:
        """Remember the cold pieces' ids (counted as misses) and assemble the prompt's ids."""
        return self._pieces.finish(lookup.pieces, lookup.found, lookup.cold, list(cold_ids),
                                   lookup.bos_id)
