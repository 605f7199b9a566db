"""Contract of the Cython unit ``cortex._fast.token_spans``: a segmenter pass's scan.

``token_spans(pattern, firsts, text, pos, end, max_misses)`` returns the ``(start, end)`` of
every match ``pattern.finditer(text, pos, end)`` would yield, given that every match of
``pattern`` starts with one of ``firsts`` (1 to 8 characters). Candidates are the positions of
those characters (``PyUnicode_FindChar``), each tried with ``pattern.match``; after
``max_misses`` candidates that start no match, the rest of the range is left to ``finditer``.
"""

import re

def token_spans(pattern: re.Pattern[str], firsts: tuple[str, ...], text: str, pos: int,
                end: int, max_misses: int) -> list[tuple[int, int]]: ...
