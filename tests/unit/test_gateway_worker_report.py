from cortex.dispatch.worker_report import (
    WorkerReport,
    sglang_server_info,
    vllm_block_size,
    vllm_kv_tokens,
    vllm_models,
    vllm_prefix_caching,
)


def test_sglang_server_info_gives_model_and_page_size():
    report = sglang_server_info(b'{"served_model_name": "m", "model_path": "/p", "page_size": 32}')
    assert report == WorkerReport(("m", "/p"), 32)
    assert report.model_for("/p") == "/p" and report.model_for("x") == "m"
    assert sglang_server_info(b"not json") == WorkerReport((), None)
    assert sglang_server_info(b'{"page_size": true}').block_size is None
    assert sglang_server_info(b'{"disable_radix_cache": true}').prefix_caching is False
    assert sglang_server_info(b'{"disable_radix_cache": false}').prefix_caching is True


def test_vllm_models_skip_lora_adapters():
    body = (b'{"object":"list","data":[{"id":"base","parent":null},'
            b'{"id":"adapter","parent":"base"}]}')
    assert vllm_models(body) == ("base",)
    assert vllm_models(b"[]") == () and vllm_models(b"{") == ()


def test_vllm_block_size_from_cache_config_info():
    text = ('# HELP vllm:cache_config_info x\n# TYPE vllm:cache_config_info gauge\n'
            'vllm:cache_config_info{block_size="16",cache_dtype="auto",'
            'enable_prefix_caching="True"} 1.0\n')
    assert vllm_block_size(text) == 16
    assert vllm_block_size('vllm:cache_config_info{cache_dtype="auto", block_size="32"} 1\n') == 32
    assert vllm_block_size("vllm:num_requests_running 0\n") is None


def test_vllm_prefix_caching_from_cache_config_info():
    # as a real vLLM 0.32 (CPU build) wrote it with --no-enable-prefix-caching
    off = ('vllm:cache_config_info{_block_size_resolved="True",block_size="32",'
           'enable_prefix_caching="False",engine="0"} 1.0\n')
    assert vllm_prefix_caching(off) is False
    assert vllm_prefix_caching(off.replace('"False"', '"True"')) is True
    assert vllm_prefix_caching("vllm:num_requests_running 0\n") is None


def test_the_kv_pool_in_tokens():
    """SGLang says it in tokens; vLLM in blocks, its null block (never handed out) included."""
    assert sglang_server_info(b'{"max_total_num_tokens": 20000}').kv_tokens == 20000
    assert sglang_server_info(b'{"max_total_num_tokens": "20000"}').kv_tokens is None
    assert sglang_server_info(b'{"max_total_num_tokens": 0}').kv_tokens is None
    line = ('vllm:cache_config_info{block_size="32",enable_prefix_caching="True",engine="0",'
            'num_gpu_blocks="65"} 1.0\n')
    assert vllm_kv_tokens(line) == 64 * 32
    assert vllm_kv_tokens(line.replace('"65"', '"None"')) is None  # before the engine sized it
    assert vllm_kv_tokens("vllm:num_requests_running 0\n") is None
