"""FastPieceEncoder: the regex translation (each ASCII class as onig itself has it), which
tokenizers and pieces it applies to, and the slow path for everything else."""

from __future__ import annotations

import json

import pytest
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from cortex.profile.fast_pieces import FastPieceEncoder
from cortex.profile.onig_ascii import ASCII, UnsupportedPattern, matches_no_ascii, translate
from cortex.profile.segment_cache import SegmentCachedTokenizer
from cortex.profile.segments import AddedToken, Segmenter
from tests import deepseek_profile as ds

DS_TOK = ds.tokenizer()
DS_SEG = Segmenter.from_tokenizer_json(ds.tokenizer_json_bytes())
DS_FAST = FastPieceEncoder(DS_TOK, DS_SEG)
DS_SPLITS = [
    step["pattern"]["Regex"]
    for step in json.loads(ds.tokenizer_json_bytes())["pre_tokenizer"]["pretokenizers"]
    if step["type"] == "Split"
]


def plain(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def onig_matches(pattern: str, text: str) -> list[str]:
    """The matches of ``pattern`` in ``text`` as tokenizers' onig finds them."""
    split = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    removed = pre_tokenizers.Split(Regex(pattern), behavior="removed")
    gaps = {span for _, span in removed.pre_tokenize_str(text)}
    return [piece for piece, span in split.pre_tokenize_str(text) if span not in gaps]


@pytest.mark.parametrize(
    "cls",
    [r"\p{L}", r"\p{N}", r"\p{P}", r"\p{S}", r"\p{M}", r"\p{Z}", r"\p{C}", r"\p{Lu}",
     r"\p{Nd}", r"\P{L}", r"\s", r"\S", r"[^\r\n\p{L}\p{P}\p{S}]", r"[\p{L}\p{M}]",
     r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]", r"[A-Za-z]", r"[一-龥぀-ゟ゠-ヿ]", r"[ -~]",
     r"[\t-\r]"],
)
def test_each_ascii_class_is_what_onig_matches(cls: str) -> None:
    import re

    translated = re.compile(translate(cls))
    for cp in ASCII:
        ch = chr(cp)
        assert bool(translated.fullmatch(ch)) == (onig_matches(cls, ch) == [ch]), (cls, cp)


@pytest.mark.parametrize("pattern", DS_SPLITS)
def test_deepseek_splits_find_what_onig_finds(pattern: str) -> None:
    import re

    translated = re.compile(translate(pattern))
    text = "".join(chr(c) for c in range(128)) + " Hello,  world!\r\n\n  x 1234 it's\t\tok  "
    assert [m.group(0) for m in translated.finditer(text)] == onig_matches(pattern, text)


@pytest.mark.parametrize(
    "pattern",
    [r"a.b", r"^a", r"a$", r"\bword", r"(?i:[a])", r"(?i:a+)", r"(?i)a", r"(?i:é)", r"(?<=a)b", r"a++", r"a{2}+", r"\d+", r"\w",
     r"[a[b]]", r"[a&&b]", r"\p{Letter}", r"a*", r"(?:x)?", r"\x41", r"a{", r"\1",
     r"[\s-a]", r"[a-\s]", r"(?#c)a", r"a)"],
)
def test_unmodelled_constructs_are_refused(pattern: str) -> None:
    with pytest.raises(UnsupportedPattern):
        translate(pattern)


def test_a_caseless_group_of_literals_finds_what_onig_finds() -> None:
    import re

    pattern = r"(?i:'s|'t|'re|'ll)|[a-z]+|\s+"
    translated = re.compile(translate(pattern))
    text = "it's IT'S we'LL they'Re 'T 'x ' s ''s"
    assert [m.group(0) for m in translated.finditer(text)] == onig_matches(pattern, text)


@pytest.mark.parametrize(("pattern", "no_ascii"), [
    (r"[一-龥぀-ゟ゠-ヿ]+", True), (r"[一-龥]{2,5}", True), (r"[一-龥]+?", True), (r"é", False),
    (r"[一-龥]+|a", False), (r"[一-龥]a", False), (r"\p{N}{1,3}", False), (r"[^a]+", False),
])
def test_a_split_that_can_match_no_ascii_text_is_recognised(pattern: str, no_ascii: bool) -> None:
    # "é" is a literal, not a class: left in (still exact, just not skipped)
    assert matches_no_ascii(translate(pattern)) is no_ascii


def test_deepseek_skips_its_cjk_split_for_ascii_pieces():
    assert len(DS_SPLITS) == 3 and len(DS_FAST._splits) == 2


def test_deepseek_is_modelled_and_its_ascii_pieces_are_exact():
    assert DS_FAST.enabled, DS_FAST.why_not_fast
    text = "Route 66: the KV-cache router's p99 is  12.5 ms\r\n\tok?!  \x00\x1c\x7f"
    assert list(DS_FAST.encode(text)) == plain(DS_TOK, text)
    assert list(DS_FAST.encode(text)) == plain(DS_TOK, text)  # now from the word cache


def test_non_ascii_piece_goes_to_the_slow_path():
    assert DS_FAST.encode("café au lait") is None
    cache = SegmentCachedTokenizer(DS_TOK, DS_SEG, fast=DS_FAST)
    text = f"plain ascii{ds.BOS}café 中文 🙂"
    assert cache.encode(text) == plain(DS_TOK, text)


def test_word_cache_is_bounded():
    fast = FastPieceEncoder(DS_TOK, DS_SEG, word_cache_entries=4)
    text = "one two three four five six seven"
    assert list(fast.encode(text)) == plain(DS_TOK, text)
    assert 0 < fast.cached_words <= 4
    assert list(fast.encode(text)) == plain(DS_TOK, text)


def test_a_segmenter_that_does_not_split_turns_it_off():
    never = Segmenter.never("the tokenizer encodes special tokens as text")
    fast = FastPieceEncoder(DS_TOK, never)
    assert not fast.enabled and "does not split" in fast.why_not_fast
    assert fast.encode("<think>hi</think>") is None
    # a segmenter that knows none of the added tokens: "<think>" could hide in a piece
    blind = FastPieceEncoder(DS_TOK, Segmenter({}))
    assert not blind.enabled and "added tokens" in blind.why_not_fast
    cache = SegmentCachedTokenizer(DS_TOK, never, fast=fast)
    assert cache.encode("<think>hi</think>") == plain(DS_TOK, "<think>hi</think>")


# A small byte-level BPE (every byte its own token, one merge) to vary the configuration.
def small_tokenizer() -> Tokenizer:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    vocab["ab"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, [("a", "b")]))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}{1,3}"), behavior="isolated"),
        pre_tokenizers.Split(Regex(r" ?\p{L}+|\s+(?!\S)|\s+"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def small_segmenter(tok: Tokenizer) -> Segmenter:
    return Segmenter.from_added_tokens(
        [AddedToken(t.content, i, t.special, t.normalized)
         for i, t in tok.get_added_tokens_decoder().items()],
        identity_normalizer=True,
    )


def test_an_empty_pre_tokenizer_sequence_is_refused():
    tok = small_tokenizer()
    tok.pre_tokenizer = pre_tokenizers.Sequence([])
    assert not FastPieceEncoder(tok, small_segmenter(tok)).enabled


def test_a_small_byte_level_bpe_is_modelled_exactly():
    tok = small_tokenizer()
    tok.add_special_tokens(["<x>"])
    fast = FastPieceEncoder(tok, small_segmenter(tok))
    assert fast.enabled, fast.why_not_fast
    for text in ["abab 123456 ab\n\n  cab", "a\tb  ", "x" * 100]:
        assert list(fast.encode(text)) == plain(tok, text)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda t: setattr(t, "normalizer", normalizers.Lowercase()), "normalizer"),
        (lambda t: t.enable_truncation(8), "truncation"),
        (lambda t: t.enable_padding(), "padding"),
        (lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.ByteLevel()), "ByteLevel"),
        (lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"\s+"), behavior="removed"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])), "Split"),
        (lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"(?i:'s)|\w+"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])), "regex"),
        (lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"\s+"), behavior="isolated", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])), "Split"),
        (lambda t: setattr(t, "model", models.BPE(
            {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}, [],
            dropout=0.5)), "dropout"),
    ],
)
def test_configurations_it_cannot_model_go_to_the_slow_path(change, reason: str) -> None:
    tok = small_tokenizer()
    change(tok)
    fast = FastPieceEncoder(tok, small_segmenter(tok))
    assert not fast.enabled and reason in fast.why_not_fast
    assert fast.encode("ab 12") is None
    cache = SegmentCachedTokenizer(tok, small_segmenter(tok), fast=fast)
    assert cache.encode("ab 12 ab") == plain(tok, "ab 12 ab")


def test_a_loaded_profile_decides_once_and_its_cached_tokenizers_use_it():
    from cortex.profile.model_profile import ProfileSpec, load_profile

    profile = load_profile(ProfileSpec("deepseek", ds.TOKENIZER_JSON, block_size=16))
    assert profile.fast_pieces is not None and profile.fast_pieces.enabled
    cache = profile.new_cached_tokenizer()
    text = "A short new question: why 42?"
    assert cache.encode(text) == plain(DS_TOK, text)
    assert profile.fast_pieces.cached_words > 0
