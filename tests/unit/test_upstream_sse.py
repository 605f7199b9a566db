"""CachedTokensSniffer: engine-reported cached tokens out of JSON bodies and SSE streams."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from cortex.upstream.sse import CachedTokensSniffer


def sniff(*chunks: bytes) -> CachedTokensSniffer:
    sniffer = CachedTokensSniffer()
    for chunk in chunks:
        sniffer.feed(chunk)
    return sniffer


def sse(*events: dict | str, crlf: bool = False) -> bytes:
    end = b"\r\n" if crlf else b"\n"
    out = b""
    for event in events:
        payload = event if isinstance(event, str) else json.dumps(event)
        out += b"data: " + payload.encode() + end + end
    return out


def token_event(i: int) -> dict:
    return {"id": "c1", "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"content": f"tok{i}"}}], "usage": None}


USAGE_EVENT = {"id": "c1", "object": "chat.completion.chunk", "choices": [],
               "usage": {"prompt_tokens": 812, "completion_tokens": 5, "total_tokens": 817,
                         "prompt_tokens_details": {"cached_tokens": 768}}}
OPENAI_STREAM = sse(*(token_event(i) for i in range(5)), USAGE_EVENT, "[DONE]")
OPENAI_JSON = json.dumps({
    "id": "c1", "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}}],
    "usage": {"prompt_tokens": 100, "completion_tokens": 3, "total_tokens": 103,
              "prompt_tokens_details": {"cached_tokens": 64}}}).encode()
SGLANG_STREAM = sse(*({"text": "x" * i, "meta_info": {"id": "r", "prompt_tokens": 40,
                                                      "cached_tokens": 32,
                                                      "completion_tokens": i}}
                      for i in range(1, 4)), "[DONE]")


def test_openai_stream_usage_in_last_event():
    sniffer = sniff(OPENAI_STREAM)
    assert (sniffer.cached_tokens, sniffer.prompt_tokens) == (768, 812)
    assert sniffer.done


def test_openai_json_body():
    sniffer = sniff(OPENAI_JSON[:50], OPENAI_JSON[50:])
    assert (sniffer.cached_tokens, sniffer.prompt_tokens) == (64, 100)


def test_sglang_native_meta_info_stream_and_json():
    assert (sniff(SGLANG_STREAM).cached_tokens, sniff(SGLANG_STREAM).prompt_tokens) == (32, 40)
    body = json.dumps({"text": "hi", "meta_info": {"prompt_tokens": 9,
                                                    "cached_tokens": 0}}).encode()
    assert (sniff(body).cached_tokens, sniff(body).prompt_tokens) == (0, 9)


def test_crlf_events_and_a_final_event_without_blank_line():
    assert sniff(sse(token_event(0), USAGE_EVENT, crlf=True)).cached_tokens == 768
    unterminated = sse(token_event(0)) + b"data: " + json.dumps(USAGE_EVENT).encode()
    assert sniff(unterminated).cached_tokens == 768


def test_nothing_reported():
    assert sniff(sse(token_event(0), "[DONE]")).cached_tokens is None
    no_details = dict(USAGE_EVENT, usage={"prompt_tokens": 3, "prompt_tokens_details": None})
    sniffer = sniff(sse(no_details, "[DONE]"))
    assert (sniffer.cached_tokens, sniffer.prompt_tokens) == (None, None)
    assert not sniffer.done
    null_cached = dict(USAGE_EVENT, usage={"prompt_tokens": 3,
                                           "prompt_tokens_details": {"cached_tokens": None}})
    assert sniff(sse(null_cached)).cached_tokens is None
    assert sniff(b"").cached_tokens is None


def test_needle_in_generated_text_is_not_an_answer():
    tricky = token_event(0)
    tricky["choices"][0]["delta"]["content"] = '"cached_tokens": 5'
    sniffer = sniff(sse(tricky, USAGE_EVENT))
    assert sniffer.cached_tokens == 768


def test_first_reported_event_wins_and_later_bytes_are_ignored():
    later = dict(USAGE_EVENT, usage={"prompt_tokens": 1,
                                     "prompt_tokens_details": {"cached_tokens": 1}})
    sniffer = sniff(sse(USAGE_EVENT), sse(later), b"garbage\n\n")
    assert sniffer.cached_tokens == 768


def test_malformed_json_and_sse_comments_are_skipped():
    body = b": keep-alive\n\ndata: {\"cached_tokens\": \n\n" + sse(USAGE_EVENT)
    assert sniff(body).cached_tokens == 768
    assert sniff(b'{"usage": {"prompt_tokens_details": {"cached_tokens": 5}').cached_tokens \
        is None  # truncated JSON body


def test_bounds_give_up_instead_of_buffering():
    sniffer = CachedTokensSniffer(max_event_bytes=64, max_body_bytes=64)
    sniffer.feed(b"data: " + b"x" * 100)
    assert sniffer.done and sniffer.cached_tokens is None
    sniffer = CachedTokensSniffer(max_body_bytes=16)
    sniffer.feed(OPENAI_JSON)
    assert sniffer.cached_tokens is None


def test_answer_read_mid_stream_then_stream_goes_on():
    sniffer = CachedTokensSniffer()
    sniffer.feed(OPENAI_JSON[:40])
    assert sniffer.cached_tokens is None
    sniffer.feed(OPENAI_JSON[40:])
    assert sniffer.cached_tokens == 64


BODIES = [OPENAI_STREAM, OPENAI_JSON, SGLANG_STREAM,
          sse(token_event(0), USAGE_EVENT, "[DONE]", crlf=True),
          b"\n  " + OPENAI_JSON,
          sse(token_event(1)) + b"data: " + json.dumps(USAGE_EVENT).encode()]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(BODIES), st.lists(st.integers(min_value=0, max_value=2000),
                                         max_size=12))
def test_any_split_gives_the_same_answer(body, cuts):
    whole = sniff(body)
    points = sorted({c % (len(body) + 1) for c in cuts})
    chunks = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    split = sniff(*chunks)
    assert (split.cached_tokens, split.prompt_tokens) == \
        (whole.cached_tokens, whole.prompt_tokens)
    assert whole.cached_tokens is not None


def usage_event(cached: int | None, prompt: int) -> dict:
    return dict(USAGE_EVENT, usage={"prompt_tokens": prompt,
                                    "prompt_tokens_details": {"cached_tokens": cached}})


EVENTS = st.one_of(
    st.integers(0, 50).map(token_event),
    st.builds(usage_event, st.one_of(st.none(), st.integers(0, 10_000)), st.integers(0, 10_000)),
    st.builds(lambda c, p: {"text": "t", "meta_info": {"cached_tokens": c, "prompt_tokens": p}},
              st.integers(0, 100), st.integers(0, 100)),
    st.just("[DONE]"), st.just('{"cached_tokens": 1}'))


def oracle(events: list) -> tuple[int | None, int | None]:
    """The first event carrying an integer cached_tokens at a known path, parsed plainly."""
    for event in events:
        doc = event if isinstance(event, dict) else None
        if doc is None:
            continue
        details = (doc.get("usage") or {}).get("prompt_tokens_details") or {}
        if isinstance(details.get("cached_tokens"), int):
            return details["cached_tokens"], doc["usage"]["prompt_tokens"]
        meta = doc.get("meta_info") or {}
        if isinstance(meta.get("cached_tokens"), int):
            return meta["cached_tokens"], meta["prompt_tokens"]
    return None, None


@settings(max_examples=300, deadline=None)
@given(st.lists(EVENTS, max_size=8), st.booleans(),
       st.lists(st.integers(min_value=0, max_value=5000), max_size=16))
def test_random_streams_match_a_plain_parse_for_any_split(events, crlf, cuts):
    body = sse(*events, crlf=crlf)
    points = sorted({c % (len(body) + 1) for c in cuts})
    chunks = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    split = sniff(*chunks)
    assert (split.cached_tokens, split.prompt_tokens) == oracle(events)


# The shapes vLLM answers /v1/responses and /v1/messages with (cached 64 of a 100-token prompt).
RESPONSES_USAGE = {"input_tokens": 100, "output_tokens": 3, "total_tokens": 103,
                   "input_tokens_details": {"cached_tokens": 64},
                   "output_tokens_details": {"reasoning_tokens": 0}}
RESPONSES_JSON = json.dumps({"id": "resp_1", "object": "response", "status": "completed",
                             "output": [], "usage": RESPONSES_USAGE}).encode()
RESPONSES_STREAM = sse(
    {"type": "response.created", "response": {"id": "resp_1", "usage": None}},
    {"type": "response.output_text.delta", "delta": "no cache here"},
    {"type": "response.completed", "response": {"id": "resp_1", "usage": RESPONSES_USAGE}})
# Anthropic: input_tokens is what was neither read from nor written to the cache
ANTHROPIC_USAGE = {"input_tokens": 4, "output_tokens": 3, "cache_read_input_tokens": 64,
                   "cache_creation_input_tokens": 32}
ANTHROPIC_JSON = json.dumps({"id": "msg_1", "type": "message", "content": [],
                             "usage": ANTHROPIC_USAGE}).encode()
ANTHROPIC_STREAM = sse(
    {"type": "message_start", "message": {"id": "msg_1", "usage": ANTHROPIC_USAGE}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "a"}},
    {"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": ANTHROPIC_USAGE})


def test_responses_and_anthropic_usage_json_and_stream():
    for body in (RESPONSES_JSON, RESPONSES_STREAM, ANTHROPIC_JSON, ANTHROPIC_STREAM):
        for cut in (0, 7, len(body) // 2, len(body) - 3):
            sniffer = sniff(body[:cut], body[cut:])
            assert (sniffer.cached_tokens, sniffer.prompt_tokens) == (64, 100), (body, cut)


def test_anthropic_usage_without_cache_fields_reports_nothing():
    body = json.dumps({"type": "message", "usage": {"input_tokens": 9,
                                                    "output_tokens": 1}}).encode()
    assert sniff(body).cached_tokens is None
