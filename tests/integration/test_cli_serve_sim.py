"""The operator's path, as processes: ``cortex sim`` starts two engines, ``cortex serve`` routes
to them on their KV events; a shared prefix lands on its holder with the hit in the headers; a
SIGTERM (even sent twice) lets an in-flight streamed request finish before Cortex exits 0."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys

import trio

from tests import deepseek_profile as ds
from tests.front_http_client import RawClient, chat_request
from tests.gateway_cluster import SYSTEM_TEXT, template_path

MODEL = "deepseek"


async def read_line(process: trio.Process, buffer: bytearray) -> str:
    return await read_stream_line(process.stdout, buffer)


async def until_serving(serve: trio.Process) -> int:
    """The data port ``cortex serve`` printed first, once its readiness probe says ready and
    not degraded (a separate process: its endpoint is polled)."""
    return (await serving_ports(serve))[0]


async def serving_ports(serve: trio.Process) -> tuple[int, int]:
    """``until_serving``'s data port and the control plane's port."""
    started = await read_line(serve, bytearray())
    port = int(started.split("data plane on ")[1].split(",")[0].rsplit(":", 1)[1])
    control = int(started.split("control plane on ")[1].strip().rsplit(":", 1)[1])
    while True:
        client = await RawClient.connect(port)
        answer = await client.request(b"GET", b"/health/ready")
        await client.aclose()
        if answer.status == 200 and not json.loads(answer.body)["degraded"]:
            return port, control  # not degraded: every worker agrees with the profile
        await trio.sleep(0.1)


async def until_fastokens(control: int, model: str) -> str:
    """``/metrics`` of a ``cortex serve``, once they say ``model``'s new text is encoded by
    fastokens: its start check passed (in the background, after the start)."""
    while True:
        client = await RawClient.connect(control)
        metrics = (await client.request(b"GET", b"/metrics")).body.decode()
        await client.aclose()
        if f'cortex_tokenizer_backend{{model="{model}",backend="fastokens"}} 1\n' in metrics:
            return metrics
        await trio.sleep(0.1)


async def read_stream_line(stream: trio.abc.ReceiveStream, buffer: bytearray) -> str:
    while b"\n" not in buffer:
        data = await stream.receive_some(4096)
        if not data:
            raise EOFError(f"process ended: {bytes(buffer)!r}")
        buffer += data
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return line.decode()


async def request(port: int, body: dict, *, stream: bool = False) -> tuple[int, dict, bytes]:
    client = await RawClient.connect(port)
    try:
        response = await client.request(b"POST", b"/v1/chat/completions",
                                        json.dumps(body).encode())
    finally:
        await client.aclose()
    return response.status, dict(response.headers), response.body


async def test_cortex_serve_in_front_of_cortex_sim_processes():
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    common = ["--model", MODEL, "--tokenizer", ds.TOKENIZER_JSON, "--chat-template",
              template_path(), "--bos-token", ds.BOS, "--eos-token", ds.EOS]
    sim = await trio.lowlevel.open_process(
        [sys.executable, "-m", "cortex", "sim", "--engine", "sglang", "--count", "2",
         "--port", "0", "--block-size", "16", "--decode-ms-per-token", "20", *common],
        stdout=subprocess.PIPE, env=env)
    serve = None
    try:
        with trio.fail_after(60):
            buffer = bytearray()
            lines = [await read_line(sim, buffer) for _ in range(2)]
            workers = []
            for line in lines:
                name, _profile, url, _events, rank0, replay0 = line.split()[:6]
                workers += ["--worker", f"{url},name={name},engine=sglang,model={MODEL},"
                            f"events={rank0.split('=', 1)[1]},replay={replay0.split('=', 1)[1]}"]
            serve = await trio.lowlevel.open_process(
                [sys.executable, "-m", "cortex", "serve", "--server-host", "127.0.0.1",
                 "--server-port", "0", "--control-port", "0", "--health-interval-s", "0.2",
                 "--model", f"{MODEL},tokenizer={ds.TOKENIZER_JSON},block_size=16,"
                 f"chat_template={template_path()},bos_token={ds.BOS},eos_token={ds.EOS}",
                 *workers], stdout=subprocess.PIPE, env=env)
            port, control = await serving_ports(serve)
            metrics = await until_fastokens(control, MODEL)
            assert f'cortex_tokenizer_fallbacks_total{{model="{MODEL}"}} 0\n' in metrics

            def body(question: str, **extra: object) -> dict:
                return {"model": MODEL, "max_tokens": 3, "messages": [
                    {"role": "system", "content": SYSTEM_TEXT},
                    {"role": "user", "content": question}], **extra}

            status, headers, _ = await request(port, body("first"))
            assert status == 200
            holder = headers[b"x-cortex-assigned-worker"]
            while True:  # the holder's KV events reach Cortex asynchronously
                status, headers, raw = await request(port, body("next"))
                if headers[b"x-cortex-match-mode"] == b"exact_kv_events":
                    break
                await trio.sleep(0.05)
            assert headers[b"x-cortex-assigned-worker"] == holder
            assert int(headers[b"x-cortex-cache-hit-tokens"]) == json.loads(raw)["usage"][
                "prompt_tokens_details"]["cached_tokens"] > 0
            client = await RawClient.connect(control)  # the renders were counted, by kind
            metrics = (await client.request(b"GET", b"/metrics")).body.decode()
            await client.aclose()
            rendered = [line for line in metrics.splitlines()
                        if line.startswith(f'cortex_chat_renders_total{{model="{MODEL}"')]
            assert sum(float(line.rsplit(" ", 1)[1]) for line in rendered) >= 2, rendered

            # Graceful shutdown: a streamed request in flight finishes after SIGTERM.
            client = await RawClient.connect(port)
            payload = json.dumps(body("long", stream=True, max_tokens=30)).encode()
            await client.send(chat_request(payload))
            status, _, _ = await client.read_head()
            assert status == 200
            assert await client.read_chunk()
            serve.send_signal(signal.SIGTERM)
            chunks = [await client.read_chunk()]
            # A second SIGTERM while draining (systemd and a launcher may both send one) must
            # not kill the drain: it used to hit the restored default action and cut the stream.
            serve.send_signal(signal.SIGTERM)
            while chunk := await client.read_chunk():
                chunks.append(chunk)
            assert b"".join(chunks).endswith(b"data: [DONE]\n\n")
            await client.aclose()
            assert await serve.wait() == 0
    finally:
        for process in (serve, sim):
            if process is not None and process.returncode is None:
                process.kill()
                await process.wait()


async def test_cortex_serve_runs_the_line_cortex_sim_prints():
    """``cortex sim`` prints a ready-to-paste ``cortex serve`` line (stderr) for the engines it
    started — profile files, BOS/EOS (shell-quoted), DP size, the event and replay ports it was
    given — and Cortex started from that line routes exactly to them."""
    from cortex.sim.publisher import find_free_port_range

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    first = find_free_port_range(8)  # events: first .. +3, replay: +4 .. +7 (2 engines x DP 2)
    sim = await trio.lowlevel.open_process(
        [sys.executable, "-m", "cortex", "sim", "--engine", "vllm", "--count", "2", "--port", "0",
         "--dp-size", "2", "--kv-events-port", str(first), "--replay-port", str(first + 4),
         "--model", MODEL, "--tokenizer", ds.TOKENIZER_JSON, "--chat-template", template_path(),
         "--bos-token", ds.BOS, "--eos-token", ds.EOS],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    serve = None
    try:
        with trio.fail_after(60):
            out = bytearray()
            lines = [(await read_line(sim, out)).split() for _ in range(2)]
            assert [line[4:] for line in lines] == [
                [f"rank{rank}=tcp://127.0.0.1:{first + 2 * i + rank}" if kind == "rank" else
                 f"replay{rank}=tcp://127.0.0.1:{first + 4 + 2 * i + rank}"
                 for rank in range(2) for kind in ("rank", "replay")] for i in range(2)]
            err = bytearray()
            while not (line := await read_stream_line(sim.stderr, err)).startswith("cortex serve "):
                pass
            argv = shlex.split(line)
            assert argv[:4] == ["cortex", "serve", "--model",
                                f"{MODEL},tokenizer={ds.TOKENIZER_JSON},block_size=16,"
                                f"chat_template={template_path()},bos_token={ds.BOS},"
                                f"eos_token={ds.EOS}"]
            assert argv[4:] == [part for i in range(2) for part in (
                "--worker", f"{lines[i][2]},name=sim{i},engine=vllm,dp_size=2,"
                f"events=tcp://127.0.0.1:{first + 2 * i},"
                f"replay=tcp://127.0.0.1:{first + 4 + 2 * i}")]
            serve = await trio.lowlevel.open_process(
                [sys.executable, "-m", "cortex", *argv[1:], "--server-host", "127.0.0.1",
                 "--server-port", "0", "--control-port", "0", "--health-interval-s", "0.2"],
                stdout=subprocess.PIPE, env=env)
            port = await until_serving(serve)
            body = {"model": MODEL, "max_tokens": 2, "messages": [
                {"role": "system", "content": SYSTEM_TEXT}, {"role": "user", "content": "hi"}]}
            status, headers, _ = await request(port, body)
            assert status == 200
            while True:  # the holder's KV events reach Cortex asynchronously
                status, headers, raw = await request(port, body)
                if headers[b"x-cortex-match-mode"] == b"exact_kv_events":
                    break
                await trio.sleep(0.05)
            assert int(headers[b"x-cortex-cache-hit-tokens"]) == json.loads(raw)["usage"][
                "prompt_tokens_details"]["cached_tokens"] > 0
    finally:
        for process in (serve, sim):
            if process is not None and process.returncode is None:
                process.kill()
                await process.wait()

