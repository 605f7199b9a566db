"""Segmenter: cuts exactly where ``tokenizers`` cuts at added tokens — checked against real
``tokenizers`` objects built in memory, so the library's behaviour is proven, not assumed."""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers

from cortex.tokenize.segment_cache import SegmentCachedTokenizer
from cortex.tokenize.segments import Segmenter
from tests import deepseek_profile as ds


def char_tokenizer(normalizer=None) -> Tokenizer:
    vocab = {c: i for i, c in enumerate("abcdefxyz <>|")}
    vocab["[UNK]"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # one char per pre-token
    if normalizer is not None:
        tok.normalizer = normalizer
    return tok


def segmenter_of(tok: Tokenizer) -> Segmenter:
    return Segmenter.from_tokenizer_json(tok.to_str())


def pieces(seg: Segmenter, text: str) -> list[str]:
    return [p for p, _ in seg.split(text)]


def test_raw_tokens_are_matched_before_normalized_ones():
    tok = char_tokenizer()
    tok.add_tokens([AddedToken("ab", normalized=True)])
    tok.add_special_tokens([AddedToken("bc", normalized=False)])
    seg = segmenter_of(tok)
    # One pass over both would take "ab" (leftmost); tokenizers takes the raw "bc" first.
    assert pieces(seg, "abc") == ["a", "bc"]
    assert pieces(seg, "abxab") == ["ab", "x", "ab"]
    for text in ["abc", "abxab", "xbcab", "aab bcc"]:
        ids = SegmentCachedTokenizer(tok, seg).encode(text)
        assert ids == tok.encode(text, add_special_tokens=False).ids


def test_leftmost_then_longest_without_overlap():
    tok = char_tokenizer()
    tok.add_special_tokens(
        [AddedToken(t, normalized=False) for t in ["<a>", "<a>b", "a>b>", "|x|"]]
    )
    seg = segmenter_of(tok)
    assert pieces(seg, "z<a>b>") == ["z", "<a>b", ">"]
    assert pieces(seg, "<a|x|") == ["<a", "|x|"]
    for text in ["z<a>b>", "<a>b>b<a>", "|x||x|<a>", "a>b><a>b"]:
        assert SegmentCachedTokenizer(tok, seg).encode(text) == tok.encode(
            text, add_special_tokens=False
        ).ids


def test_many_first_characters_branch_at_the_root_of_the_trie():
    tok = char_tokenizer()
    tok.add_special_tokens([AddedToken(c + "|", normalized=False) for c in "abcdefxyz<>"])
    seg = segmenter_of(tok)
    text = "a|zz|>x<|| b|"
    assert "".join(pieces(seg, text)) == text
    assert SegmentCachedTokenizer(tok, seg).encode(text) == tok.encode(
        text, add_special_tokens=False
    ).ids


def test_normalized_tokens_are_left_to_the_tokenizer_when_the_normalizer_changes_text():
    tok = char_tokenizer(normalizers.Lowercase())
    tok.add_tokens([AddedToken("ab", normalized=True)])
    seg = segmenter_of(tok)
    assert pieces(seg, "xAbx") == ["xAbx"]
    assert SegmentCachedTokenizer(tok, seg).encode("xAbx") == tok.encode(
        "xAbx", add_special_tokens=False
    ).ids


def test_lstrip_tokens_turn_splitting_off():
    tok = char_tokenizer()
    tok.add_special_tokens([AddedToken("<a>", normalized=False, lstrip=True)])
    seg = segmenter_of(tok)
    assert seg.why_not_splitting
    assert pieces(seg, "x <a> y") == ["x <a> y"]
    assert SegmentCachedTokenizer(tok, seg).encode("x <a> y") == tok.encode(
        "x <a> y", add_special_tokens=False
    ).ids


def test_deepseek_chat_markers_split_and_texts_concatenate_back():
    seg = Segmenter.from_tokenizer_json(ds.tokenizer_json_bytes())
    text = f"{ds.BOS}sys<｜User｜>hi <｜tr｜>x<｜Assistant｜>ok{ds.EOS}<｜User｜"
    got = seg.split(text)
    assert [p for p, _ in got] == [
        ds.BOS, "sys", "<｜User｜>", "hi ", "<｜tr｜>", "x", "<｜Assistant｜>", "ok", ds.EOS,
        "<｜User｜",
    ]
    assert got[0][1] == 0 and got[-1][1] is None
    assert seg.split("") == []


def test_metaspace_prepending_to_the_first_split_only_turns_splitting_off():
    vocab = {"▁a": 0, "a": 1, "b": 2, "▁b": 3, "[UNK]": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Metaspace(prepend_scheme="first")]
    )
    tok.add_special_tokens([AddedToken("<x>", normalized=False)])
    # Encoding the piece after <x> on its own would prefix it: "▁b" instead of "b".
    assert tok.encode("a<x>b", add_special_tokens=False).tokens == ["▁a", "<x>", "b"]
    assert tok.encode("b", add_special_tokens=False).tokens == ["▁b"]
    seg = segmenter_of(tok)
    assert seg.why_not_splitting and pieces(seg, "a<x>b") == ["a<x>b"]
    assert SegmentCachedTokenizer(tok, seg).encode("a<x>b") == tok.encode(
        "a<x>b", add_special_tokens=False
    ).ids


def test_byte_level_prefix_space_is_added_to_every_split_so_pieces_stay_exact():
    vocab = {"Ġa": 0, "a": 1, "b": 2, "Ġb": 3, "[UNK]": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.add_special_tokens([AddedToken("<x>", normalized=False)])
    seg = segmenter_of(tok)
    assert pieces(seg, "a<x>b") == ["a", "<x>", "b"]
    assert tok.encode("a<x>b", add_special_tokens=False).tokens == ["Ġa", "<x>", "Ġb"]
    assert SegmentCachedTokenizer(tok, seg).encode("a<x>b") == tok.encode(
        "a<x>b", add_special_tokens=False
    ).ids
