import json

import pytest

from cortex.errors import UpstreamError
from cortex.pd.plan import (
    MAX_ROOM,
    batch_items,
    bypass_prefill,
    merge_logprobs_event,
    merge_logprobs_json,
    new_room,
    prefill_input_logprobs,
    sglang_leg_body,
    vllm_decode_body,
    vllm_prefill_body,
    vllm_transfer_params,
    wants_logprobs,
)


def test_rooms_are_non_negative_63_bit():
    assert new_room(lambda bits: (1 << bits) - 1) == MAX_ROOM
    assert 0 <= new_room() <= MAX_ROOM


@pytest.mark.parametrize(("path", "body", "items"), [
    ("/generate", {"text": "a"}, 1),
    ("/generate", {"text": ["a", "b", "c"]}, 3),
    ("/generate", {"input_ids": [[1], [2]]}, 2),
    ("/generate", {"input_ids": [1, 2, 3]}, 1),
    ("/v1/completions", {"prompt": ["a", "b"]}, 2),
    ("/v1/completions", {"prompt": [1, 2, 3]}, 1),
    ("/v1/completions", {"prompt": [[1, 2], [3]]}, 2),
    ("/v1/chat/completions", {"messages": [], "n": 3}, 3),
    ("/v1/chat/completions", {"messages": []}, 1),
])
def test_batch_items(path, body, items):
    assert batch_items(path, body) == items


def test_sglang_legs_carry_bootstrap_fields_one_room_per_item():
    bits = iter(range(10, 100))
    raw, rooms = sglang_leg_body({"text": ["a", "b"]}, "10.0.0.5", 8998, 2, lambda _: next(bits))
    assert rooms == [10, 11]
    assert json.loads(raw) == {"text": ["a", "b"], "bootstrap_host": "10.0.0.5",
                               "bootstrap_port": 8998, "bootstrap_room": [10, 11]}
    raw, room = sglang_leg_body({"text": "a"}, "h", None, 1, lambda _: 7)
    assert room == 7 and json.loads(raw)["bootstrap_port"] is None


def test_vllm_prefill_leg_is_one_token_non_streaming_with_remote_decode():
    body = {"model": "m", "messages": [], "stream": True, "stream_options": {"x": 1},
            "max_tokens": 50, "max_completion_tokens": 50, "min_tokens": 3}
    leg = json.loads(vllm_prefill_body(body))
    assert leg["stream"] is False and leg["max_tokens"] == 1
    assert leg["max_completion_tokens"] == 1
    assert leg["kv_transfer_params"]["do_remote_decode"] is True
    assert "stream_options" not in leg and "min_tokens" not in leg
    assert body["stream"] is True  # the client's body is untouched


def test_vllm_prefill_leg_of_a_responses_request_limits_max_output_tokens():
    body = {"model": "m", "input": "hi", "stream": True, "max_output_tokens": 50}
    leg = json.loads(vllm_prefill_body(body, responses=True))
    assert leg["max_output_tokens"] == 1 and "max_tokens" not in leg
    assert json.loads(vllm_prefill_body({"input": "hi"}, responses=True))[
        "max_output_tokens"] == 1  # no limit sent: one all the same


def test_vllm_decode_leg_passes_transfer_params_unchanged():
    params = {"do_remote_prefill": True, "remote_block_ids": [[1, 2]], "remote_engine_id": "e",
              "extra_future_key": {"nested": [1]}}
    answer = json.dumps({"id": "x", "kv_transfer_params": params}).encode()
    assert vllm_transfer_params(answer) == params
    body = {"model": "m", "stream": True, "max_tokens": 9}
    assert json.loads(vllm_decode_body(body, params)) == {**body, "kv_transfer_params": params}
    assert json.loads(vllm_decode_body(body, None)) == body
    assert vllm_transfer_params(b'{"id": 1}') is None
    with pytest.raises(UpstreamError):
        vllm_transfer_params(b"<html>")


def test_logprob_merge_prepends_prefill_input_logprobs():
    prefill = json.dumps({"meta_info": {"input_token_logprobs": [[-1.0, 5], [-2.0, 6]]}})
    logprobs = prefill_input_logprobs(prefill.encode())
    assert logprobs == [[-1.0, 5], [-2.0, 6]]
    decode = json.dumps({"text": "x", "meta_info": {"input_token_logprobs": [[-3.0, 7]]}})
    merged = json.loads(merge_logprobs_json(decode.encode(), logprobs))
    assert merged["meta_info"]["input_token_logprobs"] == [[-1.0, 5], [-2.0, 6], [-3.0, 7]]
    event = b'data: {"meta_info": {"input_token_logprobs": []}}\n\n'
    out = merge_logprobs_event(event, logprobs)
    assert out.endswith(b"\n\n")
    assert json.loads(out[5:])["meta_info"]["input_token_logprobs"] == logprobs
    assert merge_logprobs_event(b"data: [DONE]\n\n", logprobs) == b"data: [DONE]\n\n"
    sse = b'data: {"meta_info": {}}\n\ndata: {"meta_info": {"input_token_logprobs": [[0, 1]]}}\n\n'
    assert prefill_input_logprobs(sse) == [[0, 1]]


def test_wants_logprobs_and_bypass():
    assert wants_logprobs("/generate", {"return_logprob": True})
    assert wants_logprobs("/v1/chat/completions", {"logprobs": True})
    assert wants_logprobs("/v1/completions", {"logprobs": 0})
    assert not wants_logprobs("/v1/completions", {})
    assert bypass_prefill(1000, 990, 16) and not bypass_prefill(1000, 900, 16)
    assert not bypass_prefill(0, 0, 16)


def test_sse_event_transform_sees_whole_events_however_the_stream_is_cut():
    from cortex.pd.orchestrate import SseEventTransform

    stream = b'data: {"a": 1}\n\ndata: {"b": 2}\n\ndata: [DONE]\n\n'
    for cut in range(1, len(stream)):
        seen = []
        transform = SseEventTransform(lambda event: (seen.append(event), event.upper())[1])
        out = transform(stream[:cut]) + transform(stream[cut:])
        assert out == stream.upper()
        assert seen == [b'data: {"a": 1}\n\n', b'data: {"b": 2}\n\n', b"data: [DONE]\n\n"]
