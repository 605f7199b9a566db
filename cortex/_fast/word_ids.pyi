"""Contract of the Cython unit ``cortex._fast.word_ids``: an ASCII word -> token ids cache.

``WordIds(max_entries, max_word_chars)`` holds at most ``max_entries`` words; the put that
finds it full clears it first. ``put(word, ids)`` keeps ``ids`` (each in ``0 .. 2**32-1``, else
``OverflowError``) for a non-empty ASCII ``word`` of at most ``max_word_chars`` characters with
at most that many ids, and returns True; it keeps nothing and returns False otherwise. A word
already held keeps its first ids (values are deterministic per word). ``get(word)`` is the ids
kept for ``word`` as a tuple, or ``None``. ``len`` counts words held; ``clear`` forgets them
all. ``memory_bytes`` is what the table has allocated. ``max_entries * max_word_chars`` must be
below ``2**31``.

``ascii_words.DeepSeekV3Words.cached_ids`` reads the table from C, without a ``str`` per word.
"""

class WordIds:
    max_entries: int
    max_word_chars: int
    memory_bytes: int

    def __init__(self, max_entries: int, max_word_chars: int) -> None: ...
    def __len__(self) -> int: ...
    def get(self, word: str) -> tuple[int, ...] | None: ...
    def put(self, word: str, ids: object) -> bool: ...
    def clear(self) -> None: ...
