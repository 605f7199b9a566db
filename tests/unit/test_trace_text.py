"""perf/trace_text.py: hash ids expand to text whose token prefixes follow the id prefixes."""

from __future__ import annotations

from functools import cache

from hypothesis import given, settings
from hypothesis import strategies as st

from perf import trace_text as tt
from tests import deepseek_profile as ds


@cache
def _text(block_tokens: int) -> tt.TraceText:
    return tt.TraceText(tt.single_token_words(ds.TOKENIZER_JSON), block_tokens)


@cache
def _template():
    return ds.chat_template()


def _tokens(text: tt.TraceText, record: tt.TraceRecord) -> list[int]:
    rendered = _template().render(text.messages(record), add_generation_prompt=True)
    return ds.tokenizer().encode(rendered, add_special_tokens=False).ids


def _record(ids: list[int], tail_tokens: int = 300) -> tt.TraceRecord:
    return tt.TraceRecord(0, 512 * (len(ids) - 1) + tail_tokens, 8, tuple(ids))


def test_words_are_single_tokens_in_a_run() -> None:
    words = tt.single_token_words(ds.TOKENIZER_JSON)
    assert len(words) > 1000
    run = "".join(" " + w for w in words[:500])
    assert len(ds.tokenizer().encode(run, add_special_tokens=False).ids) == 500


def test_same_id_same_text_and_counted_tokens() -> None:
    text = _text(64)
    record = _record([0, 5, 9])
    assert text.messages(record) == _text(64).messages(record)
    assert tt.TraceText(text.words, 64).messages(record) == text.messages(record)
    assert len(_tokens(text, record)) == text.prompt_tokens(record)


def test_last_block_scales_with_input_length() -> None:
    text = _text(64)
    assert text.last_block_tokens(_record([1, 2], tail_tokens=512)) == 64
    assert text.last_block_tokens(_record([1, 2], tail_tokens=256)) == 32
    assert text.last_block_tokens(_record([1, 2], tail_tokens=1)) == 2


@settings(max_examples=25, deadline=None)
@given(shared=st.lists(st.integers(0, 50), min_size=1, max_size=6),
       tail_a=st.lists(st.integers(100, 150), max_size=3),
       tail_b=st.lists(st.integers(200, 250), max_size=3),
       block_tokens=st.sampled_from([16, 64]))
def test_shared_id_prefix_gives_shared_token_prefix(shared: list[int], tail_a: list[int],
                                                    tail_b: list[int],
                                                    block_tokens: int) -> None:
    text = _text(block_tokens)
    a = _tokens(text, _record(shared + tail_a))
    b = _tokens(text, _record(shared + tail_b))
    common = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    k = len(shared) - (0 if tail_a and tail_b else 1)  # a last block may be cut short
    assert common >= 1 + k * block_tokens


def test_shared_prefix_workload_shape() -> None:
    records = list(tt.shared_prefix_records(4, 3, 2048, 128, 16, rate_per_s=10.0, seed=1))
    assert len(records) == 12
    systems = {r.hash_ids[:4] for r in records}
    assert len(systems) == 4
    questions = [r.hash_ids[4:] for r in records]
    assert len(set(questions)) == 12
    assert all(r.input_length == 2048 + 128 for r in records)
    assert [r.timestamp_ms for r in records] == sorted(r.timestamp_ms for r in records)
