"""``cortex sim``: flags and their environment twins, and a real process serving until SIGINT.

The process is known to be ready when it has printed one line per engine (it prints each
line only once that engine listens)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys

import pytest
import trio

from cortex.errors import ConfigError
from cortex.sim.cli import _plan, add_sim_arguments
from tests import deepseek_profile as ds


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_sim_arguments(parser)
    return parser.parse_args(argv)


def test_count_engines_get_consecutive_ports():
    plan = _plan(parse(["--engine", "sglang", "--port", "9000", "--kv-events-port", "7000",
                        "--dp-size", "2", "--count", "3"]))
    assert plan.profile == "sglang-0.5.23"
    assert plan.names == ["sim0", "sim1", "sim2"]
    assert plan.http_ports == [9000, 9001, 9002]
    assert plan.kv_ports == [7000, 7002, 7004]
    assert _plan(parse([])).http_ports == [8000]  # vLLM's default port
    assert _plan(parse(["--port", "0", "--count", "2"])).http_ports == [0, 0]


def test_environment_twins_replace_defaults_and_flags_win(monkeypatch):
    monkeypatch.setenv("CORTEX_SIM_DECODE_MS_PER_TOKEN", "7.5")
    monkeypatch.setenv("CORTEX_SIM_ENGINE", "vllm-0.25")
    monkeypatch.setenv("CORTEX_SIM_ADD_BOS", "true")
    args = parse(["--engine", "sglang-0.5.19"])
    assert args.decode_ms_per_token == 7.5
    assert args.engine == "sglang-0.5.19"
    assert args.add_bos is True


def test_bad_flags_are_all_reported():
    with pytest.raises(ConfigError) as info:
        _plan(parse(["--engine", "tgi", "--count", "0", "--block-size", "0"]))
    assert len(info.value.problems) == 3


async def test_cortex_sim_process_serves_until_sigint(tmp_path):
    template = tmp_path / "chat.jinja"
    template.write_text(ds.TEMPLATE)
    argv = [sys.executable, "-m", "cortex", "sim", "--engine", "sglang", "--port", "0",
            "--count", "2", "--dp-size", "2", "--model", "deepseek",
            "--tokenizer", ds.TOKENIZER_JSON, "--chat-template", str(template),
            "--bos-token", ds.BOS, "--eos-token", ds.EOS]
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            process = await nursery.start(partial_process(argv))
            assert process.stdout is not None
            buffer = b""
            while buffer.count(b"\n") < 2:
                data = await process.stdout.receive_some(4096)
                assert data, "cortex sim exited early"
                buffer += data
            lines = buffer.decode().splitlines()
            urls = [line.split()[2] for line in lines]
            for line in lines:
                name, profile, url, word, *endpoints = line.split()
                assert profile == "sglang-0.5.23" and word == "events"
                assert [e.split("=")[0] for e in endpoints] == ["rank0", "replay0",
                                                               "rank1", "replay1"]
            answers = [await trio.to_thread.run_sync(_chat, url) for url in urls]
            process.send_signal(signal.SIGINT)
            assert await process.wait() == 0
    assert all(a["usage"]["completion_tokens"] == 2 for a in answers)
    assert len(set(urls)) == 2


def partial_process(argv: list[str]):  # noqa: ANN201
    async def start(*, task_status: trio.TaskStatus[trio.Process]) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        await trio.run_process(argv, stdout=subprocess.PIPE, env=env, check=False,
                               task_status=task_status)

    return start


def _chat(url: str) -> dict:
    import urllib.request

    body = json.dumps({"model": "deepseek", "max_tokens": 2,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = urllib.request.Request(url + "/v1/chat/completions", body,
                                     {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@pytest.mark.parametrize("flag", ["--port", "--kv-events-port"])
async def test_a_port_in_use_is_reported_with_exit_code_2(flag):
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    try:
        with trio.fail_after(60):
            result = await trio.run_process(
                [sys.executable, "-m", "cortex", "sim", "--port", "0", flag, str(port)],
                capture_stdout=True, capture_stderr=True, check=False)
    finally:
        await listener.aclose()
    assert result.returncode == 2
    assert b"cortex sim:" in result.stderr
    assert result.stdout == b""
