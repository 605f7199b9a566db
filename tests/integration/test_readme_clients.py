"""The README's "The official clients" block runs as written (issue 33 §5): the official
``openai`` and ``anthropic`` clients with a dummy API key — chat (with Cortex's headers read
from the raw response), a streamed chat, Responses and Messages — against Cortex in front of
two simulated SGLang engines, as in the quick start. Only the address and the model name are
the test cluster's (its ports are ephemeral)."""

from __future__ import annotations

import os
import sys

import trio

from tests.gateway_cluster import MODEL, gateway_cluster
from tests.readme_quick_start import readme_block


async def test_the_readme_client_examples_run_as_written_with_any_key():
    script = readme_block("clients", "python")
    assert 'api_key="unused"' in script and "localhost:8080" in script
    async with gateway_cluster(("sglang-0.5.23", "sglang-0.5.23")) as cluster:
        script = (script.replace("http://localhost:8080", f"http://127.0.0.1:{cluster.port}")
                  .replace('"sim-model"', f'"{MODEL}"'))
        env = {name: value for name, value in os.environ.items()  # no key from elsewhere
               if name not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL",
                               "ANTHROPIC_BASE_URL")}
        with trio.fail_after(120):
            done = await trio.run_process([sys.executable, "-c", script], env=env,
                                          capture_stdout=True, capture_stderr=True,
                                          check=False)
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, err[-3000:]
    lines = dict(line.split(":", 1) for line in out.splitlines())
    assert set(lines) == {"chat", "streamed", "responses", "messages"}, out
    worker = lines["chat"].split("| worker:")[1].split("|")[0].strip()
    assert worker in {engine.name for engine in cluster.engines}
    assert all(value.strip() for value in lines.values()), out
