"""The gateway's workers kept in step with the registry: pools, KV-event ingestion, ledger.

``WorkerLifecycle`` listens to the ``WorkerRegistry`` and the ``LedgerBook`` and is the control
plane's ``AdminOps`` (list, add, drain, remove, ledger snapshot); ``cortex.app.run_gateway``
builds one under its nursery. Rules (architecture.md §2, §4):

* a worker added (configured, discovered by DNS, or through the admin API) joins its model's
  pool (one is made for a model without a profile), its DP ranks are registered as ledger
  targets, and its KV-event ingestion (one subscriber per DP rank) starts; it is not live until
  its first good probe, and once live its self-report (model, page size, PD bootstrap port) is
  read once and compared with the profile;
* health or load changes re-read the worker's view at once (``ModelPool.set_figures``);
* a worker found unreachable (a failed probe or connect: unhealthy) has its ledger suspected
  at once (``SourceHandle.suspect``: STALE, not routed on — the engine may have restarted
  without a sign in its event stream yet); when it is live again the ingestion proves the
  engine's stream continued the ledger's (``verify``: a replay from the last applied batch,
  same digest) or drops it and replays history — a quick restart never leaves stale entries;
* a worker whose breaker opens (dead) leaves the live pool first (its view turns unhealthy);
  then its ingestion stops and its ledger entries are dropped (state SYNCING, "worker down"),
  so late events cannot write back; when its breaker closes again, ingestion restarts and
  replays history from sequence 0 (READY if the engine's buffer reaches back, else PARTIAL);
* removal (admin API, or a drained worker whose in-flight count reached 0) takes it out of its
  pool, stops ingestion and unregisters its targets;
* SIGHUP's worker list is applied by ``reload`` (added, drained, or replaced), leaving the
  workers DNS discovery owns to discovery;
* a peer's ledger snapshot (warm start) is fetched before any stream starts and used once per
  stream; ``snapshot`` exports this replica's READY targets for its peers;
* every change an operator asks about is logged once, with its reason: a worker added or
  removed, its health (live, unhealthy, breaker open / half-open / closed, with the last
  error), and each DP rank's ledger state (``SYNCING``/``READY``/``STALE``/``PARTIAL``, with
  the reason the ingestion gave).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from functools import partial

import trio

from cortex.config.tree import CortexConfig
from cortex.control.admin import AdminOps, spec_as_json
from cortex.dispatch.model_pool import ModelPool, WorkerFigures
from cortex.dispatch.worker_report import (
    sglang_server_info,
    vllm_models,
    vllm_report,
)
from cortex.errors import ConfigError, CortexError
from cortex.events.counters import IngestCounters
from cortex.events.source import EventSource, IngestSettings, rank_endpoint
from cortex.events.subscriber import SourceHandle, run_source
from cortex.events.sync import TargetSync
from cortex.ledger.book import LedgerBook
from cortex.ledger.kv_events import EngineFamily
from cortex.ledger.snapshot import (
    ExportedTarget,
    SnapshotError,
    StreamId,
    TargetImage,
    encode,
    take_snapshot,
)
from cortex.ledger.state import TargetState
from cortex.metrics.cortex_metrics import CortexMetrics
from cortex.profile.profile_set import ProfileSet
from cortex.replicas.warm_start import fetch_snapshot
from cortex.upstream.connection_pool import ConnectionPool
from cortex.workers.breaker import BreakerState
from cortex.workers.monitor import Fetch
from cortex.workers.registry import ChangeKind, WorkerRegistry
from cortex.workers.spec import WorkerSpec

log = logging.getLogger("cortex.app")  # the gateway's logger name, as operators filter it

_FAMILIES = {"vllm": EngineFamily.VLLM, "sglang": EngineFamily.SGLANG}


def model_of(spec: WorkerSpec, config: CortexConfig) -> str:
    if spec.model is not None:
        return spec.model
    if len(config.models) == 1:
        return config.models[0].name
    return "default"


class WorkerLifecycle(AdminOps):
    """Keeps pools, ingestion and the ledger in step with the registry (rules at the top)."""

    def __init__(self, config: CortexConfig, registry: WorkerRegistry, book: LedgerBook,
                 pools: dict[str, ModelPool], profiles: ProfileSet, nursery: trio.Nursery,
                 counters: dict[int, IngestCounters], metrics: CortexMetrics,
                 fetch: Fetch, upstream: ConnectionPool) -> None:
        self.config = config
        self.upstream = upstream
        self.profiles = profiles
        self.fetch = fetch
        self.reported: set[str] = set()
        self.registry = registry
        self.book = book
        self.pools = pools
        self.nursery = nursery
        self.counters = counters
        self.metrics = metrics
        self.ingestion: dict[str, trio.CancelScope] = {}
        self.targets: dict[str, tuple[int, ...]] = {}
        self.worker_of_target: dict[int, str] = {}
        self.model: dict[str, str] = {}
        self.discovered: list[set[str]] = []  # per DNS service: the names it added
        self.syncs: dict[int, TargetSync] = {}  # targets whose ingestion runs
        self.sources: dict[int, SourceHandle] = {}  # the same targets' health signals
        self.warm: dict[StreamId, TargetImage] = {}  # a peer's snapshot, used once per stream
        registry.on_change(self.on_change)
        book.on_state_change(self.on_state)

    # AdminOps -----------------------------------------------------------------------------
    def list_workers(self) -> list[dict[str, object]]:
        out = []
        for spec in self.registry.specs():
            status = self.registry.status(spec.name)
            pool = self.pools.get(self.model.get(spec.name, ""))
            out.append({**spec_as_json(spec), "live": status.live, "healthy": status.healthy,
                        "breaker": status.breaker.value, "draining": status.draining,
                        "last_error": status.last_error,
                        "in_flight": pool.pending.in_flight(spec.name) if pool else 0})
        return out

    def add(self, spec: WorkerSpec) -> None:
        """Register a worker; if joining its pool and ledger fails, nothing of it is left."""
        try:
            self.registry.add(spec)
        except CortexError:
            if spec.name in self.registry and spec.name not in self.targets:
                self.registry.remove(spec.name)  # (``_removed`` releases what was taken)
            raise

    def drain(self, name: str) -> None:
        pool = self.pools.get(self.model.get(name, ""))
        self.registry.drain(name, pool.pending.in_flight(name) if pool else 0)

    def remove(self, name: str) -> None:
        self.registry.remove(name)

    # registry and ledger listeners --------------------------------------------------------
    def on_change(self, kind: ChangeKind, name: str) -> None:
        if kind == "added":
            log.info("worker %s added (%s)", name, self.registry.spec(name).url)
            self._added(self.registry.spec(name))
        elif kind == "removed":
            log.info("worker %s removed", name)
            self._removed(name)
        elif kind == "restarted":
            log.warning("worker %s: %s; its ledger is proven again or dropped", name,
                        self.registry.status(name).last_error)
            for target in self.targets.get(name, ()):
                source = self.sources.get(target)
                if source is not None:
                    source.suspect("engine restarted")
                    source.verify()
        else:
            if kind == "health":
                self._log_health(name)
            self._figures(name)

    def _log_health(self, name: str) -> None:
        status = self.registry.status(name)
        if status.live:
            log.info("worker %s is live", name)
        else:
            log.warning("worker %s is not live: %s, breaker %s; last error: %s", name,
                        "healthy" if status.healthy else "unhealthy", status.breaker.value,
                        status.last_error)

    def on_state(self, target: int, state: TargetState) -> None:
        name = self.worker_of_target.get(target)
        if name is not None:
            info = self.book.info(target)
            level = logging.INFO if state in (TargetState.READY, TargetState.SYNCING) \
                else logging.WARNING
            log.log(level, "worker %s rank %d ledger %s: %s", name, info.rank, state.value,
                    self.book.reason(target) or "-")
        pool = self.pools.get(self.model.get(name or "", ""))
        if name is not None and pool is not None:
            pool.refresh(name)

    def _added(self, spec: WorkerSpec) -> None:
        model = model_of(spec, self.config)
        pool = self.pools.get(model)
        if pool is None:
            pool = self.pools[model] = ModelPool(model, self.book, profiles=self.profiles,
                                                 settings=self.config.pool_settings(model))
        self.model[spec.name] = model
        targets: tuple[int, ...] = ()
        if spec.events is not None and not pool.passthrough:
            targets = self._register_targets(spec, model)
            for target in targets:
                self.worker_of_target[target] = spec.name
                self.counters.setdefault(target, IngestCounters())
        self.targets[spec.name] = targets
        pool.set_worker(spec, targets)
        self._figures(spec.name)  # not live until its first good probe
        self._start_ingestion(spec)

    def _register_targets(self, spec: WorkerSpec, model: str) -> tuple[int, ...]:
        """One ledger target per DP rank, all or none (``ConfigError`` when they run out)."""
        family = _FAMILIES[spec.engine]
        targets: list[int] = []
        try:
            for rank in range(spec.dp_size):
                targets.append(self.book.register(spec.name, rank, family, model))
        except CortexError as error:
            for target in targets:
                self.book.unregister(target)
            self.model.pop(spec.name, None)
            raise ConfigError([f"worker {spec.name}: dp_size {spec.dp_size}: {error}"]) from None
        return tuple(targets)

    async def _check_report(self, spec: WorkerSpec, pool: ModelPool) -> None:
        """Read what the worker says about itself: model, page size and prefix caching
        (compared with the profile), and a PD prefill's bootstrap port."""
        timeout = self.config.health.timeout_s
        try:
            if spec.engine == "sglang":
                status, body = await self.fetch(spec.origin, "/server_info", timeout)
                report = sglang_server_info(body if status == 200 else b"")
            else:
                status, body = await self.fetch(spec.origin, "/v1/models", timeout)
                models = vllm_models(body) if status == 200 else ()
                status, body = await self.fetch(spec.origin, "/metrics", timeout)
                text = body.decode(errors="replace") if status == 200 else ""
                report = vllm_report(models, text)
        except (OSError, CortexError, trio.TooSlowError) as error:
            log.warning("worker %s: could not read its own report: %s", spec.name, error)
            self.reported.discard(spec.name)  # asked again when it is next seen live
            return
        if spec.name not in pool.workers:
            return
        pool.set_report(spec.name, report)
        if report.kv_tokens is not None:
            log.info("worker %s: KV pool of %d tokens per engine (the cost's KV-pressure term)",
                     spec.name, report.kv_tokens)
        if pool.profile is None:
            return
        reason = pool.note_report(spec.name, report.model_for(pool.model), report.block_size,
                                  report.prefix_caching,
                                  _FAMILIES[spec.engine] is EngineFamily.SGLANG)
        if reason is not None:
            log.warning("worker %s disagrees with the profile of %s: %s; exact routing off",
                        spec.name, pool.model, reason)

    def _removed(self, name: str) -> None:
        self.reported.discard(name)
        pool = self.pools.get(self.model.pop(name, ""))
        if pool is not None:
            pool.remove_worker(name)
        self._stop_ingestion(name)
        for target in self.targets.pop(name, ()):
            self.worker_of_target.pop(target, None)
            self.counters.pop(target, None)
            self.book.unregister(target)
        self.metrics.forget_worker(name)

    def _figures(self, name: str) -> None:
        if name not in self.registry:
            return
        status = self.registry.status(name)
        pool = self.pools.get(self.model.get(name, ""))
        if pool is None:
            return
        loads = status.loads.values()
        queue = sum(load.waiting for load in loads) if loads else None
        usages = [load.kv_usage for load in loads if load.kv_usage is not None]
        pool.set_figures(name, WorkerFigures(status.live, queue, max(usages, default=None)))
        if status.live and name not in self.reported and not pool.passthrough:
            self.reported.add(name)
            self.nursery.start_soon(self._check_report, self.registry.spec(name), pool)
        dead = status.breaker is BreakerState.OPEN
        for target in self.targets.get(name, ()):
            source = self.sources.get(target)
            if source is None:
                continue
            if not status.healthy:
                source.suspect(f"worker unreachable ({status.last_error})")
            elif status.breaker is BreakerState.CLOSED:
                source.verify()
        if dead and name in self.ingestion:
            self._stop_ingestion(name)  # after the view turned unhealthy: leave the pool first
            for target in self.targets.get(name, ()):
                self.book.drop_target_entries(target)
                self.book.set_state(target, TargetState.SYNCING, "worker down")
        elif not dead and name not in self.ingestion:
            self._start_ingestion(self.registry.spec(name))

    def _start_ingestion(self, spec: WorkerSpec) -> None:
        targets = self.targets.get(spec.name, ())
        if not targets or spec.events is None or spec.name in self.ingestion:
            return  # (``_added`` reaches here twice: through ``_figures``, then directly)
        scope = self.ingestion[spec.name] = trio.CancelScope()
        family = _FAMILIES[spec.engine]
        model = self.model[spec.name]
        sources = [EventSource(spec.name, rank, family, model, rank_endpoint(spec.events, rank),
                               None if spec.replay is None else rank_endpoint(spec.replay, rank),
                               spec.topic.encode())
                   for rank in range(spec.dp_size)]
        self.nursery.start_soon(self._ingest, scope, sources, targets, self.config.ingest)

    async def _ingest(self, scope: trio.CancelScope, sources: list[EventSource],
                      targets: tuple[int, ...], settings: IngestSettings) -> None:
        with scope:
            async with trio.open_nursery() as nursery:
                for source, target in zip(sources, targets, strict=True):
                    warm = self.warm.pop(self.stream_of(target), None)
                    handle = await nursery.start(partial(
                        run_source, source, target, self.book, settings=settings,
                        counters=self.counters[target], warm=warm))
                    self.sources[target], self.syncs[target] = handle, handle.sync

    def _stop_ingestion(self, name: str) -> None:
        scope = self.ingestion.pop(name, None)
        if scope is not None:
            scope.cancel()
        for target in self.targets.get(name, ()):
            self.syncs.pop(target, None)
            self.sources.pop(target, None)

    # ledger snapshot (warm start of a peer) ---------------------------------------------------
    def stream_of(self, target: int) -> StreamId:
        """The target's event stream, named as any replica names it (``cortex.ledger.snapshot``)."""
        info = self.book.info(target)
        spec = self.registry.spec(info.worker)
        events = "" if spec.events is None else rank_endpoint(spec.events, info.rank)
        return StreamId(spec.url, info.rank, spec.engine, info.model, events, spec.topic)

    def snapshot(self) -> bytes:
        """``GET /admin/ledger/snapshot``: every READY target's ledger with its resume point,
        taken synchronously (no checkpoint: consistent with the sync machines)."""
        started = time.perf_counter()
        exported = []
        for target, name in sorted(self.worker_of_target.items()):
            sync = self.syncs.get(target)
            state = self.book.state(target)
            point = sync.resume_point if sync is not None and state is TargetState.READY else None
            exported.append(ExportedTarget(
                self.stream_of(target), name, state.value, point,
                self.book.export_target(target) if point is not None else None))
        snapshot = take_snapshot(exported)
        body = encode(snapshot)
        log.info("ledger snapshot: %d targets (%d entries), %d skipped, %d bytes in %.1f ms",
                 len(snapshot.targets), sum(t.entries for t in snapshot.targets),
                 len(snapshot.skipped), len(body), 1e3 * (time.perf_counter() - started))
        return body

    async def load_warm_start(self) -> None:
        """Fetch the peer's snapshot (``ledger.warm_start_url``) for the streams about to
        start; a failure is logged, counted (``book.warm_start_failures``) and ignored."""
        try:
            snapshot = await fetch_snapshot(self.config.ledger, self.upstream)
        except SnapshotError as error:
            self.book.warm_start_failures += 1
            log.warning("warm start: no usable snapshot, replaying from 0: %s", error)
            return
        self.warm = snapshot.by_stream()
        log.info("warm start: peer snapshot of %d streams (%d skipped by the peer)",
                 len(snapshot.targets), len(snapshot.skipped))

    # reload (SIGHUP) ------------------------------------------------------------------------
    def reload(self, specs: Sequence[WorkerSpec]) -> tuple[list[str], list[str]]:
        """Make the registry's workers ``specs`` without touching client connections: a new
        name is added; a name no longer listed is drained (it leaves after its last request,
        at once if its url is taken by a new entry); a changed spec (url, weight, events, ...)
        is replaced — removed and added again, so it is live after its next good probe and its
        ledger re-syncs by replay. A listed worker that was draining is taken back (replaced).
        Returns (what changed, problems); a problem skips that one worker only."""
        wanted = {spec.name: spec for spec in specs}
        origins = {spec.origin for spec in specs}
        changes: list[str] = []
        problems: list[str] = []
        for spec in self.registry.specs():
            if any(spec.name in owned for owned in self.discovered):
                continue  # DNS discovery's own
            new = wanted.get(spec.name)
            if new is None and spec.origin in origins:
                self.remove(spec.name)
                changes.append(f"removed {spec.name} (its url is listed under another name)")
            elif new is None:
                if not self.registry.status(spec.name).draining:
                    self.drain(spec.name)
                    changes.append(f"draining {spec.name}")
            elif new != spec or self.registry.status(spec.name).draining:
                self.remove(spec.name)
                changes.append(f"replaced {spec.name}")
        for name, spec in wanted.items():
            if name not in self.registry:
                try:
                    self.registry.add(spec)
                except ConfigError as error:
                    problems += error.problems
                else:
                    if f"replaced {name}" not in changes:
                        changes.append(f"added {name}")
        return changes, problems

    async def report_in_flight(self) -> None:
        """Drained workers leave once their last request finished (checked twice a second)."""
        while True:
            await trio.sleep(0.5)
            for spec in self.registry.specs():
                if self.registry.status(spec.name).draining:
                    pool = self.pools.get(self.model.get(spec.name, ""))
                    self.registry.report_in_flight(
                        spec.name, pool.pending.in_flight(spec.name) if pool else 0)
