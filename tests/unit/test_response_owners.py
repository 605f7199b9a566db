"""ResponseOwners: the worker of each relayed Responses answer, by its id, bounded."""

from __future__ import annotations

from cortex.dispatch.response_owners import ResponseOwners


def test_the_id_is_read_from_a_json_answer_or_the_first_stream_event():
    owners = ResponseOwners()
    assert owners.learn(b'{"id": "resp_a", "object": "response", "output": []}', "w1") == (
        "resp_a")
    first_event = (b'event: response.created\ndata: {"type":"response.created",'
                   b'"sequence_number":0,"response":{"id":"resp_b","output":[]}}\n\n')
    assert owners.learn(first_event, "w2") == "resp_b"
    assert (owners.owner("resp_a"), owners.owner("resp_b")) == ("w1", "w2")
    assert owners.owner("resp_c") is None and owners.owner(None) is None
    assert owners.learn(b'{"item_id": "x", "object"', "w1") is None  # no id: nothing learned


def test_the_least_recently_used_id_goes_first():
    owners = ResponseOwners(capacity=2)
    owners.learn(b'{"id":"a"}', "w1")
    owners.learn(b'{"id":"b"}', "w1")
    assert owners.owner("a") == "w1"  # a used: b is now the oldest
    owners.learn(b'{"id":"c"}', "w2")
    assert len(owners) == 2
    assert (owners.owner("a"), owners.owner("b"), owners.owner("c")) == ("w1", None, "w2")
