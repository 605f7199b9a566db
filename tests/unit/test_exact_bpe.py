"""``ExactBpe``: tokenizers until the start check proves fastokens exact; any difference, a
library that cannot load, or an encode that fails keeps (or falls back to) tokenizers, said
once and counted."""

from __future__ import annotations

import sys

from cortex.profile.model_profile import ProfileSpec, load_profile
from cortex.tokenize.exact_bpe import FASTOKENS, TOKENIZERS, ExactBpe, check_corpus, start_check
from tests import deepseek_profile as ds


def _bpe() -> ExactBpe:
    return ExactBpe(ds.tokenizer(), ds.tokenizer_json_bytes().decode())


def test_a_profile_starts_on_tokenizers_and_moves_to_fastokens_after_the_check() -> None:
    profile = load_profile(ProfileSpec("m", None, 16, builtin="deepseek"))
    assert profile.bpe.backend == TOKENIZERS and profile.bpe.why_not == "not checked yet"
    cache = profile.new_cached_tokenizer()
    text = "Hello 世界 🙂\n\tdef f(): return 42"
    want = ds.tokenizer().encode(text, add_special_tokens=False).ids
    assert cache.encode(text) == want
    assert profile.bpe.upgrade() is None
    assert profile.bpe.backend == FASTOKENS and profile.bpe.why_not is None
    added = [t.content for t in ds.tokenizer().get_added_tokens_decoder().values()]
    assert profile.bpe.checked_texts == len(list(check_corpus(added)))
    assert profile.new_cached_tokenizer().encode(text) == want
    assert profile.bpe.upgrade() is None  # once


def test_the_corpus_covers_every_added_token_and_is_fixed() -> None:
    added = [t.content for t in ds.tokenizer().get_added_tokens_decoder().values()]
    texts = list(check_corpus(added))
    assert texts == list(check_corpus(added))  # seeded: the same check on every start
    joined = "".join(texts)
    assert all(token in joined for token in added)
    assert any("\x00" in t for t in texts) and any("中" in t for t in texts)


class _OffByOne:
    """A BPE that gets one text wrong: what a broken or mismatched library would do."""

    def __init__(self, wrong: str) -> None:
        self.wrong = wrong

    def encode(self, text: str, add_special_tokens: bool = False):
        ids = ds.tokenizer().encode(text, add_special_tokens=add_special_tokens).ids
        if text == self.wrong:
            ids = [*ids, 1]
        return type("E", (), {"ids": ids})()


def test_one_differing_text_keeps_tokenizers_and_says_which() -> None:
    texts = ["plain", "the odd one 中文", "after"]
    why = start_check(_OffByOne("the odd one 中文"), ds.tokenizer(), texts)
    assert why is not None and "the odd one 中文" in why and "add_special_tokens=False" in why
    assert start_check(_OffByOne("none of these"), ds.tokenizer(), texts) is None


def test_a_library_that_cannot_load_keeps_tokenizers(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "fastokens", None)  # import fails
    bpe = _bpe()
    why = bpe.upgrade()
    assert why is not None and why.startswith("fastokens cannot load")
    assert bpe.backend == TOKENIZERS and bpe.ids("a b").tolist() == ds.tokenizer().encode(
        "a b", add_special_tokens=False).ids


def test_a_failing_encode_is_answered_by_tokenizers_and_counted() -> None:
    bpe = _bpe()
    assert bpe.upgrade() is None

    class Failing:
        def encode_batch_flat(self, texts):
            raise RuntimeError("PCRE2 match limit")

    bpe._fast = Failing()
    want = ds.tokenizer().encode("x y", add_special_tokens=False).ids
    assert bpe.ids("x y").tolist() == want
    assert [a.tolist() for a in bpe.ids_many(["x y", ""])] == [want, []]
    assert bpe.fallbacks == 2


def test_without_a_tokenizer_json_only_the_reference() -> None:
    bpe = ExactBpe(ds.tokenizer(), None)
    assert bpe.upgrade() == "no tokenizer.json to load it from" and bpe.backend == TOKENIZERS


def test_checked_in_one_thread_used_after_activate_in_another() -> None:
    bpe = _bpe()
    assert bpe.upgrade(activate=False) is None and bpe.backend == TOKENIZERS
    assert bpe.activate() > 0 and bpe.backend == FASTOKENS  # its first encode, paid here
    assert bpe.activate() == 0.0
