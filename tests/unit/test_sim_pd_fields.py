"""The PD request fields a simulated engine insists on, as the real engines do (pure checks)."""

from __future__ import annotations

import pytest

from cortex.errors import BadRequest, ConfigError
from cortex.sim.pd import (
    MAX_ROOM,
    PdSimSettings,
    SglangFields,
    batch_item_body,
    sglang_fields,
    vllm_decode_params,
    vllm_params,
)
from cortex.sim.pd_transfer import KvTransferFailed, fetch


def test_sglang_fields_single_and_list_of_one():
    body = {"bootstrap_host": "p1", "bootstrap_port": 8998, "bootstrap_room": 5}
    assert sglang_fields(body) == SglangFields("p1", 8998, 5)
    listed = {"bootstrap_host": ["p1"], "bootstrap_port": [None], "bootstrap_room": [MAX_ROOM]}
    assert sglang_fields(listed) == SglangFields("p1", None, MAX_ROOM)


@pytest.mark.parametrize("change", [
    {"bootstrap_host": None},
    {"bootstrap_host": ""},
    {"bootstrap_port": "8998"},
    {"bootstrap_port": 70000},
    {"bootstrap_room": -1},
    {"bootstrap_room": MAX_ROOM + 1},
    {"bootstrap_room": "5"},
    {"bootstrap_room": True},
    {"bootstrap_room": [1, 2]},
    {"bootstrap_room": None},
])
def test_sglang_fields_refuse_what_the_engine_refuses(change):
    body = {"bootstrap_host": "p1", "bootstrap_port": 8998, "bootstrap_room": 5, **change}
    with pytest.raises(BadRequest):
        sglang_fields(body)


def test_vllm_params_absent_means_an_ordinary_request():
    assert vllm_params({}) is None
    assert vllm_params({"kv_transfer_params": None}) is None
    with pytest.raises(BadRequest):
        vllm_params({"kv_transfer_params": [1]})


def test_vllm_decode_params_need_every_remote_key():
    params = {"do_remote_prefill": True, "remote_engine_id": "p0", "remote_block_ids": [[1]],
              "remote_request_id": "r1", "remote_host": "127.0.0.1", "remote_port": 5600}
    assert vllm_decode_params(params) is params
    for key in ("remote_engine_id", "remote_block_ids", "remote_request_id", "remote_host",
                "remote_port"):
        with pytest.raises(BadRequest, match=key):
            vllm_decode_params({k: v for k, v in params.items() if k != key})
    for port in ("5600", 0, 65536, 2**70, True):  # 2**70: an OverflowError once, a 500
        with pytest.raises(BadRequest):
            vllm_decode_params({**params, "remote_port": port})


@pytest.mark.parametrize("host", ["a" * 64, "ü" * 70 + ".x", "a\x00b"])
async def test_a_peer_name_that_cannot_be_looked_up_is_unreachable_not_a_crash(host):
    with pytest.raises(KvTransferFailed, match="unreachable"):  # (IDNA: a ValueError before)
        await fetch(host, 8998, "room", wait=False)


def test_settings_are_positive():
    with pytest.raises(ConfigError) as info:
        PdSimSettings(waiting_timeout_s=0, kv_lease_s=-1)
    assert len(info.value.problems) == 2


def test_batch_items_get_their_own_bootstrap_fields():
    body = {"bootstrap_host": ["p1", "p2"], "bootstrap_port": 8998, "bootstrap_room": [4, 9],
            "text": ["a", "b"]}
    assert sglang_fields(batch_item_body(body, 1, 2)) == SglangFields("p2", 8998, 9)
    single = {**body, "bootstrap_host": "p1", "bootstrap_room": 100}
    assert [sglang_fields(batch_item_body(single, i, 3)).room for i in range(3)] == [
        100, 101, 102]
    with pytest.raises(BadRequest, match="3 items"):
        batch_item_body(body, 0, 3)
