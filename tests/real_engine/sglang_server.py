"""Real SGLang servers (0.5.15 on the CPU) for the real-engine tests.

``make engines`` builds ``.engines/sglang``: SGLang 0.5.15 with the CPU build of torch and
every requirement pinned (``engines/sglang-cpu-requirements.txt``, installed ``--no-deps``).
``sglang_env()`` finds it or says why it is not usable. The tiny models are the vLLM tests'
(``engines/build_models.py``).

A server is ``python -m sglang.launch_server`` with ``SGLANG_USE_CPU_ENGINE=1 --device cpu
--attention-backend torch_native`` and **page size 1**, SGLang's default and the only one its
CPU path serves from PyPI packages (a larger page size launches a Triton kernel on the first
prefill). Ready: its "The server is fired up and ready to roll!" line (after its warm-up
request: without it the first request takes ~7 s here), then ``/health`` 200
(``engine_server.EngineProcess``). ``--enable-cache-report``: the OpenAI endpoints then report
``usage.prompt_tokens_details.cached_tokens`` (``/generate`` always reports
``meta_info.cached_tokens``). ``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false``: SGLang's
``/health`` runs a one-token generation whenever the server is idle (~1 s here, and KV events);
Cortex probes ``/health`` every ``health.interval_s``, so the tests turn that off (an operator
keeping the default pays one short generation per probe of an idle engine).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tests.real_engine.engine_server import (
    EngineEnv,
    EngineProcess,
    engine_env,
    free_port,
    http_request,
)


def sglang_env() -> tuple[EngineEnv | None, str]:
    """The environment ``make engines`` built for SGLang, or ``None`` and why not usable."""
    return engine_env("sglang")


@dataclass
class SglangOptions:
    model_dir: Path
    served_name: str
    max_total_tokens: int = 8192  # the KV pool in tokens (small: it evicts)
    context_length: int = 4096
    extra_args: tuple[str, ...] = ()


@dataclass
class SglangServer(EngineProcess):
    ready_line = "The server is fired up and ready to roll!"
    engine = "sglang"

    name: str
    options: SglangOptions
    env: EngineEnv
    log_dir: Path

    def command(self) -> list[str]:
        o = self.options
        kv_events = {"publisher": "zmq", "endpoint": f"tcp://*:{self.events_port}",
                     "replay_endpoint": f"tcp://*:{self.replay_port}"}
        return [str(self.env.python), "-m", "sglang.launch_server",
                "--model-path", str(o.model_dir), "--served-model-name", o.served_name,
                "--host", "127.0.0.1", "--port", str(self.http_port),
                "--device", "cpu", "--attention-backend", "torch_native", "--page-size", "1",
                "--max-total-tokens", str(o.max_total_tokens),
                "--context-length", str(o.context_length),
                "--enable-cache-report", "--grammar-backend", "none",
                "--kv-events-config", json.dumps(kv_events), *o.extra_args]

    def environment(self) -> dict[str, str]:
        return {"SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1",
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false",
                "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "false",
                # 0.5.15 checks --port + 10000 <= 65535 for a gRPC port it does not open
                # unless asked to: a free ephemeral port can be above 55535
                "SGLANG_GRPC_PORT": str(free_port())}

    def flush_cache(self) -> None:
        """Empty the radix cache (SGLang publishes ``AllBlocksCleared``)."""
        status, raw = self.post_raw("/flush_cache")
        if status != 200:
            raise AssertionError(f"{self.name}: /flush_cache answered {status}: {raw[:200]!r}")

    def post_raw(self, path: str) -> tuple[int, bytes]:
        return http_request("POST", self.url + path, b"", 30.0)
