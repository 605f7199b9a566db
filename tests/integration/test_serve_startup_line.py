"""``cortex serve`` as a process logs one start-up line: both listeners with the ports bound,
every model with its block size and worker count, every worker (``cortex.serve_summary``).

The workers' URLs lead nowhere (nothing listens): Cortex serves regardless, and a passthrough
model needs no tokenizer, so the test needs no engine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import trio

from tests.integration.test_cli_serve_sim import read_stream_line


async def serve_log_lines(*flags: str, after_summary: int = 0) -> list[dict]:
    """``cortex serve`` with ``flags`` (ephemeral ports, JSON logs) as a process: its log lines
    up to the start-up summary and ``after_summary`` more, then SIGTERM."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORTEX_")}
    env["PYTHONUNBUFFERED"] = "1"
    serve = await trio.lowlevel.open_process(
        [sys.executable, "-m", "cortex", "serve", "--server-host", "127.0.0.1",
         "--server-port", "0", "--control-port", "0", "--log-json", "true", *flags],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        with trio.fail_after(60):
            buffer = bytearray()
            lines: list[dict] = []
            while not any(line["message"].startswith("serving:") for line in lines):
                lines.append(json.loads(await read_stream_line(serve.stderr, buffer)))
            for _ in range(after_summary):
                lines.append(json.loads(await read_stream_line(serve.stderr, buffer)))
    finally:
        serve.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            await serve.wait()
    return lines


async def test_serve_logs_listeners_models_and_workers_once_it_serves():
    lines = await serve_log_lines(
        "--model", "m,passthrough=true",
        "--worker", "http://127.0.0.1:9,name=w0,engine=vllm,model=m",
        "--worker", "http://127.0.0.1:10,name=w1,engine=sglang,model=m,dp_size=2")
    summaries = [line for line in lines if line["message"].startswith("serving:")]
    assert len(summaries) == 1 and summaries[0]["level"] == "info"
    message = summaries[0]["message"]
    control = next(line["message"] for line in lines if "Running on http://" in line["message"])
    control_port = int(control.split("Running on http://")[1].split()[0].rsplit(":", 1)[1])
    assert message.startswith("serving: data plane 127.0.0.1:")
    assert f", control plane 127.0.0.1:{control_port}; " in message
    assert ":0," not in message  # the ports bound, not the configured 0
    assert "; models: m (passthrough, 2 workers); " in message
    assert message.endswith("workers: w0 vllm http://127.0.0.1:9, "
                            "w1 sglang http://127.0.0.1:10 dp 2")


async def test_serve_with_nothing_to_serve_says_what_is_missing_once():
    """A new user's ``cortex serve`` with no model and no worker starts (workers may come
    later), and one warning says what is missing and where to start."""
    lines = await serve_log_lines(after_summary=1)
    warnings = [line for line in lines if line["level"] == "warning"]
    assert len(warnings) == 1, lines
    message = warnings[0]["message"]
    assert message.startswith("nothing to serve: no model and no worker configured")
    assert "--worker" in message and "Quick start without a GPU" in message
