"""``cortex serve`` as systemd runs it, as a process: sd_notify over a real ``NOTIFY_SOCKET``
bound by the test (READY=1 only once the data and control ports accept connections,
WATCHDOG=1 while the loop runs, STOPPING=1 on SIGTERM), and SIGHUP reloading the worker list
from the configuration file (a new worker listed and served, a removed one drained) while a
keep-alive client and a streamed response carry on across the reloads.

The unit itself runs under a real systemd manager in ``test_systemd_demo.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import trio

from cortex.sim.engine import SimEngine
from cortex.sim.serving import TimingConfig
from tests import deepseek_profile as ds
from tests.component.test_systemd_notify import notify_socket
from tests.front_http_client import RawClient
from tests.gateway_cluster import BLOCK, MODEL, _run_engine, model_profile, template_path
from tests.integration.test_cli_serve_sim import read_line

TOKEN = "reload-test-token"
ADMIN = [(b"authorization", b"Bearer " + TOKEN.encode())]


def serve_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "cortex", "serve", "--server-host", "127.0.0.1",
            "--server-port", "0", "--control-port", "0", *args]


async def next_message(sock) -> str:
    with trio.fail_after(60):
        await trio.lowlevel.wait_readable(sock)
    return sock.recv(4096).decode()


def ports(line: str) -> tuple[int, int]:
    data, control = line.split("data plane on ")[1].split(", control plane on ")
    return int(data.rsplit(":", 1)[1]), int(control.rsplit(":", 1)[1])


async def stop(process: trio.Process | None) -> None:
    if process is not None and process.returncode is None:
        process.kill()
        await process.wait()


async def test_ready_after_both_listeners_then_watchdog_pings_then_stopping_on_sigterm():
    with notify_socket() as (name, sock):
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "NOTIFY_SOCKET": name,
               "WATCHDOG_USEC": "400000"}
        serve = await trio.lowlevel.open_process(serve_command(), stdout=subprocess.PIPE,
                                                 env=env)
        try:
            ready = await next_message(sock)
            assert ready.startswith("READY=1\nSTATUS=serving on port ")
            data_port = int(ready.rsplit(" ", 1)[1])
            # Both listeners accept now; nothing is told to systemd before that.
            with trio.fail_after(30):
                for port in (data_port, ports(await read_line(serve, bytearray()))[1]):
                    client = await RawClient.connect(port)
                    assert (await client.request(b"GET", b"/health/live")).status == 200
                    await client.aclose()
            pings = [await next_message(sock) for _ in range(3)]
            assert pings == ["WATCHDOG=1"] * 3
            serve.send_signal(signal.SIGTERM)
            while (message := await next_message(sock)) == "WATCHDOG=1":
                pass
            assert message == "STOPPING=1\nSTATUS=draining"
            with trio.fail_after(60):
                assert await serve.wait() == 0
        finally:
            await stop(serve)


def config_text(engines: list[SimEngine], weights: dict[str, float] | None = None) -> str:
    weights = weights or {}
    text = f"""
[control]
admin_token = "{TOKEN}"

[health]
interval_s = 0.2
load_interval_s = 0.2

[log]
access_log = true

[[models]]
name = "{MODEL}"
tokenizer = {json.dumps(ds.TOKENIZER_JSON)}
block_size = {BLOCK}
chat_template = {json.dumps(template_path())}
bos_token = {json.dumps(ds.BOS)}
eos_token = {json.dumps(ds.EOS)}
"""
    for engine in engines:
        text += f"""
[[workers]]
name = "{engine.name}"
url = "{engine.url}"
engine = "sglang"
model = "{MODEL}"
events = "{engine.kv.endpoints(0).pub}"
replay = "{engine.kv.endpoints(0).replay}"
weight = {weights.get(engine.name, 1.0)}
"""
    return text


async def workers_listed(control_port: int) -> dict[str, dict]:
    client = await RawClient.connect(control_port)
    try:
        answer = await client.request(b"GET", b"/admin/workers", headers=ADMIN)
    finally:
        await client.aclose()
    assert answer.status == 200
    return {w["name"]: w for w in json.loads(answer.body)["workers"]}


async def until_listed(control_port: int, check) -> dict[str, dict]:
    """Poll the admin API of the separate process until ``check(workers)`` holds."""
    with trio.fail_after(60):
        while not check(workers := await workers_listed(control_port)):
            await trio.sleep(0.1)
    return workers


def chat(question: str, **extra: object) -> bytes:
    return json.dumps({"model": MODEL, "max_tokens": 3, "messages": [
        {"role": "user", "content": question}], **extra}).encode()


async def test_sighup_reloads_workers_without_dropping_connections(tmp_path: Path):
    timing = TimingConfig(prefill_tokens_per_s=1e6, decode_s_per_token=0.02, max_running=64)
    engines = [SimEngine(name, "sglang-0.5.23", model_profile(), block_size=BLOCK,
                         timing=timing) for name in ("e0", "e1")]
    config = tmp_path / "cortex.toml"
    serve = None
    async with trio.open_nursery() as nursery:
        for engine in engines:
            await nursery.start(_run_engine, engine)
        config.write_text(config_text(engines[:1]))
        with notify_socket() as (name, sock):
            env = {**os.environ, "PYTHONUNBUFFERED": "1", "NOTIFY_SOCKET": name}
            log_path = tmp_path / "stderr.log"  # a file: a full pipe would block the process
            with open(log_path, "wb") as log_file:  # noqa: ASYNC230 (opening a local file)
                serve = await trio.lowlevel.open_process(
                    serve_command("--config", str(config)), stdout=subprocess.PIPE,
                    stderr=log_file, env=env)
            try:
                assert (await next_message(sock)).startswith("READY=1")
                with trio.fail_after(30):
                    data_port, control_port = ports(await read_line(serve, bytearray()))
                await until_listed(control_port, lambda w: w["e0"]["live"])

                keepalive = await RawClient.connect(data_port)
                first = await keepalive.request(b"POST", b"/v1/chat/completions",
                                                chat("before"))
                assert (first.status, first.header(b"x-cortex-assigned-worker")) == (200, b"e0")

                # A streamed answer in flight on another connection while we reload.
                streaming = await RawClient.connect(data_port)
                payload = chat("long", stream=True, max_tokens=40)
                await streaming.send(b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\n"
                                     b"content-length: %d\r\n\r\n" % len(payload) + payload)
                assert (await streaming.read_head())[0] == 200
                assert await streaming.read_chunk()

                # Reload 1: a second worker.
                config.write_text(config_text(engines))
                serve.send_signal(signal.SIGHUP)
                assert (await next_message(sock)).startswith("RELOADING=1\nMONOTONIC_USEC=")
                assert (await next_message(sock)).startswith("READY=1")
                workers = await until_listed(control_port,
                                             lambda w: "e1" in w and w["e1"]["live"])
                assert workers["e0"]["live"] and not workers["e0"]["draining"]

                # Reload 2: e0 leaves (drained after its in-flight stream), e1's weight changes.
                config.write_text(config_text(engines[1:], {"e1": 2.5}))
                serve.send_signal(signal.SIGHUP)
                workers = await until_listed(
                    control_port, lambda w: "e0" not in w and w["e1"]["weight"] == 2.5
                    and w["e1"]["live"])
                chunks = []
                while chunk := await streaming.read_chunk():
                    chunks.append(chunk)
                assert b"".join(chunks).endswith(b"data: [DONE]\n\n")  # never cut
                await streaming.aclose()

                # The same keep-alive connection, now served by the new worker.
                after = await keepalive.request(b"POST", b"/v1/chat/completions", chat("after"))
                assert (after.status, after.header(b"x-cortex-assigned-worker")) == (200, b"e1")
                await keepalive.aclose()

                # A broken file changes nothing: the error is logged, the workers stay.
                config.write_text(config_text(engines[1:]) + "[health]\ninterval_s = -1\n")
                serve.send_signal(signal.SIGHUP)
                assert (await next_message(sock)).startswith("RELOADING=1")
                assert (await next_message(sock)).startswith("READY=1")
                assert list(await workers_listed(control_port)) == ["e1"]

                serve.send_signal(signal.SIGTERM)
                with trio.fail_after(60):
                    assert await serve.wait() == 0
                errors = log_path.read_text()
                records = [json.loads(line) for line in errors.splitlines()]
                assert TOKEN not in errors
                reloads = [r["message"] for r in records if r["message"].startswith("SIGHUP")]
                assert reloads[0] == "SIGHUP: workers reloaded: added e1"
                assert reloads[1] == "SIGHUP: workers reloaded: draining e0, replaced e1"
                assert reloads[2].startswith("SIGHUP: configuration not reloaded: ")
                access = [r for r in records if r["logger"] == "cortex.access"]
                assert [r["worker"] for r in access if r["path"] == "/v1/chat/completions"] == [
                    "e0", "e0", "e1"]
                assert all(r["request_id"] for r in access)
            finally:
                await stop(serve)
        nursery.cancel_scope.cancel()
