"""Starting and stopping the systems the gateway benchmark measures, each its own process(es).

* ``start_mock(model)``: one ``python -m perf.mock_worker`` (it prints its port once it listens;
  ``kv_events=True``: and its empty KV-event publisher's endpoints).
* ``start_cortex(mocks, model, tokenizer, template)``: ``python -m cortex serve`` in front
  of the workers (subscribed to their KV events when they have endpoints); ready when its
  control plane's ``GET /health/ready`` answers 200, its ``/metrics`` say the model's text is
  encoded by fastokens (the start check is done) and one chat completion goes through.
  ``passthrough=True`` serves the model as ``passthrough`` (no
  template, tokenizer, ledger or KV decision: Cortex's HTTP legs, the body's parse and a
  round-robin pick — the floor under the KV-aware request path).
* ``start_sglang_router(urls)``: ``python -m sglang_router.launch_router --policy
  cache_aware``; ready when one chat completion goes through (it registers workers in the
  background after it listens: it probes ``/health``, ``/server_info``, ``/model_info`` and
  tries HTTP/2 prior knowledge, which the mock refuses). Its Prometheus exporter gets a free
  port too (the default one is fixed: a second router on the machine would fail to start).
* ``start_nginx(urls)``: ``nginx -p DIR -c DIR/nginx.conf -g 'daemon off;'`` with a generated
  round-robin config (upstream keep-alive, HTTP/1.1 to the upstream, ``proxy_buffering off``
  for SSE, ``tcp_nodelay``), one worker process; ready when one chat completion goes through.

Readiness is polled with a deadline (a benchmark, not a test: there is no ``task_status`` across
processes). ``missing_peers()`` says which peer programs are not installed, so callers skip them
with the reason. Every ``Running`` owns its process group and temp dir; ``stop()`` terminates
(then kills) exactly that group and removes the dir. ``pids()`` lists the processes whose CPU
and memory count as the system's (nginx: the master and its workers).
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parent.parent  # children run from here: ``-m perf.x`` finds it
NGINX = "/usr/sbin/nginx"
READY_TIMEOUT_S = 90.0


@dataclass
class Running:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    tmpdir: str | None = None
    log_path: str | None = None
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def pids(self) -> list[int]:
        """The system's processes: the started one and its direct children (nginx workers)."""
        pid = self.process.pid
        return [pid, *_children(pid)]

    def log_tail(self, chars: int = 2000) -> str:
        if self.log_path is None:
            return ""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - chars))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=15)
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)


class StartError(RuntimeError):
    """A system did not become ready; the message carries the tail of its log."""


# Cortex systems of ``server.processes = 2`` (two processes on one port): with replica sync
# between them (the default) and without (what sync costs and buys)
PROCESS_FLAGS = {
    "cortex-2proc": ("--server-processes", "2"),
    "cortex-2proc-nosync": ("--server-processes", "2", "--replicas-between-processes", "false"),
}


def missing_peers() -> dict[str, str]:
    """Peer name -> why it cannot run here (absent when it can)."""
    missing: dict[str, str] = {}
    if importlib.util.find_spec("sglang_router") is None:
        missing["sglang-router"] = ("sglang_router is not installed (pip install "
                                    "'cortex-gateway[perf]')")
    if not os.access(NGINX, os.X_OK):
        missing["nginx"] = f"{NGINX} is not installed (apt-get install nginx-light)"
    return missing


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def _children(pid: int) -> list[int]:
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(child) for child in f.read().split()]
    except OSError:
        pass
    return found


def spawn(name: str, argv: list[str], tmpdir: str, env: dict[str, str] | None = None,
          stdout: int | None = None, stdin: int | None = None, cwd: Path = REPO,
          cpus: str = "") -> tuple[subprocess.Popen[bytes], str]:
    """Start ``argv`` in a process group of its own (``Running.stop`` ends the group), its
    stderr (and stdout unless given) in ``tmpdir/<name>.log``; ``cpus``: a ``taskset -c`` list
    the process and what it starts are pinned to. The one way perf/ starts a process."""
    if cpus:
        argv = ["taskset", "-c", cpus, *argv]
    log_path = os.path.join(tmpdir, f"{name}.log")
    log = open(log_path, "wb")  # noqa: SIM115 (the child owns it)
    try:
        process = subprocess.Popen(argv, stdout=stdout if stdout is not None else log,
                                   stderr=log, stdin=stdin if stdin is not None
                                   else subprocess.DEVNULL, cwd=cwd,
                                   env=env, start_new_session=True)
    finally:
        log.close()
    return process, log_path


def _post_ok(port: int, model: str) -> bool:
    body = json.dumps({"model": model, "max_tokens": 4,
                       "messages": [{"role": "user", "content": "ready?"}]})
    try:
        conn = http.client.HTTPConnection(HOST, port, timeout=5)
        conn.request("POST", "/v1/chat/completions", body,
                     {"content-type": "application/json"})
        response = conn.getresponse()
        response.read()
        conn.close()
        return response.status == 200
    except OSError:
        return False


def _get_ok(port: int, path: str) -> bool:
    try:
        conn = http.client.HTTPConnection(HOST, port, timeout=5)
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        conn.close()
        return response.status == 200
    except OSError:
        return False


def _metrics(port: int) -> str | None:
    """Cortex's ``/metrics`` text, or ``None`` if it does not answer (yet)."""
    try:
        conn = http.client.HTTPConnection(HOST, port, timeout=5)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
    except OSError:
        return None
    return text


def _on_fastokens(port: int, model: str) -> bool:
    """Whether Cortex's ``/metrics`` says ``model``'s new text is encoded by fastokens (its
    start check runs in the background after the start: until then ``tokenizers``)."""
    text = _metrics(port)
    if text is None:
        return False
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("cortex_tokenizer_backend{") and f'model="{model}"' in line
              and 'backend="fastokens"' in line]  # one per process (server.processes)
    return bool(values) and all(value == 1 for value in values)


def _all_processes_serving(port: int) -> bool:
    """Whether every process of ``server.processes`` serves (``/metrics`` of process 0)."""
    text = _metrics(port)
    if text is None:
        return False
    figures = {line.split("{", 1)[0]: float(line.rsplit(" ", 1)[1])
               for line in text.splitlines()
               if line.startswith(("cortex_processes{", "cortex_processes_serving{"))}
    return bool(figures) and figures["cortex_processes"] == figures.get(
        "cortex_processes_serving")


def _wait(running: Running, ready, what: str, timeout_s: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while not ready():
        if running.process.poll() is not None:
            tail = running.log_tail()
            running.stop()
            raise StartError(f"{running.name} exited ({running.process.returncode}) before "
                             f"{what}:\n{tail}")
        if time.monotonic() > deadline:
            tail = running.log_tail()
            running.stop()
            raise StartError(f"{running.name}: no {what} after {timeout_s} s:\n{tail}")
        time.sleep(delay)  # polling another process's readiness (no task_status across processes)
        delay = min(delay * 2, 0.5)


def start_mock(model: str, name: str = "mock", kv_events: bool = False) -> Running:
    """``python -m perf.mock_worker``; with ``kv_events`` its (empty) KV-event endpoints are in
    ``extra["events"]`` and ``extra["replay"]``."""
    tmpdir = tempfile.mkdtemp(prefix=f"bench-{name}-")
    argv = [sys.executable, "-m", "perf.mock_worker", "--model", model]  # cwd: REPO
    if kv_events:
        argv.append("--kv-events")
    process, log_path = spawn(name, argv, tmpdir, stdout=subprocess.PIPE)
    assert process.stdout is not None
    line = process.stdout.readline().decode().split()  # its port, once it listens
    port = int(line[0]) if line else 0
    extra: dict[str, object] = {"events": line[1], "replay": line[2]} if len(line) == 3 else {}
    running = Running(name, port, process, tmpdir, log_path, extra)
    if not running.port:
        running.stop()
        raise StartError(f"{name} printed no port:\n{running.log_tail()}")
    return running


def start_cortex(workers: list[Running], model: str, tokenizer: str,
                 template: str, name: str = "cortex", repo: Path = REPO,
                 python: str = sys.executable, passthrough: bool = False,
                 flags: Sequence[str] = (), cpus: str | None = None,
                 wrapper: Sequence[str] = (),
                 ready_timeout_s: float = READY_TIMEOUT_S) -> Running:
    """``python -m cortex serve`` in front of ``workers`` (mocks; their KV-event endpoints, if
    they have them, unless ``passthrough``) run from ``repo`` (its working directory comes
    first on ``sys.path``, so another checkout — with its extensions built — runs its own
    code) by the interpreter ``python`` (another one compares interpreters on the same
    code), with more configuration ``flags``; ``cpus`` (``taskset -c`` list) pins it and
    every process it starts to those CPUs; ``wrapper``: a command it runs under (valgrind),
    given ``ready_timeout_s`` for each step of its start."""
    tmpdir = tempfile.mkdtemp(prefix=f"bench-{name}-")
    port, control = free_port(), free_port()
    served = (f"{model},passthrough=true" if passthrough
              else f"{model},tokenizer={tokenizer},block_size=16,chat_template={template}")
    argv = [*wrapper, python, "-m", "cortex", "serve", "--server-host", HOST,
            "--server-port", str(port), "--control-port", str(control),
            "--log-level", "warning", "--model", served, *flags]
    for index, worker in enumerate(workers):
        spec = f"{worker.url},name=w{index},engine=sglang,model={model}"
        if "events" in worker.extra and not passthrough:
            spec += f",events={worker.extra['events']},replay={worker.extra['replay']}"
        argv += ["--worker", spec]
    env = {key: value for key, value in os.environ.items() if not key.startswith("CORTEX_")}
    # the A/B mechanism, kept on purpose: the child's working directory comes first on its
    # sys.path, so ``-m cortex`` there runs that checkout's cortex
    process, log_path = spawn(name, argv, tmpdir, env=env, cwd=repo, cpus=cpus or "")
    running = Running(name, port, process, tmpdir, log_path, {"control_port": control})
    waited = ready_timeout_s
    _wait(running, lambda: _get_ok(control, "/health/ready"), "GET /health/ready 200", waited)
    if "--server-processes" in flags:
        _wait(running, lambda: _all_processes_serving(control), "every process serving",
              waited)
    if not passthrough and any((repo / "cortex" / package / "exact_bpe.py").exists()
                               for package in ("tokenize", "profile")):  # (moved, issue 38)
        _wait(running, lambda: _on_fastokens(control, model), "fastokens after its start check",
              waited)
    _wait(running, lambda: _post_ok(port, model), "a chat completion", waited)
    return running


def start_sglang_router(worker_urls: list[str], model: str) -> Running:
    tmpdir = tempfile.mkdtemp(prefix="bench-sglang-router-")
    port = free_port()
    argv = [sys.executable, "-m", "sglang_router.launch_router", "--host", HOST,
            "--port", str(port), "--policy", "cache_aware", "--log-level", "warn",
            "--prometheus-host", HOST, "--prometheus-port", str(free_port()),
            "--worker-urls", *worker_urls]
    process, log_path = spawn("sglang-router", argv, tmpdir)
    running = Running("sglang-router", port, process, tmpdir, log_path)
    _wait(running, lambda: _post_ok(port, model), "a chat completion")
    return running


NGINX_CONF = """\
worker_processes 1;
error_log {dir}/error.log warn;
pid {dir}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    client_max_body_size 16m;
    client_body_buffer_size 1m;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    tcp_nodelay on;
    upstream workers {{
{servers}
        keepalive 256;
        keepalive_requests 1000000;
    }}
    server {{
        listen {host}:{port} backlog=4096;
        location / {{
            proxy_pass http://workers;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_cache off;
        }}
    }}
}}
"""


def nginx_conf(directory: str, port: int, worker_urls: list[str]) -> str:
    servers = "\n".join(f"        server {url.split('://', 1)[1]};" for url in worker_urls)
    return NGINX_CONF.format(dir=directory, host=HOST, port=port, servers=servers)


def start_nginx(worker_urls: list[str], model: str) -> Running:
    tmpdir = tempfile.mkdtemp(prefix="bench-nginx-")
    os.chmod(tmpdir, 0o755)  # workers may run as another user (nobody) when we are root
    port = free_port()
    conf = os.path.join(tmpdir, "nginx.conf")
    with open(conf, "w") as f:
        f.write(nginx_conf(tmpdir, port, worker_urls))
    argv = [NGINX, "-e", os.path.join(tmpdir, "error.log"), "-p", tmpdir, "-c", conf,
            "-g", "daemon off;"]
    process, log_path = spawn("nginx", argv, tmpdir)
    running = Running("nginx", port, process, tmpdir, log_path)
    _wait(running, lambda: _post_ok(port, model), "a chat completion")
    return running
