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
* Cold pieces of one call are encoded together through ``encode_batch`` (Rust threads, GIL
  released) when there are at least two of them and ``batch_cold`` is on; otherwise one by one.

Single owner: not thread-safe (the request path calls it from one thread).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from typing import Protocol

from cortex.profile.segments import Segmenter

ENTRY_OVERHEAD_BYTES = 96  # dict slot, OrderedDict links, array header: a rough, fixed charge


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
        out = array("I")
        if add_special_tokens and self._bos_id is not None:
            out.append(self._bos_id)
        pieces = self._segmenter.split(text)
        cache = self._cache
        found: list[array[int] | None] = []
        cold: list[str] = []
        for piece, tid in pieces:
            if tid is not None:
                found.append(array("I", (tid,)))
                continue
            ids = cache.get(piece)
            if ids is None:
                cold.append(piece)
            else:
                cache.move_to_end(piece)
                self.hits += 1
                self.hit_tokens += len(ids)
            found.append(ids)
        if cold:
            encoded = self._encode_cold(cold)
            for i, (piece, _tid) in enumerate(pieces):
                if found[i] is None:
                    found[i] = encoded[piece]
        for ids in found:
            out.extend(ids)  # type: ignore[arg-type]
        return out

    def _encode_cold(self, cold: list[str]) -> dict[str, array[int]]:
        unique = list(dict.fromkeys(cold))
        if self._batch_cold and len(unique) > 1:
            encodings = self._tokenizer.encode_batch(unique, add_special_tokens=False)
        else:
            encodings = [self._tokenizer.encode(p, add_special_tokens=False) for p in unique]
        out = {}
        for piece, enc in zip(unique, encodings):
            ids = array("I", enc.ids)
            out[piece] = ids
            self.misses += 1
            self.miss_tokens += len(ids)
            self._remember(piece, ids)
        return out

    def _remember(self, piece: str, ids: array[int]) -> None:
        cost = len(piece.encode()) + 4 * len(ids) + ENTRY_OVERHEAD_BYTES
        if cost > self._capacity:
            return
        cache = self._cache
        while self._bytes + cost > self._capacity and cache:
            old_piece, old_ids = cache.popitem(last=False)
            self._bytes -= len(old_piece.encode()) + 4 * len(old_ids) + ENTRY_OVERHEAD_BYTES
        cache[piece] = ids
        self._bytes += cost
