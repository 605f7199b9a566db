"""``cortex sim --pd-role``: a prefill and a decode engine in two processes exchange a room's KV
over the prefill's bootstrap port (the transfer is TCP, not an in-process table)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Any

import pytest
import trio

from cortex.errors import ConfigError
from cortex.sim.cli import _plan, add_sim_arguments
from tests import deepseek_profile as ds
from tests.integration.test_sim_engine_cli import partial_process


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_sim_arguments(parser)
    return parser.parse_args(argv)


def test_prefill_engines_get_consecutive_bootstrap_ports():
    plan = _plan(parse(["--engine", "sglang", "--count", "2", "--pd-role", "prefill",
                        "--bootstrap-port", "9100"]))
    assert plan.bootstrap_ports == [9100, 9101]
    decode = _plan(parse(["--engine", "sglang", "--count", "2", "--pd-role", "decode",
                          "--bootstrap-port", "9100"]))
    assert decode.bootstrap_ports == [9100, 9100]  # the port a null bootstrap_port means
    assert _plan(parse([])).bootstrap_ports == [None]


def test_a_bad_pd_role_from_the_environment_is_reported(monkeypatch):
    monkeypatch.setenv("CORTEX_SIM_PD_ROLE", "both")
    with pytest.raises(ConfigError) as info:
        _plan(parse([]))
    assert "--pd-role" in info.value.problems[0]


def _post(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url + "/generate", json.dumps(body).encode(),
                                     {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


async def test_two_processes_hand_a_room_over(tmp_path):
    common = ["--engine", "sglang", "--port", "0", "--model", "deepseek",
              "--tokenizer", ds.TOKENIZER_JSON, "--pd-waiting-timeout-s", "20"]
    lines: dict[str, list[str]] = {}
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            processes = []
            for role, extra in (("prefill", ["--bootstrap-port", "0"]), ("decode", [])):
                argv = [sys.executable, "-m", "cortex", "sim", "--name", role[0],
                        "--pd-role", role, *common, *extra]
                process = await nursery.start(partial_process(argv))
                processes.append(process)
                buffer = b""
                while b"\n" not in buffer:
                    data = await process.stdout.receive_some(4096)
                    assert data, "cortex sim exited early"
                    buffer += data
                lines[role] = buffer.decode().split()
            assert lines["prefill"][-2:][0] == "pd=prefill"
            assert lines["decode"][-1] == "pd=decode"
            port = int(lines["prefill"][-1].removeprefix("bootstrap="))
            body = {"text": "Across two processes.", "sampling_params": {"max_new_tokens": 3},
                    "bootstrap_host": "127.0.0.1", "bootstrap_port": port,
                    "bootstrap_room": 424242}
            results: dict[str, tuple[int, bytes]] = {}

            async def leg(role: str) -> None:
                results[role] = await trio.to_thread.run_sync(_post, lines[role][2], body)

            async with trio.open_nursery() as legs:
                legs.start_soon(leg, "decode")
                legs.start_soon(leg, "prefill")
            for process in processes:
                process.send_signal(signal.SIGINT)
                assert await process.wait() == 0
    assert results["prefill"][0] == results["decode"][0] == 200
    assert json.loads(results["decode"][1])["text"] == " The quick brown"
    assert json.loads(results["prefill"][1])["meta_info"]["completion_tokens"] == 1
