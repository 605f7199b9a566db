"""The README's "Quick start without a GPU", run as a reader runs it.

``quick_start_script()`` is the shell block between the ``<!-- quick-start ... -->`` and
``<!-- /quick-start -->`` markers of README.md, unchanged. ``run_quick_start(cortex)`` runs it
with bash in its own session (process group), with ``cortex`` — the venv's console script or
the one-file binary — as the ``cortex`` on the ``PATH``, and returns what it printed; the
script's own lines start the engines and the gateway in the background, wait on the gateway's
readiness probe, send the chat request twice and stop both. ``responses(output)`` splits what
``curl -si`` printed into (status, headers, JSON body). The script writes the engines' and
Cortex's logs to files (``mktemp -d``, under the run's folder here); ``Run.stderr`` ends with
them.

The quick start uses fixed ports (a reader's copy has them too): one that is busy is a failure
naming it, not a hang. Anything still running when the script ends or times out is stopped
with its process group.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

README = Path(__file__).resolve().parent.parent / "README.md"
PORTS = (8080, 8081, 30000, 30001, 5557, 5558, 5657, 5658)  # Cortex, engines, events, replay


def quick_start_script() -> str:
    return readme_block("quick-start", "sh")


def readme_block(marker: str, language: str) -> str:
    """The fenced ``language`` block of README.md between ``<!-- marker ... -->`` and
    ``<!-- /marker -->``, unchanged."""
    text = README.read_text()
    begin = re.search(rf"^<!-- {re.escape(marker)}\b.*-->$", text, re.MULTILINE)
    assert begin is not None, f"README.md has no <!-- {marker} --> marker"
    block = text[begin.end():text.index(f"<!-- /{marker} -->", begin.end())].strip()
    fence = f"```{language}\n"
    assert block.startswith(fence) and block.endswith("\n```"), block[:80]
    return block.removeprefix(fence).removesuffix("```")


def busy_ports() -> list[int]:
    busy = []
    for port in PORTS:
        with socket.socket() as probe:
            # as the servers bind: a port held only by TIME_WAIT leftovers is free to them
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                busy.append(port)
    return busy


@dataclass(frozen=True, slots=True)
class Run:
    returncode: int
    stdout: str
    stderr: str


async def run_quick_start(cortex: Path, timeout_s: float) -> Run:
    busy = busy_ports()
    if busy:
        pytest.fail(f"the README's quick start needs ports {PORTS}; in use: {busy}")
    with tempfile.TemporaryDirectory(prefix="cortex-quick-start-") as folder:
        bin_dir = Path(folder) / "bin"
        bin_dir.mkdir()
        (bin_dir / "cortex").symlink_to(cortex)
        script = Path(folder) / "quick-start.sh"
        script.write_text(quick_start_script())
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
               "PYTHONUNBUFFERED": "1", "TMPDIR": folder}  # (its log folder: mktemp -d)
        process = await trio.lowlevel.open_process(
            ["bash", str(script)], cwd=folder, env=env, start_new_session=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = bytearray(), bytearray()
        try:
            with trio.fail_after(timeout_s):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_drain, process.stdout, out)
                    nursery.start_soon(_drain, process.stderr, err)
                    await process.wait()
        except trio.TooSlowError:
            pytest.fail(f"the quick start did not finish in {timeout_s} s:\n"
                        f"{out.decode(errors='replace')}\n{err.decode(errors='replace')[-3000:]}")
        finally:
            with trio.CancelScope(shield=True):
                await _stop_group(process.pid)
        logs = "".join(f"--- {path.name}\n{path.read_text(errors='replace')}"
                       for path in sorted(Path(folder).glob("*/*.log")))
    return Run(process.returncode, out.decode(errors="replace"),
               err.decode(errors="replace") + logs)


async def _drain(stream: trio.abc.ReceiveStream, into: bytearray) -> None:
    """Read to EOF: the engines and the gateway hold the pipes too, so EOF means all ended."""
    while data := await stream.receive_some(65536):
        into += data


async def _stop_group(pgid: int) -> None:
    """SIGINT to whatever is left of the script's process group (the one-file bootloader passes
    it on), SIGKILL to the group if that is not enough."""
    for sig, grace in ((signal.SIGINT, 20.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        with trio.move_on_after(grace):
            while True:
                try:
                    os.killpg(pgid, 0)
                except ProcessLookupError:
                    return
                await trio.sleep(0.1)  # not readiness: waiting for processes to be gone


def responses(output: str) -> list[tuple[int, dict[str, str], dict]]:
    """What ``curl -si`` printed: (status, headers with lower-case names, JSON body) each."""
    found = []
    for part in re.split(r"(?m)^(?=HTTP/1\.[01] \d{3})", output)[1:]:
        head, _, body = part.replace("\r\n", "\n").partition("\n\n")
        status_line, *header_lines = head.split("\n")
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        found.append((int(status_line.split()[1]), headers, json.loads(body.strip())))
    return found


def check_cache_hit_on_second_send(run: Run) -> None:
    """Two 200 answers; the second from the first's engine, its predicted hit > 0 and equal to
    the engine's own cached_tokens."""
    assert run.returncode == 0, run.stderr[-3000:]
    assert "serving:" not in run.stdout and "serving:" in run.stderr  # logs apart from curl's
    answers = responses(run.stdout)
    assert [status for status, _, _ in answers] == [200, 200], run.stdout + run.stderr[-3000:]
    (_, first, _), (_, second, body) = answers
    assert first["x-cortex-cache-hit-tokens"] == "0"
    assert first["x-cortex-match-mode"] == "load_aware"  # as the README explains it
    hit = int(second["x-cortex-cache-hit-tokens"])
    assert hit > 0, run.stdout
    assert second["x-cortex-match-mode"] == "exact_kv_events"
    assert second["x-cortex-assigned-worker"] == first["x-cortex-assigned-worker"]
    assert hit == body["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert body["choices"][0]["message"]["content"]
