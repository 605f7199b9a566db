"""``FastPieceEncoder``: the exact token ids of a pure-ASCII piece without ``Tokenizer.encode``.

Most of ``Tokenizer.encode``'s time on a short English message goes to its pre-tokenizer (onig
regexes over Unicode classes, ~100 of ~113 µs for 55 tokens, measured). For ASCII text those
classes have a small exact meaning, so the same splits are made here with Python ``re``, the
bytes mapped as ``ByteLevel`` maps them, and each word run through the tokenizer's own model
(``model.tokenize``), with a bounded cache of ids per word.

Applies (decided once per tokenizer; ``why_not_fast`` says why not, like
``Segmenter.why_not_splitting``) only when every step is modelled exactly:

* no normalizer (absent or an empty ``Sequence``), or ``NFC``/``NFKC`` (Qwen2.5's): both are
  the identity on ASCII text, and only ASCII pieces are encoded here; no truncation, no
  padding; the post-processor absent or ``ByteLevel`` (it trims offsets, never changes ids);
* pre-tokenizer: a ``Sequence`` of ``Split(Regex, behavior=Isolated, invert=false)`` followed by
  one ``ByteLevel(add_prefix_space=false, use_regex=false)``, every regex translatable
  (``onig_ascii.translate``) and unable to match the empty string;
* model: ``BPE`` without dropout (deterministic; merges, unknowns, byte fallback are the
  model's own business since the model itself is called);
* added tokens: the segmenter splits (``why_not_splitting`` is ``None``) at every added token
  the tokenizer has, so an ordinary piece it produces contains none — leftmost-longest matching
  leaves no whole token inside a gap — and ``encode`` of the piece never meets one.

and per piece only when the piece is pure ASCII; ``encode`` returns ``None`` otherwise and the
caller uses ``Tokenizer.encode``.

Translation of the pattern to ASCII: ``cortex.profile.onig_ascii``.

Isolated splits: matches and the gaps between them are pieces, empty ones dropped; each later
split applies within every piece of the earlier ones (``tokenizers`` ``Pattern::find_matches``).
DeepSeek-V3's own pair of ASCII-relevant splits (``DEEPSEEK_V3_SPLITS``, recognised by their
translations) is split natively instead, by ``cortex._fast.ascii_words`` from a flag table of
the pattern's own classes, which also takes the words' cached ids in the same pass; the ``re``
path is its reference (property-tested equal). Qwen2's and Llama-3's one split (``QWEN2_SPLIT``,
``LLAMA3_SPLIT``) likewise, by ``ascii_words.Qwen2Words``. The two ``re.split`` passes were two
thirds of a new message's encode: ``perf/bench_tokenize.py`` ``new_message`` 0.29x -> 0.09x of ``encode``.

The word cache is a ``cortex._fast.word_ids.WordIds`` table of at most ``word_cache_entries``
words (cleared when full) of at most ``MAX_CACHED_WORD_CHARS`` chars (at most 4 MB of slots,
4 of word bytes and 16 of ids; prose fills a few hundred KB): the
native splitter reads a piece's cached words' ids straight from it, with no ``str`` per word
(a ``dict`` cost ~90 ns a word, most of a new message's encode). Values are deterministic per
word, and every table call holds the GIL, so concurrent use from a worker thread can at worst
recompute, never return wrong ids.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from cortex._fast.ascii_words import DeepSeekV3Words, Qwen2Words
from cortex._fast.word_ids import WordIds
from cortex.profile.onig_ascii import (
    ASCII,
    CATEGORIES,
    ONIG_SPACE,
    UnsupportedPattern,
    matches_no_ascii,
    parse_class,
    translate,
)
from cortex.profile.segments import Segmenter

MAX_CACHED_WORD_CHARS = 64
ASCII_IDENTITY_NORMALIZERS = ("NFC", "NFKC")  # leave every ASCII text as it is
WORD_CACHE_ENTRIES = 1 << 16


# DeepSeek-V3's splits that can match ASCII (its CJK split cannot), as tokenizer.json has them:
# this pair has a native splitter, ``cortex._fast.ascii_words`` (same words, one C pass).
DEEPSEEK_V3_SPLITS = (
    r"\p{N}{1,3}",
    ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
     "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"),
)


def deepseek_v3_flags() -> bytes:
    """The flag table of ``ascii_words.DeepSeekV3Words``, from the second pattern's own classes
    (in order: lead, letters, optional, letters and marks, punctuation and symbols, CR LF twice);
    raises ``UnsupportedPattern`` if they are not shaped as the native splitter assumes."""
    pattern = DEEPSEEK_V3_SPLITS[1]
    classes = []
    i = pattern.find("[")
    while i >= 0:
        codes, i = parse_class(pattern, i)
        classes.append(codes)
        i = pattern.find("[", i)
    lead, letters, optional, letters_marks, punct, newline, newline_again = classes
    digits = CATEGORIES["N"]
    if not (letters == letters_marks and newline == newline_again == {0x0A, 0x0D}
            and newline <= ONIG_SPACE and 0x20 not in punct
            and not digits & (lead | letters | punct | ONIG_SPACE)):
        raise UnsupportedPattern("DeepSeek-V3 classes not shaped as the native splitter assumes")
    table = bytearray(128)
    for flag, codes in ((1, letters), (2, punct), (4, lead), (8, optional), (16, ONIG_SPACE),
                        (32, newline), (64, digits)):
        for code in codes:
            table[code] |= flag
    return bytes(table)


# Qwen2's one split (Llama-3's is the same with ``\p{N}{1,3}``): natively ``ascii_words.Qwen2Words``.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
               r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = QWEN2_SPLIT.replace("|\\p{N}|", "|\\p{N}{1,3}|")


def qwen2_flags() -> bytes:
    """The flag table of ``ascii_words.Qwen2Words``, from ``QWEN2_SPLIT``'s own classes (in
    order: optional, other, CR LF twice); raises ``UnsupportedPattern`` if they are not shaped
    as the native splitter assumes."""
    classes = []
    i = QWEN2_SPLIT.find("[")
    while i >= 0:
        codes, i = parse_class(QWEN2_SPLIT, i)
        classes.append(codes)
        i = QWEN2_SPLIT.find("[", i)
    optional, other, newline, newline_again = classes
    letters, digits = CATEGORIES["L"], CATEGORIES["N"]
    if not (newline == newline_again == {0x0A, 0x0D} and newline <= ONIG_SPACE
            and other == ASCII - ONIG_SPACE - letters - digits
            and optional == ASCII - newline - letters - digits and not letters & digits):
        raise UnsupportedPattern("Qwen2 classes not shaped as the native splitter assumes")
    table = bytearray(128)
    for flag, codes in ((1, letters), (2, other), (8, optional), (16, ONIG_SPACE),
                        (32, newline), (64, digits)):
        for code in codes:
            table[code] |= flag
    return bytes(table)


def _native_splitter(translated: list[str]) -> DeepSeekV3Words | None:
    """The native splitter when ``translated`` are DeepSeek-V3's splits or Qwen2's or Llama-3's
    one, else None."""
    if translated == [translate(p) for p in DEEPSEEK_V3_SPLITS]:
        return DeepSeekV3Words(deepseek_v3_flags())
    for split, max_digits in ((QWEN2_SPLIT, 1), (LLAMA3_SPLIT, 3)):
        if translated == [translate(split)]:
            return Qwen2Words(qwen2_flags(), max_digits)
    return None


def _byte_level_table() -> dict[int, str]:
    """ASCII code point -> ByteLevel's character for that byte, asked of ``tokenizers`` itself."""
    from tokenizers import pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    table = {}
    for cp in range(128):
        ((mapped, _),) = byte_level.pre_tokenize_str(chr(cp))
        table[cp] = mapped
    return table


def _state(component: Any) -> Any:
    return None if component is None else json.loads(component.__getstate__())


def _why_not(tokenizer: Any, segmenter: Segmenter) -> tuple[str | None, list[str]]:
    """Why this tokenizer is not modelled exactly (or ``None``), and its split patterns."""
    if tokenizer.truncation is not None or tokenizer.padding is not None:
        return "truncation or padding is set", []
    normalizer = _state(tokenizer.normalizer)
    if normalizer is not None and not (
        normalizer.get("type") == "Sequence" and not normalizer.get("normalizers")
    ) and normalizer.get("type") not in ASCII_IDENTITY_NORMALIZERS:
        return f"normalizer {normalizer.get('type')} is not modelled", []
    post = _state(tokenizer.post_processor)
    if post is not None and post.get("type") != "ByteLevel":
        return f"post-processor {post.get('type')} is not modelled", []
    model_type = type(tokenizer.model).__name__
    if model_type != "BPE" or tokenizer.model.dropout not in (None, 0.0):
        return f"model {model_type} with dropout {getattr(tokenizer.model, 'dropout', None)}", []
    pre = _state(tokenizer.pre_tokenizer)
    steps = pre.get("pretokenizers", []) if pre and pre.get("type") == "Sequence" else [pre]
    last = steps[-1] if steps else None
    if not (
        isinstance(last, dict)
        and last.get("type") == "ByteLevel"
        and last.get("add_prefix_space") is False
        and last.get("use_regex") is False
    ):
        return "pre-tokenizer does not end in ByteLevel(add_prefix_space=false, use_regex=false)", []
    patterns = []
    for step in steps[:-1]:
        regex = (step.get("pattern") or {}).get("Regex")
        if step.get("type") != "Split" or step.get("behavior") != "Isolated" or step.get(
            "invert"
        ) or not isinstance(regex, str):
            return f"pre-tokenizer step {json.dumps(step)[:80]} is not Split(Regex, Isolated)", []
        try:
            patterns.append(translate(regex))
        except UnsupportedPattern as exc:
            return f"Split regex {regex[:40]!r}: {exc}", []
    if segmenter.why_not_splitting is not None:
        return f"the segmenter does not split ({segmenter.why_not_splitting})", []
    added = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.content}
    missing = added - segmenter.tokens
    if missing:
        return f"the segmenter does not split at {len(missing)} added tokens", []
    return None, patterns


class FastPieceEncoder:
    """Exact ids of ASCII pieces that ``segmenter`` produced, for ``tokenizer`` (see module
    docstring); ``encode`` returns ``None`` where it does not apply."""

    __slots__ = ("_bytes", "_model", "_native", "_splits", "_words", "why_not_fast")

    def __init__(
        self, tokenizer: Any, segmenter: Segmenter, *, word_cache_entries: int = WORD_CACHE_ENTRIES
    ) -> None:
        self.why_not_fast, patterns = _why_not(tokenizer, segmenter)
        # one capturing group around the whole pattern: ``split`` then keeps the matches; a
        # split that can match no ASCII text leaves every ASCII piece whole, so it is skipped
        ascii_patterns = [p for p in patterns if not matches_no_ascii(p)]
        self._splits = [re.compile(f"({p})") for p in ascii_patterns]
        self._native = _native_splitter(ascii_patterns) if self.why_not_fast is None else None
        self._model = tokenizer.model
        self._bytes = _byte_level_table() if self.why_not_fast is None else {}
        self._words = WordIds(word_cache_entries, MAX_CACHED_WORD_CHARS)

    @property
    def enabled(self) -> bool:
        return self.why_not_fast is None

    @property
    def native_words(self) -> tuple[DeepSeekV3Words, WordIds] | None:
        """The native splitter and the word table ``encode`` reads first (``cached_ids``), for a
        compiled caller that tries them before ``encode`` itself; ``None`` when ``encode`` does
        not start there (not enabled, or no native splitter)."""
        if self.why_not_fast is not None or self._native is None:
            return None
        return self._native, self._words

    @property
    def cached_words(self) -> int:
        return len(self._words)

    def clear_words(self) -> None:
        self._words.clear()

    def encode(self, piece: str) -> Sequence[int] | None:
        """Token ids of ``piece`` (ordinary text from the segmenter; ``array('I')`` when every
        word was cached, else a list), or ``None``: not ASCII or the tokenizer is not
        modelled."""
        if self.why_not_fast is not None or not piece.isascii():
            return None
        table = self._words
        native = self._native
        if native is not None:
            found = native.cached_ids(piece, table)  # the common case: every word seen before
            if found is not None:
                return found
            words = native.words(piece)
        else:
            words = self.regex_words(piece)
        ids: list[int] = []
        for word in words:
            word_ids = table.get(word)
            if word_ids is None:
                word_ids = tuple(t.id for t in self._model.tokenize(word.translate(self._bytes)))
                table.put(word, word_ids)  # kept unless too long (``MAX_CACHED_WORD_CHARS``)
            ids.extend(word_ids)
        return ids

    @property
    def native(self) -> bool:
        """Words come from the native splitter (``cortex._fast.ascii_words``), not ``re``."""
        return self._native is not None

    def regex_words(self, piece: str) -> list[str]:
        """The words of an ASCII ``piece``, split with ``re`` (the native splitter's reference)."""
        words = [piece]
        for pattern in self._splits:
            words = _isolate(pattern, words)
        return words


def _isolate(pattern: re.Pattern[str], texts: list[str]) -> list[str]:
    """``Split(pattern, Isolated)`` of each text: matches and gaps, in order, none empty.

    ``pattern`` is one capturing group, so ``split`` returns gap, match, gap, ..., gap."""
    if len(texts) == 1:
        return list(filter(None, pattern.split(texts[0])))
    return [part for text in texts for part in pattern.split(text) if part]
