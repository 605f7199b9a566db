"""Contract of the Cython unit ``cortex._fast.piece_cache``: the segment cache's pieces and the
request path's tokenization in one call (``cortex.tokenize.segment_cache`` is its user).

``PieceCache(capacity_bytes, passes, max_misses, bos_id, encode_one, encode_many,
lookup_class, chunk_chars=0, anchors=frozenset(), recent_capacity_bytes=0,
reuse_min_chars=REUSE_MIN_CHARS)``:

* an LRU of piece text -> ``array('I')`` ids bounded by ``cached_bytes`` <= ``capacity_bytes``
  (a piece costs its UTF-8 bytes + 4 per id + 96); a piece costing more than the whole budget
  is never kept; ``hits``/``misses`` count pieces, ``hit_tokens``/``miss_tokens`` their ids;
* ``lookup(pieces)`` -> ``(found, cold)``: per piece its cached ids (counted as a hit and made
  most recent), an added token's id (an ``int``), or ``None``; ``cold`` the uncached pieces
  once each, in order of first appearance;
* ``finish(pieces, found, cold, cold_ids, bos_id)``: each cold piece's ids (any sequence of
  ints) counted as a miss and remembered; the prompt's ids assembled in piece order, ``bos_id``
  first unless ``None``;
* ``chunked(pieces)``: with ``chunk_chars`` > 0, every ordinary piece (``(text, None)``)
  longer than ``chunk_chars`` characters replaced by ``(chunk, None)`` for each of
  ``line_chunks(text, chunk_chars)``, in order; otherwise (and when no piece is that long)
  ``pieces`` itself;
* remembered prompts (when ``anchors`` and ``recent_capacity_bytes`` are given): every prompt
  of ``reuse_min_chars`` characters or more is remembered whole once encoded (its text, its ids,
  where each added-token piece starts and how many ids precede it), most recent first, at most
  ``RECENT_MAX`` and ``recent_bytes`` <= ``recent_capacity_bytes`` (text bytes + 4 per id + 16
  per cut + ``PROMPT_OVERHEAD_BYTES``). A prompt whose first ``min(HEAD_CHARS,
  reuse_min_chars)`` characters equal a remembered one's is compared with it (the longest shared
  beginning wins); from the last ``CUT_TRIES`` cuts within the shared beginning, the first
  ``b`` at which ``split_pieces(text[b:])`` starts with a token in ``anchors`` is used: the
  prompt's pieces are then those of ``text[b:]`` and its ids start with the remembered prompt's
  ids before ``b`` (``reused_prompts``/``reused_tokens`` count them); the new prompt replaces
  the one it extended. ``anchors`` must hold only tokens no token can span into from the left
  (``segments.Segmenter.anchors``): then the result equals the whole text's;
* ``split_lookup(text, bos_id)``: the pieces (after a reused part) + ``lookup``, as
  ``lookup_class(pieces, found, cold, bos_id, reuse)``; ``finish(..., reuse)`` puts the reused
  ids after ``bos_id`` and remembers the prompt;
* ``encode_now(text, add_special_tokens, offload_min_chars)``: ``split_lookup``'s pieces and
  lookup, then ``lookup_class(pieces, found, cold, bos, reuse)`` if the cold pieces hold
  ``offload_min_chars``
  characters or more (each character of a non-ASCII piece counted ``NON_ASCII_CHAR_COST``
  times), else their ids (``encode_many(cold)`` when given and there is more than
  one, else ``encode_one(piece)`` per piece) and ``finish``; ``bos`` is ``bos_id`` when
  ``add_special_tokens``, else ``None``.

``common_prefix(a, b)``: how many leading characters ``a`` and ``b`` share (any widths).

``line_chunks(text, size)`` equals ``line_cuts.LineCutter(..., min_chars=size).chunks(text)``
for an enabled cutter (its reference; property-tested equal).
"""

from array import array
from collections.abc import Callable, Sequence
from typing import Any

ENTRY_OVERHEAD_BYTES: int
NON_ASCII_CHAR_COST: int
REUSE_MIN_CHARS: int
HEAD_CHARS: int
RECENT_MAX: int
PROMPT_OVERHEAD_BYTES: int
CUT_TRIES: int

class Reuse:
    text: str
    at: int
    n_ids: int

class PieceCache:
    capacity_bytes: int
    cached_bytes: int
    hits: int
    misses: int
    hit_tokens: int
    miss_tokens: int
    recent_capacity_bytes: int
    recent_bytes: int
    reused_prompts: int
    reused_tokens: int
    def __init__(self, capacity_bytes: int, passes: tuple[Any, ...], max_misses: int,
                 bos_id: int | None,
                 encode_one: Callable[[str], Sequence[int]],
                 encode_many: Callable[[list[str]], list[Sequence[int]]] | None,
                 lookup_class: Callable[..., Any],
                 chunk_chars: int = 0, anchors: frozenset[str] = ...,
                 recent_capacity_bytes: int = 0, reuse_min_chars: int = ...) -> None: ...
    @property
    def cached_pieces(self) -> int: ...
    @property
    def recent_prompts(self) -> int: ...
    def split_lookup(self, text: str, bos_id: int | None) -> Any: ...
    def finish(self, pieces: list[tuple[str, int | None]],
               found: list[array[int] | int | None], cold: list[str],
               cold_ids: list[Sequence[int]], bos_id: int | None,
               reuse: Reuse | None = None) -> array[int]: ...
    def encode_now(self, text: str, add_special_tokens: bool,
                   offload_min_chars: int) -> Any: ...

def line_chunks(text: str, size: int) -> list[str]: ...
def common_prefix(a: str, b: str) -> int: ...
