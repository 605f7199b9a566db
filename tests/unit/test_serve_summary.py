"""The start-up line of ``cortex serve``: listeners, models with block size and worker count,
workers (pure: ``cortex.serve_summary``)."""

from __future__ import annotations

from cortex.config.tree import ControlConfig, CortexConfig, ModelConfig, ServerConfig
from cortex.scheduling.view import Role
from cortex.serve_summary import MAX_WORKERS, serve_summary
from cortex.workers.spec import WorkerSpec


def config(*models: ModelConfig, host: str = "0.0.0.0") -> CortexConfig:
    return CortexConfig(server=ServerConfig(host=host, port=0),
                        control=ControlConfig(host="127.0.0.1", port=0), models=models)


DEEPSEEK = ModelConfig("deepseek", tokenizer="/models/deepseek", block_size=16)
PROXIED = ModelConfig("other", passthrough=True)


def test_listeners_models_and_workers_in_one_line():
    workers = [
        WorkerSpec("e0", "http://10.0.0.10:30000", engine="sglang", model="deepseek"),
        WorkerSpec("e1", "http://10.0.0.11:8000", engine="vllm", model="deepseek", dp_size=4,
                   role=Role.PREFILL, bootstrap_port=8998),
        WorkerSpec("p0", "http://10.0.0.12:8000", engine="vllm", model="other"),
        WorkerSpec("x0", "http://10.0.0.13:8000", engine="vllm", model="elsewhere"),
    ]
    line = serve_summary(config(DEEPSEEK, PROXIED), workers, 8080, 8081)
    assert "\n" not in line
    assert line == (
        "serving: data plane 0.0.0.0:8080, control plane 127.0.0.1:8081; "
        "models: deepseek (block 16, 2 workers), other (passthrough, 1 worker), "
        "elsewhere (no profile, 1 worker); "
        "workers: e0 sglang http://10.0.0.10:30000, e1 vllm http://10.0.0.11:8000 dp 4 prefill, "
        "p0 vllm http://10.0.0.12:8000, x0 vllm http://10.0.0.13:8000")


def test_a_worker_naming_no_model_counts_for_the_only_model_and_ipv6_hosts_are_bracketed():
    workers = [WorkerSpec("e0", "http://127.0.0.1:30000")]
    line = serve_summary(config(DEEPSEEK, host="::"), workers, 41000, 41001)
    assert line.startswith("serving: data plane [::]:41000, control plane 127.0.0.1:41001; ")
    assert "models: deepseek (block 16, 1 worker); " in line


def test_no_workers_and_a_long_worker_list():
    assert serve_summary(config(DEEPSEEK), [], 1, 2).endswith(
        "models: deepseek (block 16, 0 workers); workers: none")
    many = [WorkerSpec(f"w{i}", f"http://10.0.1.{i}:8000", model="deepseek")
            for i in range(MAX_WORKERS + 3)]
    line = serve_summary(config(DEEPSEEK), many, 1, 2)
    assert f"deepseek (block 16, {MAX_WORKERS + 3} workers)" in line
    assert f"w{MAX_WORKERS - 1} sglang" in line and f"w{MAX_WORKERS} " not in line
    assert line.endswith(", ... (3 more)")
