"""Smoke test of the one-file executable ``dist/cortex`` (``make dist``), as an operator runs
it: ``--version``; ``check-config`` on the example configuration; ``cortex sim`` plus
``cortex serve`` from the binary answering a routed chat request with its ``x-cortex-*``
headers (a cache hit predicted exactly) once the bundled fastokens passed its start check, then
a graceful SIGTERM; and the README's "Quick start
without a GPU" exactly as written, with the binary as ``cortex`` (``tests/readme_quick_start``):
no profile files named, so the built-in DeepSeek profile must be inside the binary.

Skipped, with the reason, when the binary has not been built or is older than the sources it
was built from (a stale binary would test yesterday's code); with ``CORTEX_DIST_REQUIRED=1``
(``make dist-smoke``, and CI, which builds it first) that is a failure instead.
``CORTEX_DIST_BINARY`` points at another binary.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import trio

import cortex
from tests import deepseek_profile as ds
from tests.gateway_cluster import SYSTEM_TEXT, template_path
from tests.integration.test_cli_serve_sim import (
    read_line,
    request,
    serving_ports,
    until_fastokens,
)
from tests.readme_quick_start import check_cache_hit_on_second_send, run_quick_start

ROOT = Path(__file__).resolve().parents[2]
BINARY = Path(os.environ.get("CORTEX_DIST_BINARY") or ROOT / "dist" / "cortex")
MODEL = "deepseek"


def _skip_reason() -> str | None:
    if not BINARY.is_file():
        return f"{BINARY} is not built: run `make dist` (or `make dist-smoke`)"
    built = BINARY.stat().st_mtime
    sources = [ROOT / "pyproject.toml", ROOT / "packaging" / "cortex.spec",
               *(ROOT / "cortex").rglob("*.py"), *(ROOT / "cortex").rglob("*.pyx"),
               *(ROOT / "cortex").rglob("*.toml")]
    newer = [path for path in sources if path.exists() and path.stat().st_mtime > built]
    if newer and "CORTEX_DIST_BINARY" not in os.environ:
        return (f"{BINARY} is older than {newer[0].relative_to(ROOT)} (and {len(newer) - 1} "
                f"more): run `make dist` again")
    return None


@pytest.fixture(autouse=True)
def built_binary() -> None:
    """Skip without a fresh binary, or fail when it is required (``make dist-smoke``, CI)."""
    reason = _skip_reason()
    if reason is not None:
        if os.environ.get("CORTEX_DIST_REQUIRED") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BINARY), *args], capture_output=True, text=True, timeout=180,
                          env={**os.environ, **(env or {})}, cwd="/")


def test_version():
    done = run("--version")
    assert (done.returncode, done.stdout.strip()) == (0, f"cortex {cortex.__version__}")


def test_check_config_on_the_example_configuration():
    example = str(ROOT / "packaging" / "cortex.toml")
    done = run("check-config", "--no-file-checks", "--config", example)  # placeholder paths
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "ok", "")
    printed = run("check-config", "--no-file-checks", "--config", example, "--print-config",
                  env={"CORTEX_CONTROL_ADMIN_TOKEN": "binary-secret"})
    assert printed.returncode == 0
    assert "binary-secret" not in printed.stdout and 'admin_token = "***"' in printed.stdout
    broken = run("check-config", "--no-file-checks", "--config", example,
                 "--server-port", "70000", "--health-interval-s", "0")
    assert broken.returncode == 2 and broken.stderr.count("\n  ") >= 2  # every problem


async def test_sim_and_serve_from_the_binary_route_a_chat_request():
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    profile = ["--model", MODEL, "--tokenizer", ds.TOKENIZER_JSON, "--chat-template",
               template_path(), "--bos-token", ds.BOS, "--eos-token", ds.EOS]
    sim = await trio.lowlevel.open_process(
        [str(BINARY), "sim", "--engine", "sglang", "--count", "2", "--port", "0",
         "--block-size", "16", *profile], stdout=subprocess.PIPE, env=env)
    serve = None
    try:
        with trio.fail_after(180):  # two one-file binaries unpack themselves first
            buffer = bytearray()
            workers = []
            for _ in range(2):
                name, _profile, url, _events, rank0, replay0 = (
                    await read_line(sim, buffer)).split()[:6]
                workers += ["--worker", f"{url},name={name},engine=sglang,model={MODEL},"
                            f"events={rank0.split('=', 1)[1]},replay={replay0.split('=', 1)[1]}"]
            serve = await trio.lowlevel.open_process(
                [str(BINARY), "serve", "--server-host", "127.0.0.1", "--server-port", "0",
                 "--control-port", "0", "--health-interval-s", "0.2",
                 "--model", f"{MODEL},tokenizer={ds.TOKENIZER_JSON},block_size=16,"
                 f"chat_template={template_path()},bos_token={ds.BOS},eos_token={ds.EOS}",
                 *workers], stdout=subprocess.PIPE, env=env)
            port, control = await serving_ports(serve)
            await until_fastokens(control, MODEL)  # the bundled library passed its check

            def body(question: str) -> dict:
                return {"model": MODEL, "max_tokens": 3, "messages": [
                    {"role": "system", "content": SYSTEM_TEXT},
                    {"role": "user", "content": question}]}

            status, headers, _ = await request(port, body("first"))
            assert status == 200
            holder = headers[b"x-cortex-assigned-worker"]
            assert headers[b"x-cortex-match-mode"] in (
                b"exact_kv_events", b"load_aware", b"fallback_p2c", b"fallback_round_robin")
            while True:  # the holder's KV events reach Cortex asynchronously
                status, headers, raw = await request(port, body("next"))
                assert status == 200
                if headers[b"x-cortex-match-mode"] == b"exact_kv_events":
                    break
                await trio.sleep(0.05)
            assert headers[b"x-cortex-assigned-worker"] == holder
            assert int(headers[b"x-cortex-cache-hit-tokens"]) == json.loads(raw)["usage"][
                "prompt_tokens_details"]["cached_tokens"] > 0
            serve.send_signal(signal.SIGTERM)
            assert await serve.wait() == 0
    finally:
        for process in (serve, sim):
            # SIGINT first: the one-file bootloader passes it on to the real process, while a
            # SIGKILL of the bootloader would leave that child running.
            if process is not None and process.returncode is None:
                process.send_signal(signal.SIGINT)
                with trio.move_on_after(30):
                    await process.wait()
            if process is not None and process.returncode is None:
                process.kill()
                await process.wait()


async def test_the_readme_quick_start_with_the_binary():
    # two one-file binaries unpack themselves first
    check_cache_hit_on_second_send(await run_quick_start(BINARY.resolve(), timeout_s=240))
