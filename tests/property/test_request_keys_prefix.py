"""A follow-up turn's block keys start with the previous turn's keys (chat bodies through the
template, segment cache and block keys), and a different namespace never shares a key."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cortex.profile.request_keys import prompt_block_keys, prompt_token_ids
from cortex.prompt.request_text import chat_prompt
from cortex.tokenize.segment_cache import SegmentCachedTokenizer
from cortex.tokenize.segments import Segmenter
from tests import deepseek_profile as ds

_TEMPLATES = ds.chat_templates()
_CACHE = SegmentCachedTokenizer(ds.tokenizer(), Segmenter.from_tokenizer_json(
    ds.tokenizer_json_bytes()))


class _Profile:  # the two fields prompt_block_keys reads
    model = "ds"
    block_size = 4


_content = st.text(alphabet="ab é中\n<｜>", max_size=30)
_turns = st.lists(st.tuples(_content, _content), min_size=1, max_size=4)


def _body(turns: list[tuple[str, str]], extra_user: str | None, **kw: object) -> dict:
    messages = []
    for user, assistant in turns:
        messages += [{"role": "user", "content": user},
                     {"role": "assistant", "content": assistant}]
    if extra_user is not None:
        messages.append({"role": "user", "content": extra_user})
    return {"messages": messages, **kw}


@settings(max_examples=150, deadline=None)
@given(_turns, _content, st.sampled_from([None, "s1"]))
def test_next_turn_keys_extend_the_previous_turn(turns, new_user, salt):
    before = chat_prompt(_body(turns, None, add_generation_prompt=False, cache_salt=salt),
                         _TEMPLATES)
    after = chat_prompt(_body(turns, new_user, cache_salt=salt), _TEMPLATES)
    ids_before = prompt_token_ids(before, _CACHE).tolist()
    ids_after = prompt_token_ids(after, _CACHE).tolist()
    assert ids_after[: len(ids_before)] == ids_before  # the history ends with EOS: a hard cut
    keys_before = prompt_block_keys(_Profile, _CACHE, before)  # type: ignore[arg-type]
    keys_after = prompt_block_keys(_Profile, _CACHE, after)  # type: ignore[arg-type]
    assert len(keys_before) == len(ids_before) // 4
    assert keys_after[: len(keys_before)] == keys_before
    other = chat_prompt(_body(turns, new_user, cache_salt="other"), _TEMPLATES)
    other_keys = prompt_block_keys(_Profile, _CACHE, other)  # type: ignore[arg-type]
    assert not set(other_keys) & set(keys_after)
