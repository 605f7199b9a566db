"""Contract of the Cython unit ``cortex._fast.token_spans``: a segmenter pass's scan.

``token_spans(pattern, firsts, text, pos, end, max_misses)`` returns the ``(start, end)`` of
every match ``pattern.finditer(text, pos, end)`` would yield, given that every match of
``pattern`` starts with one of ``firsts`` (1 to 8 characters). Candidates are the positions of
those characters (``PyUnicode_FindChar``), each tried with ``pattern.match``; after
``max_misses`` candidates that start no match, the rest of the range is left to ``finditer``.

``split_pieces(text, passes, max_misses)`` is ``Segmenter.split``'s cut: ``passes`` is one or
two ``(pattern, firsts or None, ids)`` (``ids``: token text -> id); the first pass's matches
(``token_spans``, or ``finditer`` when ``firsts`` is ``None``) become ``(token, id)`` pieces and
each gap between them is cut the same way by the next pass, or kept as ``(text, None)`` after
the last; empty gaps are dropped; no passes: the whole text (if any). The pieces' texts
concatenate back to ``text``.
"""

import re

def split_pieces(text: str, passes: tuple[tuple[re.Pattern[str], tuple[str, ...] | None,
                                                dict[str, int]], ...],
                 max_misses: int) -> list[tuple[str, int | None]]: ...
def token_spans(pattern: re.Pattern[str], firsts: tuple[str, ...], text: str, pos: int,
                end: int, max_misses: int) -> list[tuple[int, int]]: ...
