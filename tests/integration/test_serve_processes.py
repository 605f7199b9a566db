"""``server.processes = 2`` as an operator runs it: ``cortex serve`` (process 0) starts a second
process on the same data port; both serve, each with its own ledger, sharing requests in flight
over IPC; one control plane shows both processes' metrics, applies admin changes on both and
says ``degraded`` while one is not serving; a process killed with SIGKILL is started again while
the other serves; SIGTERM stops both (exit 0); and when process 0 itself is killed, the other
stops by itself instead of serving a port nobody supervises."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import trio
from prometheus_client.parser import text_string_to_metric_families

from tests import deepseek_profile as ds
from tests.front_http_client import RawClient
from tests.gateway_cluster import SYSTEM_TEXT, template_path
from tests.integration.test_cli_serve_sim import read_line, request, serving_ports

MODEL = "deepseek"
TOKEN = "processes-test-token"


async def get(port: int, path: str, token: str | None = None) -> tuple[int, bytes]:
    client = await RawClient.connect(port)
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    try:
        answer = await client.request(b"GET", path.encode(), headers=headers)
    finally:
        await client.aclose()
    return answer.status, answer.body


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """``labels -> value`` of every sample named ``name`` (the exposition parsed as Prometheus
    parses it: a merge that broke the format raises here)."""
    return {tuple(sorted(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == name}


def per_process(text: str, name: str) -> dict[str, float]:
    totals: dict[str, float] = {}
    for labels, value in samples(text, name).items():
        process = dict(labels)["process"]
        totals[process] = totals.get(process, 0.0) + value
    return totals


def children_of(pid: int) -> list[int]:
    """Processes started by ``pid`` (from any of its threads: trio starts them from one)."""
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(part) for part in f.read().split()]
        except FileNotFoundError:
            continue
    return found


async def start(env: dict[str, str]) -> tuple[trio.Process, trio.Process, int, int]:
    sim = await trio.lowlevel.open_process(
        [sys.executable, "-m", "cortex", "sim", "--engine", "sglang", "--count", "2",
         "--port", "0", "--block-size", "16", "--model", MODEL, "--tokenizer", ds.TOKENIZER_JSON,
         "--chat-template", template_path(), "--bos-token", ds.BOS, "--eos-token", ds.EOS],
        stdout=subprocess.PIPE, env=env)
    buffer = bytearray()
    workers = []
    for _ in range(2):
        name, _profile, url, _events, rank0, replay0 = (await read_line(sim, buffer)).split()[:6]
        workers += ["--worker", f"{url},name={name},engine=sglang,model={MODEL},"
                    f"events={rank0.split('=', 1)[1]},replay={replay0.split('=', 1)[1]}"]
    serve = await trio.lowlevel.open_process(
        [sys.executable, "-m", "cortex", "serve", "--server-host", "127.0.0.1",
         "--server-port", "0", "--control-port", "0", "--health-interval-s", "0.2",
         "--server-processes", "2", "--control-admin-token", TOKEN,
         "--model", f"{MODEL},tokenizer={ds.TOKENIZER_JSON},block_size=16,"
         f"chat_template={template_path()},bos_token={ds.BOS},eos_token={ds.EOS}",
         *workers], stdout=subprocess.PIPE, env=env)
    port, control = await serving_ports(serve)
    return sim, serve, port, control


def chat(question: str) -> dict:
    return {"model": MODEL, "max_tokens": 2, "messages": [
        {"role": "system", "content": SYSTEM_TEXT}, {"role": "user", "content": question}]}


async def until(condition, *, every_s: float = 0.1) -> None:  # type: ignore[no-untyped-def]
    """Poll another process's state (nothing here can wake us when it changes)."""
    while not await condition():
        await trio.sleep(every_s)


async def stop(*processes: trio.Process | None) -> None:
    for process in processes:
        if process is not None and process.returncode is None:
            process.kill()
            await process.wait()


async def test_two_processes_serve_one_port_under_one_control_plane():
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    sim = serve = None
    try:
        with trio.fail_after(90):
            sim, serve, port, control = await start(env)
            [child] = children_of(serve.pid)

            # both processes serve the one port (the kernel spreads new connections)
            for i in range(200):
                status, _, _ = await request(port, chat(f"question {i}"))
                assert status == 200
                _, text = await get(control, "/metrics")
                served = per_process(text.decode(), "cortex_http_responses_total")
                if served.get("0") and served.get("1"):
                    break
            else:
                raise AssertionError(f"one process took every connection: {served}")
            assert per_process(text.decode(), "cortex_processes_serving") == {"0": 2.0}

            async def each_hears_the_other() -> bool:  # replica sync over IPC (heartbeats)
                _, text = await get(control, "/metrics")
                return per_process(text.decode(), "cortex_replica_peers") == {"0": 1, "1": 1}
            await until(each_hears_the_other)

            # an admin change made on the control plane is made by both processes
            client = await RawClient.connect(control)
            answer = await client.request(b"DELETE", b"/admin/workers/sim1", headers=[
                (b"authorization", f"Bearer {TOKEN}".encode())])
            await client.aclose()
            assert answer.status == 200, answer.body

            async def sim1_gone() -> bool:
                _, text = await get(control, "/metrics")
                return not any(dict(labels).get("worker") == "sim1" for labels in samples(
                    text.decode(), "cortex_worker_healthy"))
            await until(sim1_gone)

            # process 1 killed: the other serves, it is started again, readiness says so
            os.kill(child, signal.SIGKILL)

            async def degraded() -> bool:
                _, body = await get(control, "/health/ready")
                return "process 1: not serving" in json.loads(body)["reasons"]
            await until(degraded, every_s=0.01)
            for i in range(10):
                status, _, _ = await request(port, chat(f"while one is down {i}"))
                assert status == 200

            async def ready_again() -> bool:
                _, body = await get(control, "/health/ready")
                return json.loads(body)["status"] == "ready"
            await until(ready_again)
            _, text = await get(control, "/metrics")
            assert per_process(text.decode(), "cortex_process_restarts_total") == {"0": 1.0}

            # started again from the configuration (sim0 and sim1), it is given the admin
            # change made since: sim1 removed there too
            async def process_1_has_only_sim0() -> bool:
                _, text = await get(control, "/metrics")
                return [dict(labels)["worker"] for labels in samples(
                    text.decode(), "cortex_worker_healthy")
                    if dict(labels)["process"] == "1"] == ["sim0"]
            await until(process_1_has_only_sim0)
            [again] = children_of(serve.pid)
            assert again != child

            # SIGTERM: both drain and stop
            serve.send_signal(signal.SIGTERM)
            assert await serve.wait() == 0
            assert not os.path.exists(f"/proc/{again}")  # waited for by process 0
    finally:
        await stop(serve, sim)


async def test_the_other_process_stops_when_process_0_is_killed():
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    sim = serve = None
    try:
        with trio.fail_after(90):
            sim, serve, _, _ = await start(env)
            [child] = children_of(serve.pid)
            serve.kill()
            await serve.wait()

            async def gone() -> bool:  # ended, reaped by whoever adopted it
                return not os.path.exists(f"/proc/{child}")
            await until(gone)
    finally:
        await stop(serve, sim)
