"""Cold tokenization in a pool of processes (``server.tokenize_processes``): the I/O shell.

Why processes: a worker thread does not keep the event loop free. ``Tokenizer.encode``
holds the GIL for the whole encode; ``encode_batch`` releases it, but the thread takes it back
to build the answer (a Python list per piece) and the loop then waits for it, or for the
switch interval, and a thread can use a second core only while it is inside Rust. A process
of the pool tokenizes with its own interpreter: the loop only writes the cold text to a pipe
and reads ``array('I')`` bytes back (``cortex.profile.pool_worker``), and the pool's processes
use the host's other cores. ``perf/bench_cold.py`` measures both (the added latency of small
requests while a cold 32k-token prompt is tokenized; cold 8k-token prompts per second).

Rules:

* The pool is ``trio_parallel``'s worker context (spawned processes, kept while the gateway
  runs: no idle timeout). ``run`` starts all ``processes`` of them before ``task_status``
  reports the pool started (each loads every pooled model's profile from the same files as
  the gateway: 1-3 s and ~120 MiB each with DeepSeek-V3's), so that the first cold request
  pays no start. A process that cannot start stops Cortex's start (a ``ConfigError``: exit 2
  with the reason).
* At most ``processes`` jobs run at once (a ``CapacityLimiter``); more wait in it, in order.
* A job cannot be cancelled midway: a request cancelled while its text is encoded waits for
  it, as with a worker thread, so the cache never sees half a result.
* The processes run at a lower CPU priority (``nice``): on a busy host the event loop, which
  every request needs, wins the core over a tokenization, which only one request needs.
* They ignore SIGINT and SIGTERM (a signal to the whole process group must not take them
  away from a draining gateway); they exit when the gateway closes their pipes, or with it.
* Exact or nothing: a model is pooled only if every process loaded a profile with the
  gateway's fingerprint, and each job carries it (``pool_worker``).
* ``encode`` returns ``None`` when the pool cannot do a job — a model not pooled, a process
  that died (``trio_parallel.BrokenWorkerError``; the next job starts a new one) or whose
  profile differs — and the caller encodes in a worker thread instead. Each such fallback
  (but a model never pooled) is logged with its reason and counted (``fallbacks``).

Limits: the pool speeds up cold text only. Everything else a request costs (HTTP, the body's
parse, the chat template, the segment cache, block keys, the decision, the proxying) stays
on the one event loop: warm traffic saturates one core whatever the pool's size.
"""

from __future__ import annotations

import logging
import math
from array import array
from collections.abc import Mapping, Sequence
from functools import partial

import trio
import trio_parallel

from cortex.errors import ConfigError
from cortex.profile import pool_worker
from cortex.profile.model_profile import ProfileSpec

__all__ = ["NICE", "TokenizePool"]

log = logging.getLogger("cortex.tokenize")

NICE = 5  # the pool's processes' niceness over the gateway's (CFS weight ~3x lower)


class TokenizePool:
    """``fingerprints``: model -> the fingerprint of the gateway's own profile of it; the pool
    encodes only for models whose processes loaded a profile with the same fingerprint."""

    def __init__(self, specs: Sequence[ProfileSpec], fingerprints: Mapping[str, str],
                 processes: int, nice: int = NICE) -> None:
        if processes < 1:
            raise ValueError("a tokenize pool needs at least one process")
        self.specs = tuple(specs)
        self.fingerprints = dict(fingerprints)
        self.processes = processes
        self.nice = nice
        self.models: frozenset[str] = frozenset()  # loaded in every process (after ``run``)
        self.jobs = 0
        self.fallbacks = 0
        self._context: trio_parallel.WorkerContext | None = None
        self._limiter = trio.CapacityLimiter(processes)

    async def run(self, *, task_status: trio.TaskStatus[TokenizePool] = trio.TASK_STATUS_IGNORED,
                  ) -> None:
        """Start the processes, report started, serve until cancelled (then stop them)."""
        init = partial(pool_worker.load, self.specs, self.nice)
        async with trio_parallel.open_worker_context(
                init=init, idle_timeout=math.inf, grace_period=5.0) as context:
            loaded: list[dict[str, str]] = []

            async def warm() -> None:
                try:
                    loaded.append(await context.run_sync(pool_worker.loaded_models,
                                                         limiter=self._limiter))
                except trio_parallel.BrokenWorkerError as error:  # Cortex does not start
                    code = getattr(error.args[-1], "exitcode", None) if error.args else None
                    problem = (f"server.tokenize_processes: a tokenizer process did not start "
                               f"(exit code {code}; its error is on stderr)")
                    raise ConfigError([problem]) from error

            async with trio.open_nursery() as nursery:  # concurrent: one process each
                for _ in range(self.processes):
                    nursery.start_soon(warm)
            common = {model for model, fingerprint in self.fingerprints.items()
                      if all(found.get(model) == fingerprint for found in loaded)}
            self.models = frozenset(common)
            missing = sorted({spec.model for spec in self.specs} - common)
            log.info("tokenize pool: %d processes for %s%s", self.processes,
                     ", ".join(sorted(common)) or "no model",
                     f" (not loaded, cold text in a thread: {', '.join(missing)})"
                     if missing else "")
            self._context = context
            task_status.started(self)
            try:
                await trio.sleep_forever()
            finally:
                self._context = None

    async def encode(self, model: str, pieces: list[str]) -> list[array[int]] | None:
        """The ids of each cold piece, from a pool process; ``None``: encode them elsewhere."""
        context = self._context
        if context is None or model not in self.models:
            return None
        self.jobs += 1
        try:
            ids = await context.run_sync(pool_worker.encode_cold, model,
                                         self.fingerprints[model], pieces,
                                         limiter=self._limiter)
        except trio_parallel.BrokenWorkerError as error:
            self.fallbacks += 1
            log.warning("tokenize pool: a process died (%s); this request's text is encoded "
                        "in a thread, the next job starts a new process", error)
            return None
        if ids is None:
            self.fallbacks += 1
            log.warning("tokenize pool: a process has no profile of %s equal to the "
                        "gateway's (its files changed since Cortex started?); this request's "
                        "text is encoded in a thread", model)
        return ids
