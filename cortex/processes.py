"""``server.processes``: every core of a host — N Cortex processes on one data-plane port, one
control plane, one systemd service.

One process runs one event loop on one core. With ``server.processes = N`` > 1, ``cortex
serve`` (process 0) starts N − 1 more of itself; each is a replica as another host's would be
(``README``, "Several replicas"): its own ledger from every engine's events, its own
tokenizers, the data plane on the same port (``SO_REUSEPORT``: the kernel spreads new
connections among the processes), and replica sync over IPC (``ipc://`` ZeroMQ endpoints in a
private directory), so each counts the others' requests in flight as its own.

Rules:

* **Start.** Process 0 starts its own gateway first (so a port of 0 is resolved), then each
  other process with the command line it was started with plus flags that make it process
  ``i``: the same data port with ``reuse_port``, one process, the control plane on loopback
  port 0 (reached only by process 0), replica sync on its IPC endpoint with every other
  process's endpoint (and the configured ``replicas.peers``) as peers. It is up once it prints
  its start line (``cortex: data plane on ...``, after both planes listen). systemd hears
  READY from process 0 only, once every process is up; a process that ends before it is up
  fails the start (its own stderr says why).
* **One control plane.** Process 0's: ``/metrics`` shows every process's samples, each with a
  ``process`` label (``cortex.metrics.merge``; a process that does not answer within
  ``SCRAPE_TIMEOUT_S`` is left out and counted); ``/admin/workers`` changes are applied by
  process 0, then sent to every other process (a failure there is answered 502, naming the
  process); ``/health/ready`` is degraded while a process is not serving; ``/debug`` and the
  ledger snapshot are process 0's.
* **Kept running.** A process that ends while the service runs is logged with its exit status
  and started again after a back-off (1 s, doubling to 30 s; back to 1 s once one has served
  for a minute); one that stops answering ``/health/live`` for ``LIVE_TIMEOUT_S`` (a wedged
  loop) is killed (SIGKILL), logged, and started again the same way. Meanwhile the others
  serve: the kernel sends new connections only to listening sockets. A process started again
  has the configuration's workers; once it serves, the admin changes made since are replayed
  on it: its workers are made process 0's (added, removed, draining; ``_reconcile``).
* **Stop and reload.** The signal that starts process 0's drain is sent on to every process
  (SIGTERM: each drains its own connections); process 0 ends after they have ended, or kills
  what is left ``drain_timeout_s`` + 5 s later. SIGHUP is sent on too (each re-reads the
  configuration's workers). Each other process's stdin is a pipe only process 0 writes to:
  when process 0 dies, however, the pipe ends and the process drains and stops
  (``until_parent_gone``) — no orphan keeps serving a port nobody supervises. (Not
  ``PR_SET_PDEATHSIG``: it fires when the *thread* that started the process ends, and trio
  starts processes from its worker threads.)
* systemd's ``NOTIFY_SOCKET`` and watchdog variables are process 0's alone: the others are
  started without them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import trio

from cortex.config.tree import CortexConfig
from cortex.errors import ConfigError, CortexError
from cortex.metrics.merge import merge_expositions
from cortex.upstream.connection_pool import ConnectionPool
from cortex.workers.spec import WorkerSpec

log = logging.getLogger("cortex.processes")

START_TIMEOUT_S = 300.0  # loading tokenizers and syncing is minutes at most
SCRAPE_TIMEOUT_S = 2.0
LIVE_EVERY_S = 2.0
LIVE_TIMEOUT_S = 15.0
BACKOFF_S = (1.0, 30.0)
SERVED_LONG_ENOUGH_S = 60.0
STOP_GRACE_S = 5.0
_SYSTEMD_ONLY = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
_STARTED = re.compile(rb"^cortex: data plane on .*, control plane on (\S+):(\d+)\s*$")
# what asking a process over its control plane may raise (it may be starting, wedged or gone)
_UNANSWERED = (OSError, CortexError, trio.TooSlowError, trio.BrokenResourceError)
_SPEC_FIELDS = frozenset(field.name for field in dataclasses.fields(WorkerSpec))


@dataclass(frozen=True, slots=True)
class ProcessPlan:
    """Where the processes of one service meet: ``count`` processes, IPC endpoints in
    ``directory``."""

    count: int
    directory: str

    def endpoint(self, index: int) -> str:
        return f"ipc://{self.directory}/replica-{index}"

    def peers(self, index: int, configured: str) -> str:
        """Replica-sync peers of process ``index``: every other process, then the configured."""
        others = [self.endpoint(i) for i in range(self.count) if i != index]
        return ",".join([*others, *filter(None, [configured])])

    def first_config(self, config: CortexConfig) -> CortexConfig:
        """Process 0's configuration: the port shared, sync on its IPC endpoint (unless
        ``replicas.between_processes`` is off)."""
        server = dataclasses.replace(config.server, reuse_port=True)
        if not config.replicas.between_processes:
            return dataclasses.replace(config, server=server)
        return dataclasses.replace(
            config, server=server,
            replicas=dataclasses.replace(config.replicas, listen=self.endpoint(0),
                                         peers=self.peers(0, config.replicas.peers)))

    def command(self, argv: Sequence[str], index: int, data_port: int,
                config: CortexConfig) -> list[str]:
        """Process ``index``'s command line: ``argv`` (the ``serve`` arguments process 0 was
        given) with the flags that make it that process (later flags win)."""
        program = [sys.executable] if getattr(sys, "frozen", False) else [
            sys.executable, "-m", "cortex"]
        sync = ["--replicas-listen", self.endpoint(index),
                "--replicas-peers", self.peers(index, config.replicas.peers)
                ] if config.replicas.between_processes else []
        return [*program, *argv,
                "--server-port", str(data_port), "--server-reuse-port", "true",
                "--server-processes", "1",
                "--control-host", "127.0.0.1", "--control-port", "0", *sync,
                "--process-index", str(index)]


def started_control_port(line: bytes) -> int | None:
    """The control-plane port in a process's start line, or ``None`` if it is not that line."""
    match = _STARTED.match(line)
    return int(match.group(2)) if match else None


async def until_parent_gone() -> None:
    """In a process other than 0: once stdin (a pipe from process 0) ends, SIGTERM ourselves
    (the usual drain and stop)."""
    stream = trio.lowlevel.FdStream(os.dup(0))
    try:
        while await stream.receive_some(4096):
            pass
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await stream.aclose()
    log.warning("process 0 is gone: draining and stopping")
    os.kill(os.getpid(), signal.SIGTERM)


@dataclass(slots=True)
class _Child:
    index: int
    process: trio.Process | None = None
    control_port: int | None = None  # set while it serves
    restarts: int = 0
    silent_since: float | None = None  # first unanswered /health/live


@dataclass(frozen=True, slots=True)
class ProcessFigures:
    configured: int
    serving: int
    restarts: int
    scrape_failures: int


class ProcessGroup:
    """Process 0's side: starts, watches, stops and speaks for the other processes."""

    def __init__(self, config: CortexConfig, argv: Sequence[str]) -> None:
        self.config = config
        self.argv = list(argv)
        self.plan = ProcessPlan(config.server.processes,
                                tempfile.mkdtemp(prefix="cortex-processes-"))
        self.children = [_Child(i) for i in range(1, self.plan.count)]
        self.upstream = ConnectionPool(config.upstream.limits)
        self.token = config.control.read_admin_token()
        self.scrape_failures = 0
        self.stopping = False
        self._stop = trio.Event()
        self.ended = trio.Event()  # every other process has ended (or never started)
        self._data_port = 0
        self._control_port = 0  # process 0's

    # -- what the control plane asks ----------------------------------------------------------

    def figures(self) -> ProcessFigures:
        return ProcessFigures(self.plan.count,
                              1 + sum(c.control_port is not None for c in self.children),
                              sum(c.restarts for c in self.children), self.scrape_failures)

    def reasons(self) -> list[str]:
        """Readiness reasons: every process not serving."""
        return [f"process {c.index}: not serving" for c in self.children
                if c.control_port is None]

    async def metrics(self, own: bytes) -> bytes:
        """Every serving process's exposition merged with ``own`` (process 0's)."""
        texts: list[tuple[str, bytes] | None] = [None] * len(self.children)

        async def scrape(slot: int, child: _Child) -> None:
            try:
                status, body = await self._call(child.control_port, b"GET", "/metrics")
            except _UNANSWERED as error:
                self.scrape_failures += 1
                log.debug("process %d: /metrics not read: %s", child.index, error)
                return
            if status == 200:
                texts[slot] = (str(child.index), body)
            else:
                self.scrape_failures += 1

        async with trio.open_nursery() as nursery:
            for slot, child in enumerate(self.children):
                if child.control_port is not None:
                    nursery.start_soon(scrape, slot, child)
        return merge_expositions([("0", own), *filter(None, texts)])

    async def forward(self, method: bytes, path: str, body: bytes) -> list[str]:
        """Apply an admin change process 0 has applied on every other process; the problems."""
        problems: list[str] = []
        for child in self.children:
            if child.control_port is None:
                problems.append(f"process {child.index}: not serving")
                continue
            try:
                status, answer = await self._call(child.control_port, method, path, body)
            except _UNANSWERED as error:
                problems.append(f"process {child.index}: {error}")
                continue
            if not 200 <= status < 300:
                problems.append(f"process {child.index}: {status} "
                                f"{answer[:200].decode(errors='replace')}")
        return problems

    async def _call(self, port: int | None, method: bytes, path: str, body: bytes = b"",
                    timeout_s: float = SCRAPE_TIMEOUT_S) -> tuple[int, bytes]:
        """``method path`` on the control plane at loopback ``port``, with the admin token."""
        headers = [(b"authorization", b"Bearer " + self.token.encode())] if self.token else []
        if body:
            headers.append((b"content-type", b"application/json"))
        with trio.fail_after(timeout_s):
            async with self.upstream.request(f"http://127.0.0.1:{port}", method, path.encode(),
                                             headers, body) as response:
                return response.status, await response.read(64 << 20)

    async def _workers(self, port: int | None) -> dict[str, dict[str, object]]:
        status, body = await self._call(port, b"GET", "/admin/workers")
        if status != 200:
            raise CortexError(f"GET /admin/workers answered {status}")
        return {worker["name"]: worker for worker in json.loads(body)["workers"]}

    async def _reconcile(self, child: _Child) -> None:
        """Make the workers of ``child`` (started again: the configuration's) process 0's."""
        if not self.token:  # no admin API: nothing can have changed at run time
            return
        try:
            ours = await self._workers(self._control_port)
            theirs = await self._workers(child.control_port)
            changes: list[tuple[bytes, str, bytes]] = []
            for name, worker in theirs.items():
                spec = {k: v for k, v in worker.items() if k in _SPEC_FIELDS}
                if name not in ours or spec != {k: v for k, v in ours[name].items()
                                                if k in _SPEC_FIELDS}:
                    changes.append((b"DELETE", f"/admin/workers/{name}", b""))
            for name, worker in ours.items():
                spec = {k: v for k, v in worker.items() if k in _SPEC_FIELDS}
                if name not in theirs or any(change[1] == f"/admin/workers/{name}"
                                             for change in changes):
                    changes.append((b"POST", "/admin/workers", json.dumps(spec).encode()))
                if worker["draining"]:
                    changes.append((b"POST", f"/admin/workers/{name}/drain", b""))
            for method, path, body in changes:
                status, answer = await self._call(child.control_port, method, path, body)
                if not 200 <= status < 300:
                    raise CortexError(f"{method.decode()} {path} answered {status}: "
                                      f"{answer[:200].decode(errors='replace')}")
        except _UNANSWERED as error:
            log.error("processes: process %d started again, but its workers could not be made "
                      "process 0's: %s", child.index, error)
            return
        if changes:
            log.info("processes: process %d started again: %d admin change(s) made since the "
                     "start replayed on it", child.index, len(changes))

    # -- running ------------------------------------------------------------------------------

    async def run(self, data_port: int, control_port: int, *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start every other process (process 0's planes on these ports); ``started`` once all
        serve; keep them running until ``stop``; return once they have ended."""
        self._data_port, self._control_port = data_port, control_port
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.upstream.run)
                async with trio.open_nursery() as starting:  # side by side: each loads its own
                    for child in self.children:
                        starting.start_soon(partial(nursery.start, self._first_start, child))
                log.info("processes: %d serving on port %d (process 0 and %s)", self.plan.count,
                         data_port, ", ".join(str(c.pid) for c in self._processes()))
                task_status.started()
                for child in self.children:
                    nursery.start_soon(self._keep, child)
                nursery.start_soon(self._watch_liveness)
                await self._until_all_ended()
                nursery.cancel_scope.cancel()
        finally:
            for child in self.children:  # cancelled before they ended: nothing outlives us
                if child.process is not None and child.process.returncode is None:
                    child.process.kill()
            self.ended.set()

    def _processes(self) -> list[trio.Process]:
        return [c.process for c in self.children if c.process is not None]

    async def _first_start(self, child: _Child, *,
                           task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        process = await self._spawn(child)
        with trio.move_on_after(START_TIMEOUT_S):
            port = await self._read_start_line(process)
            if port is not None:  # its stdout is read on by ``_keep``
                child.control_port = port
                task_status.started()
                return
        process.kill()
        code = await process.wait()
        problem = f"server.processes: process {child.index} did not start ({_status(code)})"
        raise ConfigError([problem])

    async def _spawn(self, child: _Child) -> trio.Process:
        env = {k: v for k, v in os.environ.items() if k not in _SYSTEMD_ONLY}
        argv = self.plan.command(self.argv, child.index, self._data_port, self.config)
        child.process = await trio.lowlevel.open_process(argv, stdin=subprocess.PIPE,
                                                         stdout=subprocess.PIPE, env=env)
        child.control_port = None
        child.silent_since = None
        return child.process

    @staticmethod
    async def _read_start_line(process: trio.Process) -> int | None:
        """The control port from the start line, after copying earlier lines to our stdout;
        ``None`` if the process closed its stdout first."""
        assert process.stdout is not None
        buffer = b""
        while True:
            chunk = await process.stdout.receive_some(4096)
            if not chunk:
                return None
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                port = started_control_port(line)
                if port is not None:
                    return port
                sys.stdout.buffer.write(line + b"\n")
                sys.stdout.flush()

    @staticmethod
    async def _forward_stdout(process: trio.Process) -> None:
        assert process.stdout is not None
        async for chunk in process.stdout:
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()

    async def _keep(self, child: _Child) -> None:
        """Start ``child`` again whenever it ends while the service runs."""
        delay = BACKOFF_S[0]
        while True:
            assert child.process is not None
            began = trio.current_time()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._forward_or_start_line, child)
                code = await child.process.wait()
                nursery.cancel_scope.cancel()
            child.control_port = None
            if self.stopping:
                return
            if trio.current_time() - began >= SERVED_LONG_ENOUGH_S:
                delay = BACKOFF_S[0]
            log.error("processes: process %d (pid %d) ended (%s) while serving: starting it "
                      "again in %.0f s", child.index, child.process.pid, _status(code), delay)
            await trio.sleep(delay)
            delay = min(delay * 2, BACKOFF_S[1])
            if self.stopping:
                return
            child.restarts += 1
            await self._spawn(child)

    async def _forward_or_start_line(self, child: _Child) -> None:
        process = child.process
        assert process is not None
        if child.control_port is None:  # a start again: serving once it says so
            port = await self._read_start_line(process)
            if port is None:
                return
            child.control_port = port
            log.info("processes: process %d (pid %d) serving again", child.index, process.pid)
            await self._reconcile(child)
        await self._forward_stdout(process)

    async def _watch_liveness(self) -> None:
        while not self.stopping:
            await trio.sleep(LIVE_EVERY_S)
            async with trio.open_nursery() as nursery:
                for child in self.children:
                    if child.control_port is not None:
                        nursery.start_soon(self._check_live, child)

    async def _check_live(self, child: _Child) -> None:
        try:
            status, _ = await self._call(child.control_port, b"GET", "/health/live",
                                         timeout_s=LIVE_EVERY_S)
            if status == 200:
                child.silent_since = None
                return
        except _UNANSWERED:
            pass
        now = trio.current_time()
        if child.silent_since is None:
            child.silent_since = now
        elif (now - child.silent_since >= LIVE_TIMEOUT_S and child.process is not None
              and child.process.returncode is None and not self.stopping):
            log.error("processes: process %d (pid %d) has not answered /health/live for %.0f "
                      "s: killing it (it will be started again)", child.index,
                      child.process.pid, now - child.silent_since)
            child.process.kill()

    def close(self) -> None:
        """Remove the IPC directory (after ``run``, or when it never ran)."""
        shutil.rmtree(self.plan.directory, ignore_errors=True)

    # -- stopping -----------------------------------------------------------------------------

    def signal_all(self, signum: int) -> None:
        """Send ``signum`` on to every running process (SIGTERM: ``stop``)."""
        for process in self._processes():
            if process.returncode is None:
                process.send_signal(signum)

    def stop(self) -> None:
        """The service is stopping: every other process drains; none is started again."""
        if not self.stopping:
            self.stopping = True
            self._stop.set()
            self.signal_all(signal.SIGTERM)

    async def _until_all_ended(self) -> None:
        """Return once ``stop`` was called and every process ended (killed after the drain
        timeout and a grace)."""
        await self._stop.wait()
        with trio.move_on_after(self.config.server.limits.drain_timeout_s + STOP_GRACE_S):
            for process in self._processes():
                await process.wait()
            return
        for process in self._processes():
            if process.returncode is None:
                log.warning("processes: pid %d still running after the drain: killed",
                            process.pid)
                process.kill()
                await process.wait()


def _status(code: int) -> str:
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
