"""``SegmentCachedTokenizer``: exact tokenization that pays only for text it has not seen.

The rendered prompt is cut where the tokenizer itself cuts (``segments.Segmenter``: at added
tokens matched in the raw text); each ordinary piece is encoded on its own and cached, each
added-token piece maps straight to its id. A multi-turn chat therefore pays only for its new
message.

Invariants:

* ``encode(text)`` == ``tokenizer.encode(text, add_special_tokens=False).ids``, with ``bos_id``
  in front when the profile adds BOS and the caller asks for special tokens
  (``add_special_tokens=True``) — proven by ``tests/property/test_segment_cache_exact.py``
  against one plain full encode.
* The cache is an LRU bounded by the bytes it holds (piece text as UTF-8 plus 4 bytes per token
  id plus a fixed per-entry overhead); a piece larger than the whole budget is encoded but not
  kept. ``hits``/``misses`` count pieces, ``hit_tokens``/``miss_tokens`` their tokens.
* Cold pieces of one call are encoded one by one (default: measured faster on this 2-core
  machine), or together through ``encode_batch`` (Rust threads) with ``batch_cold``. One by
  one, a pure-ASCII piece goes through ``fast`` (``fast_pieces.FastPieceEncoder``, exact; ~3x
  faster than ``encode`` on short English text, ~10x with DeepSeek-V3's native splitter) when
  one is given and it applies.
* ``encode_array`` = ``lookup`` (split, take hits) → ``encode_pieces`` (tokenizer only, no
  cache access) → ``finish`` (remember, assemble); an I/O shell may run the middle step in a
  worker thread (``trio_tokenize``).

Single owner: not thread-safe (the request path calls it from one thread).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from cortex.profile.fast_pieces import FastPieceEncoder
from cortex.profile.segments import Piece, Segmenter

ENTRY_OVERHEAD_BYTES = 96  # dict slot, OrderedDict links, array header: a rough, fixed charge


@dataclass(slots=True)
class Lookup:
    """A prompt split into pieces, with the ids already known; ``cold`` lists each uncached
    piece once, in order of first appearance."""

    pieces: list[Piece]
    found: list[array[int] | None]
    cold: list[str]
    bos_id: int | None


class _Encoding(Protocol):
    ids: list[int]


class TokenizerLike(Protocol):
    """The part of ``tokenizers.Tokenizer`` this module uses."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> _Encoding: ...
    def encode_batch(self, texts: list[str], add_special_tokens: bool = ...) -> list[_Encoding]: ...


class SegmentCachedTokenizer:
    __slots__ = (
        "_tokenizer",
        "_segmenter",
        "_bos_id",
        "_capacity",
        "_cache",
        "_bytes",
        "_batch_cold",
        "_fast",
        "hits",
        "misses",
        "hit_tokens",
        "miss_tokens",
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
    ) -> None:
        if capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        self._tokenizer = tokenizer
        self._segmenter = segmenter
        self._bos_id = bos_id
        self._capacity = capacity_bytes
        self._cache: OrderedDict[str, array[int]] = OrderedDict()
        self._bytes = 0
        self._batch_cold = batch_cold
        self._fast = fast if fast is not None and fast.enabled else None
        self.hits = 0
        self.misses = 0
        self.hit_tokens = 0
        self.miss_tokens = 0

    @property
    def cached_bytes(self) -> int:
        return self._bytes

    @property
    def cached_pieces(self) -> int:
        return len(self._cache)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.encode_array(text, add_special_tokens).tolist()

    def encode_array(self, text: str, add_special_tokens: bool = False) -> array[int]:
        """Token ids of ``text`` as ``array('I')`` (what ``block_keys`` reads fastest)."""
        lookup = self.lookup(text, add_special_tokens)
        cold_ids = self.encode_pieces(lookup.cold) if lookup.cold else []
        return self.finish(lookup, cold_ids)

    # The three steps of ``encode_array``, public so that an I/O shell can run the middle one
    # (pure tokenizer work, no cache access) in a worker thread: ``lookup`` and ``finish`` touch
    # the cache and stay with its single owner.

    def lookup(self, text: str, add_special_tokens: bool = False) -> Lookup:
        """Split ``text`` and take every piece the cache holds (counted as hits)."""
        pieces = self._segmenter.split(text)
        cache = self._cache
        found: list[array[int] | None] = []
        cold: dict[str, None] = {}
        for piece, tid in pieces:
            if tid is not None:
                found.append(array("I", (tid,)))
                continue
            ids = cache.get(piece)
            if ids is None:
                cold[piece] = None
            else:
                cache.move_to_end(piece)
                self.hits += 1
                self.hit_tokens += len(ids)
            found.append(ids)
        bos = self._bos_id if add_special_tokens else None
        return Lookup(pieces, found, list(cold), bos)

    def encode_pieces(self, pieces: list[str], batch: bool | None = None) -> list[Sequence[int]]:
        """Token ids of each piece (no cache access: safe to run in a worker thread).

        ``batch`` (default: the ``batch_cold`` setting) uses ``encode_batch``, which releases
        the GIL while it works; a single ``encode`` holds it (measured)."""
        if batch is None:
            batch = self._batch_cold and len(pieces) > 1
        if batch:
            encodings = self._tokenizer.encode_batch(pieces, add_special_tokens=False)
            return [enc.ids for enc in encodings]
        encode = self._tokenizer.encode
        fast = self._fast
        if fast is None:
            return [encode(p, add_special_tokens=False).ids for p in pieces]
        out = []
        for piece in pieces:
            ids = fast.encode(piece)
            out.append(encode(piece, add_special_tokens=False).ids if ids is None else ids)
        return out

    def finish(self, lookup: Lookup, cold_ids: Sequence[Sequence[int]]) -> array[int]:
        """Remember the cold pieces' ids (counted as misses) and assemble the prompt's ids."""
        if len(cold_ids) != len(lookup.cold):
            raise ValueError("one id list per cold piece is needed")
        encoded: dict[str, array[int]] = {}
        for piece, ids_list in zip(lookup.cold, cold_ids):
            # the fast encoder's cached words come as a fresh array('I'): kept as it is
            ids = ids_list if type(ids_list) is array else array("I", ids_list)
            encoded[piece] = ids
            self.misses += 1
            self.miss_tokens += len(ids)
            self._remember(piece, ids)
        out = array("I")
        if lookup.bos_id is not None:
            out.append(lookup.bos_id)
        for (piece, _tid), ids in zip(lookup.pieces, lookup.found):
            out.extend(encoded[piece] if ids is None else ids)
        return out

    def _remember(self, piece: str, ids: array[int]) -> None:
        cache = self._cache
        if piece in cache:  # encoded meanwhile by a concurrent request (see ``trio_tokenize``)
            cache.move_to_end(piece)
            return
        cost = len(piece.encode()) + 4 * len(ids) + ENTRY_OVERHEAD_BYTES
        if cost > self._capacity:
            return
        while self._bytes + cost > self._capacity and cache:
            old_piece, old_ids = cache.popitem(last=False)
            self._bytes -= len(old_piece.encode()) + 4 * len(old_ids) + ENTRY_OVERHEAD_BYTES
        cache[piece] = ids
        self._bytes += cost
