"""What the real-engine tests do with any engine server (vLLM's, SGLang's): start it as a
process group, wait for its ready line and health endpoint, kill or stop it, talk plain HTTP.

``EngineProcess`` is the behaviour and the process's state (ports, process, starts, events);
each engine's server class (``vllm_server.VllmServer``, ``sglang_server.SglangServer``) adds
``name``, its options and ``log_dir`` and says its command line, environment, ready line and
health path.

Readiness is the server's own ready line (a reader thread copies the output to a log file and
sets an event on that line), then its health endpoint answering 200. Servers bind their socket
before they listen, so a connection refused in that instant — or a health check too slow to
answer on a loaded machine — is asked again (``LISTEN_GRACE_S`` at most): the one bounded wait.
``kill()`` is a ``kill -9`` of the whole process group, as when a container dies.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

START_TIMEOUT_S = 240.0
LISTEN_GRACE_S = 30.0  # bound -> answering health (a loaded CI machine took > 10 s once)


ROOT = Path(__file__).resolve().parents[2]
FAMILIES = ("deepseek-tiny", "qwen-tiny")  # the tiny models `make engines` builds


@dataclass(frozen=True)
class EngineEnv:
    python: Path
    models: Path

    def model(self, name: str) -> Path:
        return self.models / name


def engines_dir() -> Path:
    return Path(os.environ.get("CORTEX_ENGINES_DIR") or ROOT / ".engines")


def engine_env(engine: str = "vllm") -> tuple[EngineEnv | None, str]:
    """The environment ``make engines`` built for ``engine`` ("vllm" | "sglang") and the tiny
    models, or ``None`` and why it is not usable."""
    base = engines_dir()
    python = base / engine / "bin" / "python"
    models = base / "models"
    if not (base / engine / ".installed").is_file() or not python.is_file():
        return None, f"no {engine} environment in {base}: run `make engines`"
    missing = [name for name in FAMILIES if not (models / name / ".complete").is_file()]
    if missing:
        return None, f"tiny models {missing} not built in {models}: run `make engines`"
    return EngineEnv(python, models), ""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def metric_sum(text: str, name: str) -> float:
    """Sum of a Prometheus sample family (``name``, any labels) in exposition ``text``."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            total += float(line.rsplit(" ", 1)[1])
    return total


@dataclass(kw_only=True)
class EngineProcess:
    """Start, wait, stop and talk to one engine server (see the module docstring). Its
    subclasses add ``name`` and ``log_dir`` (and their options) as positional fields."""

    ready_line: ClassVar[str]
    engine: ClassVar[str]  # the WorkerSpec's engine: "vllm" | "sglang"
    health_path: ClassVar[str] = "/health"
    http_port: int = field(default_factory=free_port)
    events_port: int = field(default_factory=free_port)
    replay_port: int = field(default_factory=free_port)
    process: subprocess.Popen[str] | None = None
    starts: int = 0
    _ready: threading.Event = field(default_factory=threading.Event)
    _exited: threading.Event = field(default_factory=threading.Event)
    if TYPE_CHECKING:
        name: str
        log_dir: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def events(self) -> str:
        return f"tcp://127.0.0.1:{self.events_port}"

    @property
    def replay(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}.{self.starts}.log"

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        """Variables added to this process's environment for the server."""
        raise NotImplementedError

    def start(self) -> None:
        """Start the server (returns at once; ``wait_ready`` waits for it)."""
        self.starts += 1
        self._ready = threading.Event()
        self._exited = threading.Event()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.environment()}
        self.process = subprocess.Popen(
            self.command(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=env, start_new_session=True, cwd=self.log_dir)
        threading.Thread(target=self._copy_output, args=(self.process, self.log_path),
                         daemon=True, name=f"{self.name}-log").start()

    def _copy_output(self, process: subprocess.Popen[str], path: Path) -> None:
        ready, exited = self._ready, self._exited
        assert process.stdout is not None
        with open(path, "w") as log, process.stdout:
            for line in process.stdout:
                log.write(line)
                log.flush()
                if self.ready_line in line:
                    ready.set()
        exited.set()
        ready.set()  # wake a waiter: ``wait_ready`` then sees the exit

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        if not self._ready.wait(timeout_s):
            raise RuntimeError(f"{self.name} not ready after {timeout_s:.0f} s: {self.tail()}")
        if self._exited.is_set():
            raise RuntimeError(f"{self.name} exited while starting: {self.tail()}")
        give_up = time.monotonic() + LISTEN_GRACE_S
        while True:
            try:
                status, _ = self.get(self.health_path)
                break
            except (urllib.error.URLError, TimeoutError) as error:  # bound, not yet
                # listening; or listening but too slow to answer on a loaded machine (CI once)
                if time.monotonic() > give_up or self._exited.is_set():
                    raise RuntimeError(f"{self.name}: {self.health_path}: {error}") from None
                self._exited.wait(0.1)
        if status != 200:
            raise RuntimeError(f"{self.name}: {self.health_path} answered {status}")

    def lost_a_port(self) -> bool:
        """Whether the last start failed because one of its ports was taken meanwhile."""
        try:
            return "Address already in use" in self.log_path.read_text()
        except OSError:
            return False

    def new_ports(self) -> None:
        self.http_port, self.events_port, self.replay_port = free_port(), free_port(), free_port()

    def tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        """``kill -9`` of the whole process group (API server, engine core)."""
        process = self.process
        if process is None:
            return
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
        self._exited.wait(10)
        self.process = None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period."""
        process = self.process
        if process is None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        self.kill()

    # --------------------------------------------------------------- plain HTTP (tests' side)

    def get(self, path: str, timeout_s: float = 10.0) -> tuple[int, bytes]:
        return http_request("GET", self.url + path, None, timeout_s)

    def post(self, path: str, body: dict, timeout_s: float = 60.0) -> tuple[int, dict]:
        status, raw = http_request("POST", self.url + path, json.dumps(body).encode(), timeout_s)
        return status, (json.loads(raw) if raw else {})

    def metric(self, name: str) -> float:
        """Sum of a ``/metrics`` sample family (any labels)."""
        return metric_sum(self.get("/metrics")[1].decode(), name)


def http_request(method: str, url: str, data: bytes | None, timeout_s: float) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def start_all(servers: list[EngineProcess], timeout_s: float = START_TIMEOUT_S) -> None:
    """Start servers side by side and wait for every one (stopping all if one fails). A port
    ``free_port`` handed out can be taken by someone else before the server binds it: a server
    that died of that starts once more on fresh ports."""
    started = time.monotonic()
    for server in servers:
        server.start()
    try:
        for server in servers:
            try:
                server.wait_ready(max(timeout_s - (time.monotonic() - started), 1.0))
            except RuntimeError:
                if not server.lost_a_port():
                    raise
                server.kill()
                server.new_ports()
                server.start()
                server.wait_ready(max(timeout_s - (time.monotonic() - started), 1.0))
    except BaseException:
        for server in servers:
            server.kill()
        raise
