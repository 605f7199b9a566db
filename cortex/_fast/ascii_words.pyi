"""Contract of the Cython unit ``cortex._fast.ascii_words``: the words of an ASCII piece under
the DeepSeek-V3 pre-tokenizer, without ``re``.

``DeepSeekV3Words(table).words(piece)`` equals, for every pure-ASCII ``piece``, the words
``FastPieceEncoder``'s regex path makes of it with DeepSeek-V3's two ASCII-relevant ``Split``
patterns (``\\p{N}{1,3}``, then ``[lead][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|
 ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+`` within each piece of the first), both
Isolated, empty pieces dropped; ``None`` for a piece that is not ASCII.
``cached_ids(piece, table)`` is those words' ids from ``table`` (``word_ids.WordIds``),
concatenated into a new ``array('I')``, or ``None`` at the first word ``table`` lacks (or for a
piece that is not ASCII).

``table``: 128 bytes, one per ASCII code point, OR of the flags letter 1, punctuation or symbol
2, the first alternative's lead class 4, the second alternative's optional class 8, onig
space 16, CR or LF 32, digit 64 (``fast_pieces.deepseek_v3_flags`` builds it).

``Qwen2Words(table, max_digits)``: the same two methods for Qwen2's one ``Split`` pattern
(``max_digits`` 1) or Llama-3's (3): ``(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|
\\p{N}{1,max_digits}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+``, Isolated;
``table`` flags: letter 1, ``[^\\s\\p{L}\\p{N}]`` 2, ``[^\\r\\n\\p{L}\\p{N}]`` 8, space 16, CR or LF
32, digit 64 (``fast_pieces.qwen2_flags`` builds it).
"""

from array import array

from cortex._fast.word_ids import WordIds

class DeepSeekV3Words:
    def __init__(self, table: bytes) -> None: ...
    def words(self, piece: str) -> list[str] | None: ...
    def cached_ids(self, piece: str, table: WordIds) -> array[int] | None: ...

class Qwen2Words(DeepSeekV3Words):
    def __init__(self, table: bytes, max_digits: int) -> None: ...
