import json

import pytest

from cortex.dispatch.endpoints import (
    body_model,
    decision_headers,
    forwarded_headers,
    parse_body,
    with_dp_rank,
)
from cortex.errors import BadRequest


@pytest.mark.parametrize("raw", [b"", b"{", b"[1,2]", b'"text"', b"\xff\xfe", b"null"])
def test_only_a_json_object_is_a_body(raw):
    with pytest.raises(BadRequest):
        parse_body(raw)


def test_body_model_takes_the_base_of_a_lora_name():
    assert body_model({"model": "base:adapter"}) == "base"
    assert body_model({"model": "m"}) == "m"
    assert body_model({}) is None
    with pytest.raises(BadRequest):
        body_model({"model": 3})


def test_inbound_cortex_and_framing_headers_are_dropped():
    headers = [(b"host", b"x"), (b"x-cortex-assigned-worker", b"evil"), (b"authorization", b"b"),
               (b"content-length", b"3"), (b"connection", b"close"), (b"x-request-id", b"r1"),
               (b"x-cortex-match-mode", b"exact")]
    assert forwarded_headers(headers) == [(b"authorization", b"b"), (b"x-request-id", b"r1")]


def test_dp_rank_goes_in_the_body_for_sglang_and_a_header_for_vllm():
    body = {"text": "hi", "sampling_params": {}}
    raw = json.dumps(body).encode()
    sent, headers = with_dp_rank("sglang", body, raw, [], 3)
    assert json.loads(sent) == {**body, "routed_dp_rank": 3} and headers == []
    sent, headers = with_dp_rank("vllm", body, raw, [(b"x-data-parallel-rank", b"9")], 2)
    assert sent == raw and headers == [(b"x-data-parallel-rank", b"2")]
    assert with_dp_rank("vllm", body, raw, [], None) == (raw, [])


def test_a_clients_own_dp_rank_is_stripped_unless_clients_may_choose():
    body = {"text": "hi", "routed_dp_rank": 1}
    raw = json.dumps(body).encode()
    sent, _ = with_dp_rank("sglang", body, raw, [], None)
    assert json.loads(sent) == {"text": "hi"}
    assert with_dp_rank("sglang", body, raw, [], None, client_dp_rank=True) == (raw, [])
    sent, _ = with_dp_rank("sglang", body, raw, [], 0, client_dp_rank=True)
    assert json.loads(sent)["routed_dp_rank"] == 0  # Cortex's own rank wins
    header = [(b"x-data-parallel-rank", b"1"), (b"accept", b"*/*")]
    assert forwarded_headers(header) == [(b"accept", b"*/*")]
    assert forwarded_headers(header, client_dp_rank=True) == header


def test_decision_headers_name_worker_mode_and_hit():
    assert decision_headers("w1", "exact_kv_events", 64, None, 1) == [
        (b"x-cortex-assigned-worker", b"w1"), (b"x-cortex-match-mode", b"exact_kv_events"),
        (b"x-cortex-cache-hit-tokens", b"64")]
    assert (b"x-cortex-dp-rank", b"1") in decision_headers("w", "load_aware", 0, 1, 2)
    assert (b"x-cortex-attempts", b"2") in decision_headers("w", "load_aware", 0, 1, 2)
