from cortex.gateway.worker_report import (
    WorkerReport,
    sglang_server_info,
    vllm_block_size,
    vllm_models,
)


def test_sglang_server_info_gives_model_and_page_size():
    report = sglang_server_info(b'{"served_model_name": "m", "model_path": "/p", "page_size": 32}')
    assert report == WorkerReport(("m", "/p"), 32)
    assert report.model_for("/p") == "/p" and report.model_for("x") == "m"
    assert sglang_server_info(b"not json") == WorkerReport((), None)
    assert sglang_server_info(b'{"page_size": true}').block_size is None


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
