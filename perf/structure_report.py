"""Structure figures of a Cortex checkout, to compare a tree before and after a refactor.

Run ``.venv/bin/python -m perf.structure_report [--repo PATH] [--json]``: a markdown report
(or the same figures as JSON) of the checkout at ``--repo`` (default: the one this script sits
in). It never imports that checkout's ``cortex`` into this process: part a runs it through its
command line, parts b-d read its files.

a. Request walk. What one OpenAI chat request crosses inside Cortex before a worker is chosen.
   ``cortex sim`` starts two simulated SGLang engines (port 0, the serve line it prints gives
   the engines' endpoints) and ``cortex serve`` runs in front of them (port 0, one process),
   both through the checkout's command line (``python -m cortex``, with the checkout's
   ``.venv/bin/python`` when it has one, the checkout first on ``PYTHONPATH`` and no
   ``CORTEX_*`` variables), waited for by their printed start lines and ``/health/ready``.
   ``cortex serve`` runs under a small bootstrap: this script in ``--trace-child`` mode,
   which runs ``cortex`` as ``python -m cortex`` would (``runpy``). Two identical requests
   (``POST /v1/chat/completions``, a system and a user message, not streamed) warm the
   gateway; then SIGUSR1 arms the bootstrap, which installs ``sys.setprofile`` on the main
   thread (the trio thread), and the third request is traced:

   * trigger: the first call, from a frame in a file under ``--front`` (default
     ``cortex/front``), of a coroutine function (``async def``) in a cortex file outside
     ``--front`` and ``cortex/_fast``: the front layer awaiting the request handler.
   * recorded: 'call' and 'return' events of frames in files under the checkout's ``cortex/``
     whose caller chain (``f_back``) reaches the trigger frame: the request's own await chain,
     not the gateway's background tasks (which share the thread), nor child tasks or worker
     threads the request starts.
   * stop: the first call of a function named ``--choice-names`` (default decide, choose,
     pick) in a file under ``--choice`` (default ``cortex/scheduling``): the worker choice.
     It is not part of the walk's figures.

   A coroutine or generator suspending (a 'return' event of a frame that is called again
   later) and resuming (a 'call' event of a frame already seen) is neither a call nor a
   return of control. Figures:

   * files crossed: distinct cortex files of the calls made, in order of first visit;
   * returns to the hub: how often the innermost cortex frame's file becomes ``--hub``
     (default ``cortex/gateway/proxy.py``; the trigger's file when that file does not exist)
     from a different file, on calls and on returns;
   * cortex function calls: calls of functions defined in cortex files, comprehensions and
     generator expressions left out (frames of their own in CPython 3.11, not in 3.12).

b. Package cycles. Every ``cortex/**/*.py`` is parsed with ``ast`` (nothing is imported). A
   node is a package below ``cortex`` (``cortex.gateway``; nested packages such as
   ``cortex.sim.batching`` fold into their top one), a top-level module (``cortex.app``) or
   ``cortex`` itself (its ``__init__``). Every import counts: module level, under
   ``if TYPE_CHECKING:`` and inside functions; ``from cortex.x import y`` is an edge to
   ``cortex.x``, relative imports are resolved, imports within one node are not edges. The
   strongly connected components of more than one node are the cycles; each edge inside one
   is shown with one import that makes it (a module-level one when there is one).

c. Largest constructors. The 10 classes (and those tied with the 10th) under ``cortex/``
   (``.py`` files) whose construction takes the most parameters: an explicit ``__init__``'s
   named parameters but ``self``; a dataclass's fields (those of dataclass bases found under
   ``cortex/`` included) but ``ClassVar``s, ``KW_ONLY`` and ``field(init=False)``; a
   ``NamedTuple``'s fields (``msgspec.Struct`` classes are not counted). Then the 10
   functions and methods (and those tied with the 10th) with the most positional-or-keyword
   parameters (the first parameter of a method, ``self`` or ``cls``, not counted; of a
   ``staticmethod``, counted).

d. Harness lines. Over the files git tracks in ``tests/`` and ``perf/`` (this script left
   out, so that the figure does not move when it is added): lines (newlines, as ``wc -l``)
   of every file that is neither a test module (``test_*.py``) nor markdown, and the total
   lines of each directory. Then real-time sleeps in ``tests/``: calls ``trio.sleep(...)``,
   ``time.sleep(...)``, ``asyncio.sleep(...)`` whose argument is not the literal 0; the
   ``perf/`` files that call ``sys.path.insert`` or ``sys.path.append``; and the files in
   ``tests/``, ``perf/`` and ``cortex/`` that define a function whose name contains
   ``percentile``, ``pct`` or ``quantile`` (test functions, ``test_*``, left out).

Exit status: 0; 1 when the request walk failed (the other parts are still printed, the walk's
section says why); 2 when ``--repo`` has no ``cortex/``. ``--no-walk`` skips part a.
"""

from __future__ import annotations

import argparse
import ast
import http.client
import inspect
import json
import os
import queue
import re
import runpy
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

SCRIPT = Path(__file__).resolve()
SCRIPT_IN_REPO = "perf/structure_report.py"
DEFAULT_HUB = "cortex/gateway/proxy.py"
DEFAULT_FRONT = "cortex/front"
DEFAULT_CHOICE = "cortex/scheduling"
DEFAULT_CHOICE_NAMES = "decide,choose,pick"
TOP_COUNT = 10

CHAT_BODY = {
    "max_tokens": 4,
    "messages": [
        {"role": "system", "content": "You are a concise assistant for the engineers who run "
                                      "language models on GPU clusters. Answer in one short "
                                      "sentence."},
        {"role": "user", "content": "What does a KV cache keep between two requests?"},
    ],
}
WARM_REQUESTS = 2


# ---------------------------------------------------------------------------------------------
# a. Request walk: the traced gateway (child side)
# ---------------------------------------------------------------------------------------------

class RequestWalkTracer:
    """The profile hook of the ``--trace-child`` bootstrap; see the module docstring, part a."""

    def __init__(self, repo: Path, front: str, choice: str, choice_names: set[str],
                 out_path: Path) -> None:
        self.repo_prefix = str(repo) + os.sep
        self.cortex_prefix = str(repo / "cortex") + os.sep
        self.front_prefix = str(repo / front) + os.sep
        self.fast_prefix = str(repo / "cortex" / "_fast") + os.sep
        self.choice_prefix = str(repo / choice) + os.sep
        self.choice_names = choice_names
        self.out_path = out_path
        self.trigger_frame: FrameType | None = None
        # frame id -> (index, frame); the frame is kept so that its id is not reused
        self.frames: dict[int, tuple[int, FrameType]] = {}
        self.events: list[dict] = []

    def arm(self, _signum: int, _frame: object) -> None:
        sys.setprofile(self.on_event)
        Path(str(self.out_path) + ".armed").touch()

    def on_event(self, frame: FrameType, event: str, _arg: object) -> None:
        if event != "call" and event != "return":
            return
        if not frame.f_code.co_filename.startswith(self.cortex_prefix):
            return
        try:
            if self.trigger_frame is None:
                if event == "call" and self.is_handoff(frame):
                    self.trigger_frame = frame
                    self.record(frame, event)
                return
            if self.in_request(frame):
                fresh_call = event == "call" and id(frame) not in self.frames
                self.record(frame, event)
                if fresh_call and self.is_choice(frame):
                    self.finish(None)
        except Exception as error:  # noqa: BLE001 (written to the trace) the hook must not
            # break the gateway it watches
            self.finish(error)

    def is_handoff(self, frame: FrameType) -> bool:
        filename = frame.f_code.co_filename
        caller = frame.f_back
        return (not filename.startswith(self.front_prefix)
                and not filename.startswith(self.fast_prefix)
                and bool(frame.f_code.co_flags & inspect.CO_COROUTINE)
                and caller is not None
                and caller.f_code.co_filename.startswith(self.front_prefix))

    def is_choice(self, frame: FrameType) -> bool:
        return (frame.f_code.co_filename.startswith(self.choice_prefix)
                and frame.f_code.co_name in self.choice_names)

    def in_request(self, frame: FrameType) -> bool:
        while frame is not None:
            if frame is self.trigger_frame:
                return True
            frame = frame.f_back
        return False

    def record(self, frame: FrameType, event: str) -> None:
        key = id(frame)
        if key not in self.frames:
            self.frames[key] = (len(self.frames), frame)
        # after a call the callee is the innermost cortex frame; after a return, its caller's
        innermost = frame if event == "call" else frame.f_back
        while innermost is not None and not innermost.f_code.co_filename.startswith(
                self.cortex_prefix):
            innermost = innermost.f_back
        code = frame.f_code
        self.events.append({
            "event": event,
            "frame": self.frames[key][0],
            "file": self.relative(code.co_filename),
            "function": code.co_qualname,
            "line": code.co_firstlineno,
            "innermost": None if innermost is None else self.relative(
                innermost.f_code.co_filename),
        })

    def relative(self, filename: str) -> str:
        return filename.removeprefix(self.repo_prefix)

    def finish(self, error: Exception | None) -> None:
        sys.setprofile(None)
        cortex_module = sys.modules.get("cortex")
        result = {
            "cortex_file": getattr(cortex_module, "__file__", None),
            "error": None if error is None else repr(error),
            "events": self.events,
        }
        partial = Path(str(self.out_path) + ".partial")
        partial.write_text(json.dumps(result))
        partial.replace(self.out_path)
        self.frames.clear()


def run_trace_child(args: argparse.Namespace) -> int:
    """``--trace-child OUT -- CORTEX_ARGS``: runs ``cortex CORTEX_ARGS`` as ``python -m cortex``
    would, with the request-walk tracer armed by SIGUSR1."""
    tracer = RequestWalkTracer(
        repo=Path.cwd().resolve(), front=args.front, choice=args.choice,
        choice_names=set(args.choice_names.split(",")), out_path=Path(args.trace_child))
    signal.signal(signal.SIGUSR1, tracer.arm)
    sys.argv = ["cortex", *args.cortex_args]
    try:
        runpy.run_module("cortex", run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 1
    return 0


# ---------------------------------------------------------------------------------------------
# a. Request walk: the parent side
# ---------------------------------------------------------------------------------------------

class WalkError(RuntimeError):
    pass


class LineReader:
    """A process's output (stdout and stderr together), one line at a time, with a deadline:
    a thread reads it, copying each line to a log file."""

    def __init__(self, process: subprocess.Popen, log_path: Path) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.log_path = log_path
        self.thread = threading.Thread(target=self._read, args=(process.stdout,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:
        with self.log_path.open("w") as log:
            for line in stream:
                log.write(line)
                log.flush()
                self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def until(self, accept, deadline: float, what: str) -> str:
        """The first line that ``accept`` takes."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WalkError(f"timed out waiting for {what}")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise WalkError(f"the process ended before {what}")
            if accept(line):
                return line


@dataclass
class Started:
    process: subprocess.Popen
    reader: LineReader


def start_process(argv: list[str], repo: Path, env: dict[str, str], log_path: Path) -> Started:
    process = subprocess.Popen(argv, cwd=repo, env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return Started(process, LineReader(process, log_path))


def stop_process(started: Started | None) -> None:
    if started is None or started.process.poll() is not None:
        return
    started.process.send_signal(signal.SIGTERM)
    try:
        started.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        started.process.kill()
        started.process.wait()


def http_request(port: int, method: str, path: str, body: dict | None = None,
                 timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        payload = None if body is None else json.dumps(body).encode()
        headers = {} if body is None else {"content-type": "application/json"}
        connection.request(method, path, body=payload, headers=headers)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, \
            response.read()
    finally:
        connection.close()


def wait_ready(port: int, deadline: float) -> None:
    """Polls ``/health/ready`` until it says ready and not degraded."""
    while time.monotonic() < deadline:
        try:
            status, _, body = http_request(port, "GET", "/health/ready", timeout=2.0)
            state = json.loads(body) if status == 200 else {}
            if state.get("status") == "ready" and not state.get("degraded"):
                return
        except (OSError, http.client.HTTPException, ValueError):
            pass
        time.sleep(0.1)  # a polling interval, not a wait for something to have happened
    raise WalkError("the gateway did not report ready in time")


def wait_for_file(path: Path, deadline: float, what: str) -> None:
    while not path.exists():
        if time.monotonic() >= deadline:
            raise WalkError(f"timed out waiting for {what}")
        time.sleep(0.02)


def child_env(repo: Path) -> dict[str, str]:
    """This environment without Cortex's own settings, with the checkout first on the path."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("CORTEX_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def repo_python(repo: Path) -> str:
    venv_python = repo / ".venv" / "bin" / "python"
    return str(venv_python) if venv_python.exists() else sys.executable


def request_walk(repo: Path, options: argparse.Namespace) -> dict:
    for option, directory in (("--front", options.front), ("--choice", options.choice)):
        if not (repo / directory).is_dir():
            raise WalkError(f"{option} {directory}: no such directory in {repo}")
    deadline = time.monotonic() + options.walk_timeout
    python = repo_python(repo)
    env = child_env(repo)
    sim = serve = None
    with tempfile.TemporaryDirectory(prefix="structure-walk-") as work:
        work_dir = Path(work)
        trace_path = work_dir / "walk.json"
        try:
            sim = start_process([python, "-m", "cortex", "sim", "--engine", "sglang",
                                 "--count", "2", "--port", "0"],
                                repo, env, work_dir / "sim.log")
            serve_line = sim.reader.until(lambda line: line.startswith("cortex serve "),
                                          deadline, "cortex sim's serve line")
            serve_args = shlex.split(serve_line)[1:]  # without the leading "cortex"
            model = serve_args[serve_args.index("--model") + 1].split(",")[0]
            serve_args += ["--server-host", "127.0.0.1", "--server-port", "0",
                           "--control-port", "0", "--server-processes", "1"]
            # -P: the script's own directory (perf/) stays off sys.path
            serve = start_process(
                [python, "-P", str(SCRIPT), "--trace-child", str(trace_path),
                 "--front", options.front, "--choice", options.choice,
                 "--choice-names", options.choice_names, "--", *serve_args],
                repo, env, work_dir / "serve.log")
            started = serve.reader.until(lambda line: "data plane on " in line, deadline,
                                         "cortex serve's start line")
            port = int(re.search(r"data plane on \S+:(\d+)", started).group(1))
            wait_ready(port, deadline)

            body = {"model": model, **CHAT_BODY}
            warm = [http_request(port, "POST", "/v1/chat/completions", body)
                    for _ in range(WARM_REQUESTS)]
            for status, _, answer in warm:
                if status != 200:
                    raise WalkError(f"a warm-up request was answered {status}: {answer[:200]}")
            serve.process.send_signal(signal.SIGUSR1)
            wait_for_file(Path(str(trace_path) + ".armed"), deadline, "the tracer to arm")
            status, headers, answer = http_request(port, "POST", "/v1/chat/completions", body)
            if status != 200:
                raise WalkError(f"the traced request was answered {status}: {answer[:200]}")
            # the tracer writes the trace before the response goes out: it is there or never
            wait_for_file(trace_path, min(deadline, time.monotonic() + 5.0),
                          "the trace (the request never reached the worker choice)")
            trace = json.loads(trace_path.read_text())
        except WalkError as error:
            logs = "".join(_tail(s.reader.log_path) for s in (sim, serve) if s is not None)
            raise WalkError(f"{error}\n{logs}") from None
        finally:
            stop_process(serve)
            stop_process(sim)
    if trace["error"] is not None:
        raise WalkError(f"the tracer failed: {trace['error']}")
    expected = str(repo / "cortex")
    if not str(trace["cortex_file"]).startswith(expected):
        raise WalkError(f"the gateway ran {trace['cortex_file']}, not the checkout's cortex")
    summary = summarise_walk(trace["events"], options.hub, repo)
    summary["routed"] = {"match_mode": headers.get("x-cortex-match-mode"),
                         "worker": headers.get("x-cortex-assigned-worker")}
    return summary


def _tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []
    return f"--- {path.name}:\n" + "\n".join(text) + "\n"


COMPREHENSIONS = {"<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"}


def summarise_walk(events: list[dict], hub: str, repo: Path) -> dict:
    """The figures of part a from the tracer's events (the last one is the choice call)."""
    last_call_at: dict[int, int] = {}
    for position, event in enumerate(events):
        if event["event"] == "call":
            last_call_at[event["frame"]] = position
    trigger, choice = events[0], events[-1]
    hub_note = "--hub"
    if not (repo / hub).exists():
        hub = trigger["file"]  # the hub moved: the function the front hands the request to
        hub_note = "the trigger's file (--hub names no file of this checkout)"
    elif hub != trigger["file"]:
        hub_note = "--hub (not the trigger's file)"
    seen_frames: set[int] = set()
    calls_per_file: dict[str, int] = {}  # in order of first visit
    returns_to_hub = 0
    innermost = trigger["file"]
    for position, event in enumerate(events[:-1]):
        frame = event["frame"]
        if event["event"] == "call":
            if frame in seen_frames:
                continue  # a coroutine resuming
            seen_frames.add(frame)
            if event["function"].rsplit(".", 1)[-1] not in COMPREHENSIONS:
                calls_per_file[event["file"]] = calls_per_file.get(event["file"], 0) + 1
        elif last_call_at.get(frame, -1) > position:
            continue  # a coroutine suspending: it is called again later
        if event["innermost"] == hub and innermost != hub:
            returns_to_hub += 1
        innermost = event["innermost"]
    return {
        "hub": hub,
        "hub_note": hub_note,
        "trigger": f"{trigger['file']}:{trigger['line']} {trigger['function']}",
        "choice": f"{choice['file']}:{choice['line']} {choice['function']}",
        "files": list(calls_per_file),
        "calls_per_file": calls_per_file,
        "file_count": len(calls_per_file),
        "returns_to_hub": returns_to_hub,
        "calls": sum(calls_per_file.values()),
    }


# ---------------------------------------------------------------------------------------------
# b. Package cycles
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ImportEdge:
    source: str
    target: str
    path: str
    line: int
    where: str  # "module", "type_checking" or "function"
    statement: str


def cortex_python_files(repo: Path) -> list[Path]:
    return sorted(path for path in (repo / "cortex").rglob("*.py")
                  if "__pycache__" not in path.parts)


def node_of_module(parts: list[str], repo: Path) -> str:
    """The graph node of the dotted module ``parts`` (``["cortex", "gateway", "proxy"]``)."""
    if len(parts) < 2:
        return "cortex"
    top = repo / "cortex" / parts[1]
    if top.is_dir() or top.with_suffix(".py").exists():
        return f"cortex.{parts[1]}"
    return "cortex"  # a name defined in cortex/__init__.py


def module_parts(path: Path, repo: Path) -> list[str]:
    parts = list(path.relative_to(repo).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return parts


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class ImportScanner(ast.NodeVisitor):
    """The package edges of one module's imports."""

    def __init__(self, path: Path, repo: Path) -> None:
        self.repo = repo
        self.path = path
        self.rel_path = str(path.relative_to(repo))
        self.parts = module_parts(path, repo)
        self.is_package = path.name == "__init__.py"
        self.source = node_of_module(self.parts, repo)
        self.edges: list[ImportEdge] = []
        self.where = ["module"]

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self.where.append("type_checking")
            for child in node.body:
                self.visit(child)
            self.where.pop()
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.where.append("function")
        self.generic_visit(node)
        self.where.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == "cortex" or alias.name.startswith("cortex."):
                self.add(alias.name.split("."), node, f"import {alias.name}")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0:
            base = (node.module or "").split(".")
        else:
            package = self.parts if self.is_package else self.parts[:-1]
            base = package[: len(package) - (node.level - 1)]
            base = base + (node.module.split(".") if node.module else [])
        if not base or base[0] != "cortex":
            return
        written = "." * node.level + (node.module or "")
        if len(base) >= 2:
            names = ", ".join(alias.name for alias in node.names)
            self.add(base, node, f"from {written} import {names}")
            return
        for alias in node.names:  # from cortex import x: x names the package or module
            self.add(["cortex", alias.name], node, f"from {written} import {alias.name}")

    def add(self, parts: list[str], node: ast.stmt, statement: str) -> None:
        target = node_of_module(parts, self.repo)
        if target != self.source:
            self.edges.append(ImportEdge(self.source, target, self.rel_path, node.lineno,
                                         self.where[-1], statement))


def package_edges(repo: Path) -> list[ImportEdge]:
    edges = []
    for path in cortex_python_files(repo):
        scanner = ImportScanner(path, repo)
        scanner.visit(ast.parse(path.read_text(), str(path)))
        edges += scanner.edges
    return edges


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the strongly connected components of ``graph``."""
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = lowlink[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                lowlink[node] = min(lowlink[node], lowlink[target])
            elif target in on_stack:
                lowlink[node] = min(lowlink[node], index[target])
        if lowlink[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


WHERE_ORDER = {"module": 0, "type_checking": 1, "function": 2}


def package_cycles(repo: Path) -> dict:
    edges = package_edges(repo)
    graph: dict[str, set[str]] = {}
    examples: dict[tuple[str, str], ImportEdge] = {}
    for edge in edges:
        graph.setdefault(edge.source, set()).add(edge.target)
        graph.setdefault(edge.target, set())
        key = (edge.source, edge.target)
        best = examples.get(key)
        if best is None or (WHERE_ORDER[edge.where], edge.path, edge.line) < (
                WHERE_ORDER[best.where], best.path, best.line):
            examples[key] = edge
    cycles = []
    for component in strongly_connected(graph):
        if len(component) < 2:
            continue
        members = set(component)
        cycle_edges = [examples[(source, target)] for source, target in sorted(examples)
                       if source in members and target in members]
        cycles.append({
            "packages": component,
            "edges": [{"from": e.source, "to": e.target, "where": e.where,
                       "at": f"{e.path}:{e.line}", "import": e.statement}
                      for e in cycle_edges],
        })
    cycles.sort(key=lambda cycle: (-len(cycle["packages"]), cycle["packages"]))
    return {"packages": len(graph), "package_edges": len(examples), "cycles": cycles}


# ---------------------------------------------------------------------------------------------
# c. Largest constructors
# ---------------------------------------------------------------------------------------------

@dataclass
class ClassInfo:
    name: str
    path: str
    line: int
    kind: str  # "__init__", "dataclass" or "NamedTuple"
    own_params: int
    dataclass_bases: list[str] = field(default_factory=list)


def _decorator_name(decorator: ast.expr) -> str | None:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return target.attr
    return None


def _keyword_is_false(call: ast.Call, name: str) -> bool:
    return any(k.arg == name and isinstance(k.value, ast.Constant) and k.value.value is False
               for k in call.keywords)


def _base_names(node: ast.ClassDef) -> list[str]:
    names = []
    for base in node.bases:
        if isinstance(base, ast.Name):
            names.append(base.id)
        elif isinstance(base, ast.Attribute):
            names.append(base.attr)
    return names


def _annotation_text(annotation: ast.expr) -> str:
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return annotation.value
    return ast.unparse(annotation)


def _is_init_field(statement: ast.AnnAssign) -> bool:
    annotation = _annotation_text(statement.annotation)
    if "ClassVar" in annotation or annotation.endswith("KW_ONLY"):
        return False
    value = statement.value
    return not (isinstance(value, ast.Call) and _decorator_name(value) == "field"
                and _keyword_is_false(value, "init"))


def _annotated_fields(node: ast.ClassDef) -> list[ast.AnnAssign]:
    return [s for s in node.body
            if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]


def _explicit_init(node: ast.ClassDef) -> ast.FunctionDef | None:
    for statement in node.body:
        if isinstance(statement, ast.FunctionDef) and statement.name == "__init__":
            return statement
    return None


def named_parameter_count(function: ast.FunctionDef | ast.AsyncFunctionDef,
                          skip_first: bool) -> int:
    arguments = function.args
    count = len(arguments.posonlyargs) + len(arguments.args) + len(arguments.kwonlyargs)
    return count - 1 if skip_first and count else count


def _class_info(node: ast.ClassDef, rel_path: str) -> ClassInfo | None:
    init = _explicit_init(node)
    dataclass_call = None
    is_dataclass = False
    for decorator in node.decorator_list:
        if _decorator_name(decorator) == "dataclass":
            is_dataclass = True
            dataclass_call = decorator if isinstance(decorator, ast.Call) else None
    if init is not None:
        return ClassInfo(node.name, rel_path, node.lineno, "__init__",
                         named_parameter_count(init, skip_first=True))
    if is_dataclass and not (dataclass_call and _keyword_is_false(dataclass_call, "init")):
        fields = [s for s in _annotated_fields(node) if _is_init_field(s)]
        return ClassInfo(node.name, rel_path, node.lineno, "dataclass", len(fields),
                         dataclass_bases=_base_names(node))
    if "NamedTuple" in _base_names(node):
        return ClassInfo(node.name, rel_path, node.lineno, "NamedTuple",
                         len(_annotated_fields(node)))
    return None


def _is_method(function: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    if not isinstance(parents.get(function), ast.ClassDef):
        return False
    return not any(_decorator_name(d) == "staticmethod" for d in function.decorator_list)


def _qualified_names(tree: ast.Module) -> Iterator[tuple[ast.AST, str, dict]]:
    """Every class and function of ``tree`` with its dotted name inside the module."""
    parents: dict[ast.AST, ast.AST] = {}
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            parents[child] = parent
    for node in ast.walk(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names = [node.name]
            parent = parents.get(node)
            while parent is not None:
                if isinstance(parent, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.append(parent.name)
                parent = parents.get(parent)
            yield node, ".".join(reversed(names)), parents


def top_with_ties(rows: list[dict]) -> list[dict]:
    """The first ``TOP_COUNT`` rows (sorted by parameters, most first) and every row tied with
    the last of them, so that the list does not depend on which file a tie sorts first in."""
    if len(rows) <= TOP_COUNT:
        return rows
    last = rows[TOP_COUNT - 1]["params"]
    return [row for index, row in enumerate(rows) if index < TOP_COUNT or row["params"] == last]


def largest_constructors(repo: Path) -> dict:
    classes: list[ClassInfo] = []
    functions: list[dict] = []
    for path in cortex_python_files(repo):
        rel_path = str(path.relative_to(repo))
        tree = ast.parse(path.read_text(), str(path))
        for node, qualified, parents in _qualified_names(tree):
            if isinstance(node, ast.ClassDef):
                info = _class_info(node, rel_path)
                if info is not None:
                    info.name = qualified
                    classes.append(info)
            else:
                method = _is_method(node, parents)
                count = len(node.args.args) - (1 if method and node.args.args else 0)
                functions.append({"name": qualified, "params": count,
                                  "at": f"{rel_path}:{node.lineno}"})
    dataclasses_by_name: dict[str, list[ClassInfo]] = {}
    for info in classes:
        if info.kind == "dataclass":
            dataclasses_by_name.setdefault(info.name.rsplit(".", 1)[-1], []).append(info)

    def dataclass_params(info: ClassInfo, seen: frozenset[str]) -> int:
        total = info.own_params
        for base in info.dataclass_bases:
            found = dataclasses_by_name.get(base, [])
            if len(found) == 1 and base not in seen:  # a unique cortex dataclass of that name
                total += dataclass_params(found[0], seen | {base})
        return total

    rows = []
    for info in classes:
        params = dataclass_params(info, frozenset()) if info.kind == "dataclass" \
            else info.own_params
        rows.append({"name": info.name, "params": params, "kind": info.kind,
                     "at": f"{info.path}:{info.line}"})
    rows.sort(key=lambda row: (-row["params"], row["at"]))
    functions.sort(key=lambda row: (-row["params"], row["at"]))
    return {"classes": top_with_ties(rows), "functions": top_with_ties(functions),
            "classes_counted": len(rows), "functions_counted": len(functions)}


# ---------------------------------------------------------------------------------------------
# d. Harness lines
# ---------------------------------------------------------------------------------------------

def tracked_files(repo: Path, *directories: str) -> list[str]:
    listing = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--", *directories],
                             capture_output=True, check=True)
    return sorted(name for name in listing.stdout.decode().split("\0")
                  if name and name != SCRIPT_IN_REPO)


def line_count(path: Path) -> int:
    if not path.is_file():  # tracked but deleted in the work tree
        return 0
    return path.read_bytes().count(b"\n")


def is_harness(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return not (base.startswith("test_") and base.endswith(".py")) and not base.endswith(".md")


def _parse_or_none(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(), str(path))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None


def _dotted_name(expression: ast.expr) -> str | None:
    """``a.b.c`` for a chain of names and attributes, else None."""
    if isinstance(expression, ast.Name):
        return expression.id
    if isinstance(expression, ast.Attribute):
        owner = _dotted_name(expression.value)
        return None if owner is None else f"{owner}.{expression.attr}"
    return None


def _calls(tree: ast.Module) -> Iterator[tuple[ast.Call, str]]:
    """Every call of a dotted name (``trio.sleep(...)``) as (call, "trio.sleep")."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            dotted = _dotted_name(node.func)
            if dotted is not None:
                yield node, dotted


SLEEPS = {"trio.sleep", "time.sleep", "asyncio.sleep"}
SYS_PATH_EDITS = {"sys.path.insert", "sys.path.append"}
PERCENTILE_NAME = re.compile(r"percentile|pct|quantile", re.IGNORECASE)


def _is_zero_literal(call: ast.Call) -> bool:
    if len(call.args) != 1 or call.keywords:
        return False
    argument = call.args[0]
    return isinstance(argument, ast.Constant) and argument.value == 0 \
        and not isinstance(argument.value, bool)


def harness_lines(repo: Path) -> dict:
    figures: dict = {}
    for directory in ("tests", "perf"):
        names = tracked_files(repo, directory)
        harness = [name for name in names if is_harness(name)]
        figures[directory] = {
            "harness_files": len(harness),
            "harness_lines": sum(line_count(repo / name) for name in harness),
            "total_files": len(names),
            "total_lines": sum(line_count(repo / name) for name in names),
        }
    figures["harness_lines"] = figures["tests"]["harness_lines"] + \
        figures["perf"]["harness_lines"]

    sleeps = Counter()
    for name in tracked_files(repo, "tests"):
        tree = _parse_or_none(repo / name) if name.endswith(".py") else None
        for call, dotted in _calls(tree) if tree else ():
            if dotted in SLEEPS and not _is_zero_literal(call):
                sleeps[name] += 1
    sys_path_files = []
    for name in tracked_files(repo, "perf"):
        tree = _parse_or_none(repo / name) if name.endswith(".py") else None
        if tree and any(dotted in SYS_PATH_EDITS for _, dotted in _calls(tree)):
            sys_path_files.append(name)
    percentile_files = {}
    for name in tracked_files(repo, "tests", "perf", "cortex"):
        tree = _parse_or_none(repo / name) if name.endswith(".py") else None
        found = sorted({node.name for node in ast.walk(tree) if isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef)) and PERCENTILE_NAME.search(
            node.name) and not node.name.startswith("test")}) if tree else []
        if found:
            percentile_files[name] = found
    figures["test_sleeps"] = sum(sleeps.values())
    figures["test_sleep_files"] = len(sleeps)
    figures["perf_sys_path_files"] = sys_path_files
    figures["percentile_files"] = percentile_files
    return figures


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

def checkout_name(repo: Path) -> str:
    described = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                               capture_output=True, text=True)
    commit = described.stdout.strip() or "unknown commit"
    dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", "cortex"],
                           capture_output=True, text=True).stdout.strip()
    return f"{repo} @ {commit}" + (" (cortex/ has uncommitted changes)" if dirty else "")


def markdown(report: dict) -> str:
    out = [f"# Structure report: {report['checkout']}", ""]
    walk = report["walk"]
    out += ["## a. Request walk", ""]
    if walk is None:
        out += ["(skipped: --no-walk)", ""]
    elif "error" in walk:
        out += [f"(failed: {walk['error']})", ""]
    else:
        out += [
            "| figure | value |", "| --- | --- |",
            "| request | `POST /v1/chat/completions`, 2 messages, not streamed; traced "
            f"after {WARM_REQUESTS} identical ones |",
            f"| routed as | {walk['routed']['match_mode']} to {walk['routed']['worker']} |",
            f"| trigger (the front's hand-off) | `{walk['trigger']}` |",
            f"| stop (the worker choice) | `{walk['choice']}` |",
            f"| cortex files crossed before the choice | {walk['file_count']} |",
            f"| hub | `{walk['hub']}` ({walk['hub_note']}) |",
            f"| returns to the hub | {walk['returns_to_hub']} |",
            f"| cortex function calls before the choice | {walk['calls']} |",
            "", "| # | file (order of first visit) | calls |", "| --- | --- | --- |",
        ]
        out += [f"| {i} | `{name}` | {count} |"
                for i, (name, count) in enumerate(walk["calls_per_file"].items(), 1)]
        out.append("")

    cycles = report["cycles"]
    out += ["## b. Package cycles", "",
            "| figure | value |", "| --- | --- |",
            f"| packages (nodes) | {cycles['packages']} |",
            f"| package edges | {cycles['package_edges']} |",
            f"| cycles (strongly connected, > 1 package) | {len(cycles['cycles'])} |",
            f"| packages in cycles | {sum(len(c['packages']) for c in cycles['cycles'])} |",
            ""]
    for number, cycle in enumerate(cycles["cycles"], 1):
        out += [f"Cycle {number}: {', '.join(cycle['packages'])}", "",
                "| from | to | where | example import |", "| --- | --- | --- | --- |"]
        out += [f"| {e['from']} | {e['to']} | {e['where']} | `{e['at']}`: `{e['import']}` |"
                for e in cycle["edges"]]
        out.append("")

    constructors = report["constructors"]
    out += ["## c. Largest constructors", "",
            f"Classes ({constructors['classes_counted']} with a constructor of their own; ties "
            "at the 10th place included):", "",
            "| # | class | parameters | kind | where |", "| --- | --- | --- | --- | --- |"]
    out += [f"| {i} | `{row['name']}` | {row['params']} | {row['kind']} | `{row['at']}` |"
            for i, row in enumerate(constructors["classes"], 1)]
    out += ["", f"Functions ({constructors['functions_counted']}), positional-or-keyword "
                "parameters (ties at the 10th place included):", "",
            "| # | function | parameters | where |", "| --- | --- | --- | --- |"]
    out += [f"| {i} | `{row['name']}` | {row['params']} | `{row['at']}` |"
            for i, row in enumerate(constructors["functions"], 1)]
    out.append("")

    harness = report["harness"]
    tests, perf = harness["tests"], harness["perf"]
    percentile = harness["percentile_files"]
    out += ["## d. Harness lines", "",
            "| figure | value |", "| --- | --- |",
            f"| harness lines, tests/ + perf/ | {harness['harness_lines']} |",
            f"| harness lines, tests/ ({tests['harness_files']} files) | "
            f"{tests['harness_lines']} |",
            f"| harness lines, perf/ ({perf['harness_files']} files) | "
            f"{perf['harness_lines']} |",
            f"| total lines, tests/ ({tests['total_files']} files) | {tests['total_lines']} |",
            f"| total lines, perf/ ({perf['total_files']} files) | {perf['total_lines']} |",
            f"| real-time sleeps in tests/ (in {harness['test_sleep_files']} files) | "
            f"{harness['test_sleeps']} |",
            f"| perf/ files editing sys.path | {len(harness['perf_sys_path_files'])} |",
            f"| files defining a percentile function | {len(percentile)} |",
            ""]
    if harness["perf_sys_path_files"]:
        out += ["perf/ files editing sys.path: " + ", ".join(
            f"`{name}`" for name in harness["perf_sys_path_files"]), ""]
    if percentile:
        out += ["Percentile functions: " + ", ".join(
            f"`{name}` ({', '.join(functions)})" for name, functions in percentile.items()),
            ""]
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repo", type=Path, default=SCRIPT.parent.parent,
                        help="the checkout to measure (default: this script's)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of markdown")
    parser.add_argument("--hub", default=DEFAULT_HUB,
                        help=f"the request walk's hub file (default: {DEFAULT_HUB})")
    parser.add_argument("--front", default=DEFAULT_FRONT,
                        help=f"the HTTP front layer's directory (default: {DEFAULT_FRONT})")
    parser.add_argument("--choice", default=DEFAULT_CHOICE,
                        help="the directory of the worker-choice function "
                             f"(default: {DEFAULT_CHOICE})")
    parser.add_argument("--choice-names", default=DEFAULT_CHOICE_NAMES,
                        help=f"its possible names (default: {DEFAULT_CHOICE_NAMES})")
    parser.add_argument("--no-walk", action="store_true", help="skip the request walk")
    parser.add_argument("--walk-timeout", type=float, default=60.0,
                        help="seconds the request walk may take (default: 60)")
    parser.add_argument("--trace-child", metavar="OUT", help=argparse.SUPPRESS)
    parser.add_argument("cortex_args", nargs="*", help=argparse.SUPPRESS)
    return parser


def main() -> int:
    options = build_parser().parse_args()
    if options.trace_child:
        return run_trace_child(options)
    repo = options.repo.resolve()
    if not (repo / "cortex").is_dir():
        print(f"{repo} has no cortex/ directory", file=sys.stderr)
        return 2
    walk = None
    if not options.no_walk:
        try:
            walk = request_walk(repo, options)
        except WalkError as error:
            walk = {"error": str(error)}
    report = {
        "checkout": checkout_name(repo),
        "walk": walk,
        "cycles": package_cycles(repo),
        "constructors": largest_constructors(repo),
        "harness": harness_lines(repo),
    }
    print(json.dumps(report, indent=2) if options.json else markdown(report))
    return 1 if walk is not None and "error" in walk else 0


if __name__ == "__main__":
    sys.exit(main())
