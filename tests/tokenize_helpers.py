"""Helpers of the tokenization property tests: a tiny vocabulary built to collide, and the
request path's ``encode_now`` finished as ``trio_tokenize`` would finish it."""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

from cortex.tokenize.segment_cache import Lookup, SegmentCachedTokenizer


def colliding_tokenizer(raw: list[str], normalized: list[str], alphabet: str) -> Tokenizer:
    """One token per character of ``alphabet`` (each character its own pre-token), with the
    added tokens ``raw`` (``normalized: false``) and ``normalized`` over them: the vocabulary
    decides nothing, so the ids show exactly where the added tokens were cut."""
    vocab = {c: i for i, c in enumerate(alphabet)}
    vocab["[UNK]"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.add_special_tokens([AddedToken(t, normalized=False) for t in raw])
    tok.add_tokens([AddedToken(t, normalized=True) for t in normalized])
    return tok


def encode_now_ids(cache: SegmentCachedTokenizer, text: str, bos: bool,
                   offload_min: int) -> list[int]:
    """``encode_now``'s ids; a ``Lookup`` handed off is finished as a worker thread would."""
    found = cache.encode_now(text, bos, offload_min)
    if isinstance(found, Lookup):
        found = cache.finish(found, cache.encode_pieces(found.cold))
    return found.tolist()
