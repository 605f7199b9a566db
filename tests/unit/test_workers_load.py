"""Load report parsers: vLLM Prometheus text, SGLang /v1/loads and /get_load."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cortex.workers.load import (
    LoadParseError,
    RankLoad,
    parse_sglang_loads,
    parse_vllm_metrics,
    vllm_process_start,
)

# Shaped like vLLM 0.33's exposition with two DP engines (prometheus_client text format).
VLLM_DP2 = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12345.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-0.6B"} 4.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-0.6B"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="Qwen/Qwen3-0.6B",engine="0"} 2.0
vllm:num_requests_waiting{model_name="Qwen/Qwen3-0.6B",engine="1"} 0.0
# HELP vllm:num_requests_waiting_by_reason Number of requests waiting, by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="Qwen/Qwen3-0.6B",reason="capacity"} 9.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-0.6B"} 0.4375
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-0.6B"} 0.0625
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 8192.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="Qwen/Qwen3-0.6B"} 0.0
vllm:cache_config_info{block_size="16",engine="0",enable_prefix_caching="True"} 1.0
"""

# vLLM <= 0.11: the old KV usage name, no engine label on a single-engine server.
VLLM_OLD = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 7.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.9
"""


def test_vllm_two_engines_labels_in_any_order() -> None:
    assert parse_vllm_metrics(VLLM_DP2) == {
        0: RankLoad(running=4, waiting=2, kv_usage=0.4375),
        1: RankLoad(running=1, waiting=0, kv_usage=0.0625),
    }


def test_vllm_old_usage_name_and_no_engine_label() -> None:
    assert parse_vllm_metrics(VLLM_OLD) == {0: RankLoad(3, 7, 0.9)}


def test_vllm_new_usage_name_wins_over_old() -> None:
    text = VLLM_OLD + 'vllm:kv_cache_usage_perc{model_name="m"} 0.25\n'
    assert parse_vllm_metrics(text)[0].kv_usage == 0.25


def test_vllm_without_usage_gauge_reports_usage_unknown() -> None:
    text = "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"
    assert parse_vllm_metrics(text) == {0: RankLoad(1, 0, None)}


def test_vllm_escaped_label_values_timestamps_and_whitespace() -> None:
    text = (
        'vllm:num_requests_running{model_name="a \\"quoted\\" \\\\ name\\n",engine="2",} '
        '5 1700000000000\n'
        '  vllm:num_requests_waiting { engine = "2" , model_name="x}y" }\t1e0\n'
        'vllm:kv_cache_usage_perc{engine="2"} 1.5\n'  # clamped to 1
    )
    assert parse_vllm_metrics(text) == {2: RankLoad(5, 1, 1.0)}


def test_vllm_samples_of_one_rank_in_several_models_add_up() -> None:
    text = (
        'vllm:num_requests_running{model_name="a"} 1\n'
        'vllm:num_requests_running{model_name="b"} 2\n'
        'vllm:num_requests_waiting{model_name="a"} 3\n'
        'vllm:num_requests_waiting{model_name="b"} 4\n'
        'vllm:kv_cache_usage_perc{model_name="a"} 0.1\n'
        'vllm:kv_cache_usage_perc{model_name="b"} 0.3\n'
    )
    assert parse_vllm_metrics(text) == {0: RankLoad(3, 7, 0.3)}


def test_vllm_other_malformed_lines_are_not_read() -> None:
    text = VLLM_OLD + 'vllm:some_histogram_bucket{le="0.1" garbage\nnot prometheus at all\n'
    assert parse_vllm_metrics(text) == {0: RankLoad(3, 7, 0.9)}


@pytest.mark.parametrize("text", [
    "",
    "<html><body>502 Bad Gateway</body></html>",
    "# only comments\n",
    "vllm:num_requests_running 1\n",  # waiting missing
    'vllm:num_requests_waiting{engine="1"} 1\n',  # running missing
    "vllm:num_requests_running{engine=\"0\" 1\nvllm:num_requests_waiting 0\n",
    'vllm:num_requests_running{engine="0",} one\nvllm:num_requests_waiting 0\n',
    'vllm:num_requests_running{engine="x"} 1\nvllm:num_requests_waiting{engine="x"} 0\n',
    'vllm:num_requests_running{engine="\u00b2"} 1\nvllm:num_requests_waiting 0\n',
    "vllm:num_requests_running -1\nvllm:num_requests_waiting 0\n",
    "vllm:num_requests_running NaN\nvllm:num_requests_waiting 0\n",
    "vllm:num_requests_running +Inf\nvllm:num_requests_waiting 0\n",
    "vllm:num_requests_running 1 2 3\nvllm:num_requests_waiting 0\n",
    "vllm:num_requests_running\nvllm:num_requests_waiting 0\n",
    'vllm:num_requests_running{engine="0"\nvllm:num_requests_waiting 0\n',
    'vllm:num_requests_running{engine="0" model="a"} 1\nvllm:num_requests_waiting 0\n',
])
def test_vllm_garbage_raises_only_load_parse_error(text: str) -> None:
    with pytest.raises(LoadParseError):
        parse_vllm_metrics(text)


def test_load_parse_error_is_a_value_error() -> None:
    assert issubclass(LoadParseError, ValueError)


# SGLang 0.5.23 /v1/loads, two DP ranks (engine-endpoints.md §3; optional sections left out).
SGLANG_V1 = {
    "timestamp": "2026-11-30T12:00:00Z",
    "version": "0.5.23",
    "accelerator": "cuda",
    "num_accelerators": 2,
    "loads": [
        {"timestamp": "2026-11-30T12:00:00Z", "dp_rank": 1, "num_running_reqs": 3,
         "num_waiting_reqs": 1, "num_waiting_uncached_tokens": 2048, "num_used_tokens": 9000,
         "num_total_tokens": 20000, "token_usage": 0.45, "gen_throughput": 812.5,
         "cache_hit_rate": 0.6, "utilization": 0.5, "memory": {"weight": 1.0}},
        {"timestamp": "2026-11-30T12:00:00Z", "dp_rank": 0, "num_running_reqs": 0,
         "num_waiting_reqs": 0, "num_waiting_uncached_tokens": 0, "token_usage": 0.0},
    ],
}


def test_sglang_v1_loads() -> None:
    assert parse_sglang_loads(json.dumps(SGLANG_V1).encode()) == {
        1: RankLoad(running=3, waiting=1, kv_usage=0.45, waiting_uncached_tokens=2048),
        0: RankLoad(running=0, waiting=0, kv_usage=0.0, waiting_uncached_tokens=0),
    }


def test_sglang_v1_optional_figures_missing_are_unknown() -> None:
    body = {"loads": [{"dp_rank": 0, "num_running_reqs": 2, "num_waiting_reqs": 5}]}
    assert parse_sglang_loads(json.dumps(body).encode()) == {0: RankLoad(2, 5, None, None)}


def test_sglang_get_load_list() -> None:
    body = [
        {"dp_rank": 0, "num_reqs": 7, "num_waiting_reqs": 2, "num_tokens": 4096, "ts_tic": 1.5},
        {"dp_rank": 1, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0,
         "num_pending_tokens": 0},
    ]
    assert parse_sglang_loads(json.dumps(body).encode()) == {
        0: RankLoad(running=5, waiting=2), 1: RankLoad(running=0, waiting=0)}


@pytest.mark.parametrize("body", [
    b"",
    b"\xff\xfe",
    b"<html>",
    b"null",
    b"42",
    b'"loads"',
    b"{}",
    b'{"loads": {}}',
    b'{"loads": []}',
    b"[]",
    b"[1]",
    b'{"loads": [{"num_running_reqs": 1, "num_waiting_reqs": 0}]}',
    b'{"loads": [{"dp_rank": 0, "num_waiting_reqs": 0}]}',
    b'{"loads": [{"dp_rank": 0, "num_running_reqs": -1, "num_waiting_reqs": 0}]}',
    b'{"loads": [{"dp_rank": 0, "num_running_reqs": 1.5, "num_waiting_reqs": 0}]}',
    b'{"loads": [{"dp_rank": 0, "num_running_reqs": "1", "num_waiting_reqs": 0}]}',
    b'{"loads": [{"dp_rank": true, "num_running_reqs": 1, "num_waiting_reqs": 0}]}',
    b'{"loads": [{"dp_rank": 0, "num_running_reqs": 1, "num_waiting_reqs": 0,'
    b' "token_usage": NaN}]}',
    b'{"loads": [{"dp_rank": 0, "num_running_reqs": 1, "num_waiting_reqs": 0,'
    b' "token_usage": "high"}]}',
    b'{"loads": [{"dp_rank": 0, "num_running_reqs": 1, "num_waiting_reqs": 0},'
    b' {"dp_rank": 0, "num_running_reqs": 1, "num_waiting_reqs": 0}]}',
    b'[{"dp_rank": 0, "num_reqs": 1, "num_waiting_reqs": 2}]',
    b'[{"dp_rank": 0, "num_waiting_reqs": 2}]',
])
def test_sglang_garbage_raises_only_load_parse_error(body: bytes) -> None:
    with pytest.raises(LoadParseError):
        parse_sglang_loads(body)


# Fuzz: whatever the bytes, a parser returns loads or raises LoadParseError, nothing else.

_PIECES = st.sampled_from([
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc", "{", "}", ",", "=", '"', "\\", "engine", "model_name", " ",
    "\t", "\n", "\r", "0", "1", "-", ".", "e", "NaN", "Inf", "+", "#", "x", "\u00b2", "_",
])


@given(st.lists(_PIECES, max_size=60).map("".join))
def test_vllm_fuzz(text: str) -> None:
    try:
        loads = parse_vllm_metrics(text)
    except LoadParseError:
        return
    assert loads and all(load.running >= 0 and load.waiting >= 0 for load in loads.values())


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats() | st.sampled_from(
        ["dp_rank", "loads", "num_reqs"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["dp_rank", "loads", "num_running_reqs", "num_waiting_reqs", "num_reqs",
                         "token_usage", "num_waiting_uncached_tokens"]), children, max_size=5),
    max_leaves=20)


@given(_JSON.map(lambda doc: json.dumps(doc).encode()) | st.binary(max_size=40))
def test_sglang_fuzz(body: bytes) -> None:
    try:
        loads = parse_sglang_loads(body)
    except LoadParseError:
        return
    assert loads and all(load.running >= 0 and load.waiting >= 0 for load in loads.values())


def test_vllm_process_start_is_the_engines_identity():
    text = ("# HELP process_start_time_seconds Start time\n"
            "# TYPE process_start_time_seconds gauge\n"
            "process_start_time_seconds 1.79621198288e+09\n"
            'vllm:num_requests_running{engine="0",model_name="m"} 0.0\n')
    assert vllm_process_start(text) == 1.79621198288e+09
    assert vllm_process_start("vllm:num_requests_running 0\n") is None
    assert vllm_process_start("\nprocess_start_time_seconds nan\n") is None
    assert vllm_process_start("\nprocess_start_time_seconds junk") is None
