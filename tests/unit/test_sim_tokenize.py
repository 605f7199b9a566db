"""The simulator tokenizes like an engine (one full encode), and Cortex's request path (segment
cache) must agree with it token for token: the simulator is the independent check."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cortex.errors import BadRequest
from cortex.profile.request_keys import prompt_token_ids
from cortex.prompt.request_text import chat_prompt, completions_prompt, generate_prompt
from cortex.sim.tokenize import MEDIA_PLACEHOLDER, SimTokenizer
from tests import deepseek_profile as ds
from tests.sim_engine_profile import SYSTEM, deepseek


def cortex_chat_ids(body: dict) -> list[int]:
    profile = deepseek()
    assert profile.chat_templates is not None
    prompt = chat_prompt(body, profile.chat_templates)
    return prompt_token_ids(prompt, profile.new_cached_tokenizer()).tolist()


CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello,  world!\n\n"}],
    [{"role": "system", "content": "Système: réponds en français 🙂"},
     {"role": "user", "content": "Quelle heure est-il ?"},
     {"role": "assistant", "content": "Il est midi."},
     {"role": "user", "content": "   et   maintenant\t?"}],
    [{"role": "user", "content": "x" * 500}, {"role": "assistant", "content": "ok"},
     {"role": "user", "content": "  leading and trailing  "}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_chat_ids_equal_cortex_request_path(messages):
    body = {"messages": messages}
    sim = SimTokenizer(deepseek()).chat_ids(body)
    assert sim == cortex_chat_ids(body)
    assert sim[0] == deepseek().bos_id  # the template writes BOS


def test_continue_final_message_cuts_after_the_last_content():
    body = {"messages": [{"role": "user", "content": "Write a poem"},
                         {"role": "assistant", "content": "Roses are"}],
            "continue_final_message": True, "add_generation_prompt": False}
    sim = SimTokenizer(deepseek()).chat_ids(body)
    assert ds.tokenizer().decode(sim, skip_special_tokens=False).endswith("Roses are")
    assert sim == cortex_chat_ids(body)


@pytest.mark.parametrize("text", ["Once upon a time", " leading space", "日本語のテキスト", "a\n\nb"])
def test_text_prompts_equal_cortex_request_path(text):
    sim = SimTokenizer(deepseek())
    tokenizer = deepseek().new_cached_tokenizer()
    body = {"prompt": text}
    assert sim.prompt_ids(body, text, "prompt") == \
        prompt_token_ids(completions_prompt(body), tokenizer).tolist()
    body = {"text": text}
    assert sim.prompt_ids(body, text, "text") == \
        prompt_token_ids(generate_prompt(body), tokenizer).tolist()


def test_media_parts_become_a_placeholder_after_the_text_cortex_routes_on():
    body = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "Describe"}, {"type": "image_url", "image_url": {"url": "x"}},
        {"type": "text", "text": "briefly"}]}]}
    sim = SimTokenizer(deepseek()).chat_ids(body)
    text = ds.tokenizer().decode(sim, skip_special_tokens=False)
    assert f"Describe\n{MEDIA_PLACEHOLDER}\nbriefly" in text


def test_token_ids_are_taken_as_sent_and_batches_refused():
    sim = SimTokenizer(None)
    assert sim.prompt_ids({}, [5, 6, 7], "prompt") == [5, 6, 7]
    assert sim.prompt_ids({}, [[5, 6, 7]], "prompt") == [5, 6, 7]
    for bad in ([[1], [2]], [], "text without a tokenizer", [1.5]):
        with pytest.raises(BadRequest):
            sim.prompt_ids({}, bad, "prompt")
    with pytest.raises(BadRequest):
        sim.chat_ids({"messages": [{"role": "user", "content": "hi"}]})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.text(min_size=0, max_size=80), min_size=1, max_size=5))
def test_random_conversations_agree_with_cortex(contents):
    roles = ["user", "assistant"]
    messages = [{"role": roles[i % 2], "content": c} for i, c in enumerate(contents)]
    body = {"messages": messages}
    assert SimTokenizer(deepseek()).chat_ids(body) == cortex_chat_ids(body)


def test_a_repeated_text_is_remembered_and_the_memo_is_bounded(monkeypatch):
    monkeypatch.setattr("cortex.sim.tokenize.MEMO_ENTRIES", 2)
    sim = SimTokenizer(deepseek())
    first = sim.prompt_ids({}, "hello world", "prompt")
    first.append(1)  # callers get their own list
    assert sim.prompt_ids({}, "hello world", "prompt") == ds.tokenizer().encode("hello world").ids
    for text in ("a", "b", "c"):
        sim.prompt_ids({}, text, "prompt")
    assert len(sim._memo) == 2
