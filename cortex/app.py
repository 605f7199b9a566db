"""``cortex serve``: every part wired together under one trio nursery.

Order of start (each step done before the next begins, via ``nursery.start``):

1. the upstream pool (idle reaper) and the ledger book;
2. the worker registry with the configured workers, then those of ``discovery`` (DNS, first
   answer applied; added and drained like admin changes) — each worker's KV-event ingestion
   (one subscriber per DP rank) starts when it is added and stops when it is removed;
3. the health/load monitor (a worker is routable after its first good probe), the task
   that gives freed memory back to the system (``cortex.memory_trim``) and, in the background,
   each model's move to the fastokens BPE where its start check holds
   (``trio_tokenize.upgrade_bpes``: until then ``tokenizers`` encodes, exactly as well);
4. the control plane (hypercorn, loopback by default) and the data plane (lean llhttp server);
   then one INFO line sums the start up: listeners, models, workers (``serve_summary``), and
   one WARNING says what is missing when no worker is configured (``nothing_to_serve``).

Once both planes listen, everything built so far (the tokenizer's tables, chat templates,
configuration, compiled code) is moved out of the cyclic collector's generations
(``gc.freeze``): it lives as long as the process, and a full collection then walks only what
serving created — ~1 ms instead of ~95 ms of stalled event loop with a 128k-token vocabulary.

Workers are kept in step with the registry (pools, ingestion, ledger targets) by
``cortex.worker_lifecycle.WorkerLifecycle``, whose docstring holds the worker lifecycle rules.

Shutdown (SIGINT/SIGTERM, or cancelling ``run_gateway``): the data plane drains (in-flight
requests finish within ``server.limits.drain_timeout_s``), then everything is cancelled.

``server.processes`` > 1: ``serve`` is process 0 of that many; the others are started once
its gateway serves, and stopped with it (``cortex.processes``).
"""

from __future__ import annotations

import gc
import logging
import random
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import trio

from cortex.config.tree import CortexConfig
from cortex.control.app import ControlApp
from cortex.control.auth import BearerAuth
from cortex.control.serve import serve_control
from cortex.dispatch.model_pool import ModelPool
from cortex.errors import ConfigError
from cortex.events.counters import IngestCounters
from cortex.front.server import HttpServer
from cortex.gateway.proxy import Gateway
from cortex.ledger.book import LedgerBook
from cortex.logs import log_exchange
from cortex.memory_trim import run_memory_trim
from cortex.metrics.cortex_metrics import CortexMetrics, ledger_figures
from cortex.metrics.route_metrics import MetricsObserver
from cortex.processes import ProcessGroup, until_parent_gone
from cortex.profile.profile_set import ProfileSet, load_profiles
from cortex.profile.trio_tokenize import upgrade_bpes
from cortex.replicas.sync import ReplicaSync
from cortex.serve_summary import nothing_to_serve, serve_summary
from cortex.systemd import Notifier, run_watchdog
from cortex.upstream.connection_pool import ConnectionPool
from cortex.worker_lifecycle import WorkerLifecycle, model_of
from cortex.workers.dns_watch import run_dns_discovery
from cortex.workers.monitor import run_monitor
from cortex.workers.registry import WorkerRegistry
from cortex.workers.spec import WorkerSpec

log = logging.getLogger("cortex.app")


@dataclass(slots=True)
class Running:
    """What a started gateway exposes (tests, the demo, the CLI's startup line)."""

    data_port: int
    control_port: int
    book: LedgerBook
    registry: WorkerRegistry
    pools: dict[str, ModelPool]
    server: HttpServer
    metrics: CortexMetrics
    gateway: Gateway
    ingest_counters: dict[int, IngestCounters] = field(default_factory=dict)
    # SIGHUP: make the registry's workers these specs; returns (changes, problems)
    reload_workers: Callable[[Sequence[WorkerSpec]], tuple[list[str], list[str]]] | None = (
        None)
    replica_sync: ReplicaSync | None = None  # when replicas.listen or replicas.peers is set


def build_pools(
    config: CortexConfig, book: LedgerBook
) -> tuple[dict[str, ModelPool], ProfileSet]:
    """One pool per configured model (and per model a worker names without a profile)."""
    specs = [model.profile_spec() for model in config.models if not model.passthrough]
    profiles = load_profiles(specs)
    failed = profiles.load_errors()
    stop = [f"models ({model.name}): profile not loaded: {failed[model.name]} (models.required"
            " = false would start without exact routing for it)"
            for model in config.models if model.name in failed and model.required]
    if stop:
        raise ConfigError(stop)
    for model, reason in sorted(failed.items()):
        log.error("model %s: profile not loaded, routed by load only: %s", model, reason)
    rng = random.Random(config.scheduler.seed)
    pools: dict[str, ModelPool] = {}
    for model in config.models:
        pools[model.name] = ModelPool(
            model.name, book, profiles=profiles, settings=config.pool_settings(model.name),
            passthrough=model.passthrough, rng=random.Random(rng.getrandbits(64)))
        if model.block_size is not None and model.block_size > 1 and not model.passthrough:
            book.fold_pages(model.name, model.block_size)  # SGLang's default page size of 1
    for worker in config.workers:
        name = model_of(worker, config)
        if name not in pools:
            pools[name] = ModelPool(name, book, profiles=profiles,
                                    settings=config.pool_settings(name),
                                    rng=random.Random(rng.getrandbits(64)))
    return pools, profiles



async def run_gateway(config: CortexConfig, *, processes: ProcessGroup | None = None,
                      task_status: trio.TaskStatus[Running] = trio.TASK_STATUS_IGNORED) -> None:
    """``processes``: the other processes of ``server.processes`` (process 0's control plane
    speaks for them, and the stop signal is sent on to them), or ``None``."""
    book = LedgerBook(config.ledger.max_entries, config.ledger.low_water,
                      config.ledger.fold_entries)
    pools, profiles = build_pools(config, book)
    metrics = CortexMetrics()
    settings = config.health
    registry = WorkerRegistry(settings, trio.current_time)
    upstream = ConnectionPool(config.upstream.limits)
    counters: dict[int, IngestCounters] = {}
    observer = MetricsObserver(metrics, registry)
    gateway = Gateway(pools, upstream, retries=config.upstream.retries_before_first_byte,
                      observer=observer, pd=config.pd, admission=config.admission,
                      client_dp_rank=config.scheduler.client_dp_rank,
                      back_in=registry.back_in)
    server = HttpServer(gateway.handle, config.server.limits,
                        on_exchange=log_exchange if config.log.access_log else None)

    async def fetch(origin: str, path: str, timeout_s: float) -> tuple[int, bytes]:
        with trio.fail_after(timeout_s):
            async with upstream.request(origin, b"GET", path.encode(), []) as response:
                return response.status, await response.read(16 << 20)

    async with trio.open_nursery() as nursery:
        await nursery.start(upstream.run)
        workers = WorkerLifecycle(config, registry, book, pools, profiles, nursery, counters,
                                  metrics, fetch, upstream)
        if config.ledger.warm_start_url is not None:  # before any stream starts
            await workers.load_warm_start()
        problems: list[str] = []
        for spec in config.workers:
            try:
                registry.add(spec)
            except ConfigError as error:
                problems += error.problems
        if problems:
            raise ConfigError(problems)
        nursery.start_soon(workers.report_in_flight)
        for service in config.discovery:  # its first DNS answer is applied before we go on
            workers.discovered.append(owned := set())  # SIGHUP leaves these to discovery
            await nursery.start(partial(run_dns_discovery, service, workers, registry,
                                        owned=owned))
        await nursery.start(run_monitor, registry, fetch, settings)
        await nursery.start(run_memory_trim, config.server.memory_trim_s)
        if config.server.tokenize_processes:
            log.warning("server.tokenize_processes = %d is no longer used: long new text is "
                        "encoded in a worker thread (fastokens releases the interpreter lock; "
                        "README \"Every core\")", config.server.tokenize_processes)
        nursery.start_soon(upgrade_bpes, profiles.loaded())  # fastokens, where exact
        metrics.watch_ledger(lambda: ledger_figures(book))
        metrics.watch_workers(lambda: [v for pool in pools.values() for v in pool.views()])
        metrics.watch_ingest(lambda: [(book.info(t).worker, book.info(t).rank, c)
                                      for t, c in list(counters.items())])
        metrics.watch_http(lambda: server.counters)
        metrics.watch_probes(lambda: [(spec.name, registry.counters(spec.name))
                                      for spec in registry.specs()])
        metrics.watch_upstream_pool(lambda: [(spec.name, upstream.stats(spec.origin))
                                             for spec in registry.specs()])
        metrics.watch_models(lambda: [(name, None if pool.passthrough else pool.exact_off)
                                      for name, pool in sorted(pools.items())])
        metrics.watch_tokenizers(lambda: [(model, profile.bpe) for model, profile
                                          in sorted(profiles.loaded().items())])
        metrics.watch_chat_renders(lambda: [
            (model, template) for model, profile in sorted(profiles.loaded().items())
            if profile.chat_templates is not None
            for template in profile.chat_templates.distinct()])
        metrics.watch_pd(lambda: gateway.pd.counters)
        metrics.watch_admission(lambda: [(model, admission.counters) for model, admission
                                         in sorted(gateway.admissions.items())])
        replica_sync = None
        if config.replicas.enabled:  # before the data plane: no request goes untold
            replica_sync = ReplicaSync(config.replicas, pools)
            await nursery.start(replica_sync.run)
            metrics.watch_replicas(replica_sync.figures)
        readiness = gateway.readiness
        if processes is not None:
            metrics.watch_processes(processes.figures)
            readiness = lambda: gateway.readiness().with_reasons(
                processes.reasons())
        control = ControlApp(metrics=metrics, readiness=readiness,
                             auth=BearerAuth(config.control.read_admin_token()), admin=workers,
                             worker_hosts=config.control.worker_host_policy(),
                             ledger=lambda: ledger_figures(book), snapshot=workers.snapshot,
                             siblings=processes)
        control_port = await nursery.start(partial(serve_control, control, config.control.host,
                                                   config.control.port))
        _, data_port = await nursery.start(
            partial(server.serve, reuse_port=config.server.reuse_port),
            config.server.host, config.server.port)
        log.info("%s", serve_summary(config, registry.specs(), data_port, control_port))
        missing = nothing_to_serve(config, registry.specs())
        if missing is not None:
            log.warning("%s", missing)
        task_status.started(Running(data_port, control_port, book, registry, pools, server,
                                    metrics, gateway, counters, reload_workers=workers.reload,
                                    replica_sync=replica_sync))
        await _until_signal(server, config.server.limits.drain_timeout_s,
                            processes.stop if processes is not None else None)
        nursery.cancel_scope.cancel()


async def _until_signal(server: HttpServer, drain_timeout_s: float,
                        on_stop: Callable[[], None] | None = None) -> None:
    """Return after SIGINT/SIGTERM once the data plane drained, or never (until cancelled);
    ``on_stop`` is called when the drain begins."""
    if threading.current_thread() is not threading.main_thread():
        await trio.sleep_forever()  # signals reach the main thread only: cancellation stops us
        return
    # The receiver stays open through the drain: a second SIGTERM (systemd and a launcher
    # process may both send one) must not meet the default action and kill the drain; a
    # second SIGINT (an operator's Ctrl-C twice) stops at once.
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("signal %s: draining", signal.Signals(signum).name)
            break
        Notifier.from_environ().stopping("draining")  # systemd: a graceful stop, not a crash
        if on_stop is not None:
            on_stop()
        server.drain()
        with trio.move_on_after(drain_timeout_s + 1) as drain:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_more_signals_while_draining, signals, drain)
                while server.in_flight:
                    await trio.sleep(0.05)
                nursery.cancel_scope.cancel()


async def _more_signals_while_draining(signals: AsyncIterator[int],
                                       drain: trio.CancelScope) -> None:
    async for signum in signals:
        if signum == signal.SIGINT:
            log.warning("second SIGINT: stopping without waiting for the drain")
            drain.cancel()
            return
        log.warning("SIGTERM while draining: ignored (SIGINT or SIGKILL stops at once)")


def serve(config: CortexConfig, reload: Callable[[], CortexConfig] | None = None,
          argv: Sequence[str] | None = None, started_by_process_0: bool = False) -> int:
    """Run the gateway until SIGINT/SIGTERM; the exit code for the CLI.

    ``server.processes`` > 1 (with ``argv``, the ``serve`` arguments, to start the others
    with): this is process 0 of that many (``cortex.processes``); READY once all serve.
    ``started_by_process_0``: this is one of the others, and stops when process 0 is gone.

    Under systemd (``NOTIFY_SOCKET``): READY=1 once both listeners are bound and the workers'
    ingestion started, WATCHDOG=1 from the trio loop every half ``WatchdogSec``, STOPPING=1
    when a signal starts the drain. ``reload`` (SIGHUP) re-reads the configuration and applies
    its worker list (``WorkerLifecycle.reload``); other keys need a restart."""
    notifier = Notifier.from_environ()
    group = None
    if config.server.processes > 1:
        if argv is None:
            raise ValueError("server.processes > 1: serve() needs the argv to start the "
                             "other processes with")
        group = ProcessGroup(config, argv)
        config = group.plan.first_config(config)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            async def gateway(task_status: trio.TaskStatus[Running]) -> None:
                await run_gateway(config, processes=group, task_status=task_status)
                if group is not None:  # drained: the others too, then stop
                    group.stop()
                    await group.ended.wait()
                nursery.cancel_scope.cancel()  # drained: stop the watchdog and SIGHUP tasks

            running: Running = await nursery.start(gateway)
            if started_by_process_0:
                nursery.start_soon(until_parent_gone)
            if group is not None:
                await nursery.start(group.run, running.data_port, running.control_port)
            if reload is not None:  # SIGHUP is caught before anyone is told we are up
                await nursery.start(_reload_on_sighup, running, reload, notifier, group)
            print(f"cortex: data plane on {config.server.host}:{running.data_port}, "
                  f"control plane on {config.control.host}:{running.control_port}", flush=True)
            gc.freeze()  # start-up objects live as long as the process (docstring)
            notifier.ready(f"serving on port {running.data_port}")
            await nursery.start(run_watchdog, notifier)
    try:
        trio.run(main)
    except (ConfigError, KeyboardInterrupt, BaseExceptionGroup) as error:
        code = _exit_code(error)
        if code is None:
            raise
        return code
    finally:
        notifier.close()
        if group is not None:
            group.close()
    return 0


def _exit_code(error: BaseException) -> int | None:
    """2 after printing configuration problems (also when a nursery wrapped them in a group),
    130 for Ctrl-C; ``None``: not an ending of ours (re-raised)."""
    leaves = [error]
    if isinstance(error, BaseExceptionGroup):
        ours, rest = error.split((ConfigError, KeyboardInterrupt))
        if ours is None or rest is not None:
            return None
        leaves = _flatten(ours)
    if any(isinstance(leaf, KeyboardInterrupt) for leaf in leaves):
        return 130
    for leaf in leaves:
        for problem in leaf.problems:  # type: ignore[attr-defined]
            print(f"cortex: {problem}", file=sys.stderr, flush=True)
    return 2


def _flatten(group: BaseExceptionGroup) -> list[BaseException]:
    return [leaf for error in group.exceptions
            for leaf in (_flatten(error) if isinstance(error, BaseExceptionGroup) else [error])]


async def _reload_on_sighup(running: Running, reload: Callable[[], CortexConfig],
                            notifier: Notifier, group: ProcessGroup | None = None, *,
                            task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
                            ) -> None:
    """Each SIGHUP: read the configuration again and apply its workers; a configuration with
    problems is logged and changes nothing. Sent on to the other processes of ``group``."""
    with trio.open_signal_receiver(signal.SIGHUP) as signals:
        task_status.started()
        async for _ in signals:
            notifier.send(RELOADING=1, MONOTONIC_USEC=time.monotonic_ns() // 1000)
            if group is not None:
                group.signal_all(signal.SIGHUP)
            try:
                config = reload()
            except (ConfigError, OSError) as error:
                problems = getattr(error, "problems", None) or [str(error)]
                log.error("SIGHUP: configuration not reloaded: %s", "; ".join(problems))
            else:
                assert running.reload_workers is not None
                changes, problems = running.reload_workers(config.workers)
                log.info("SIGHUP: workers reloaded: %s", ", ".join(changes) or "no change")
                for problem in problems:
                    log.error("SIGHUP: %s", problem)
            notifier.ready(f"serving on port {running.data_port}")
