"""One served model's routing state: its workers, their pending work, its scheduler and profile.

Rules:

* A pool routes for one model name; the ledger registers that model's targets under the same
  name, so the request's namespace (``request_block_keys(..., model)``) equals the ledger's.
* The views the scheduler reads are kept current incrementally (``PendingWork.track``) when a
  worker's health, load or ledger state changes (``refresh``), never rebuilt per decision.
* ``exact_off`` (the profile set's reason: profile missing or not loaded, or a worker whose own
  report disagrees with it) turns exact routing off for the whole model: the prompt is not
  tokenized and every worker's ledger counts as unknown, so the chain falls to load-based
  policies — never a guessed hit. A ``passthrough`` pool (another component schedules it) always
  goes round robin over its live workers with Cortex's own KV decisions off.
* ``route_on_partial``: a worker whose ledger is PARTIAL (true but incomplete: history lost
  beyond repair) is routed on as if READY — its hits are real, it may miss some. Off by
  default; readiness still reports the PARTIAL state (``ledger_state``).
* DP ranks are trusted one by one: a worker with some ranks READY is routed exactly on those
  (its view is READY, the matches of its untrusted ranks are left out and a DP rank is only
  ever picked among the trusted ones); one PARTIAL or STALE rank no longer turns exact routing
  off for the others. Readiness still reports the least trusted rank (``ledger_state``).
* ``policy`` other than ``"cortex"`` routes without the ledger (comparison baselines). A
  policy *object* (``use_policy``: the benchmarks' reference routers, ``perf/``) is given the
  ledger's matches as ``"cortex"`` is and decides alone (round robin only where it declines),
  so a comparison run through the same gateway differs from Cortex in the scoring alone.
* ``prepare`` turns a request into what deciding needs, once per request: its prompt, token
  ids and block keys (``ServeRequest``), and the workers that cannot serve its endpoint.
  ``decide`` returns a ``Route`` whose ``hold`` (in-flight accounting) the caller enters for
  the life of the upstream exchange; ``exclude`` names workers left out (those, then the ones
  that already failed this request: retries before the first byte). Only the pool changes its
  worker map (``workers`` is a read-only view of it).
* DP rank: the rank of the picked worker holding the longest hit; ``None`` (engine chooses)
  without a hit.
* ``WorkerSpec.weight`` is the worker's relative prefill capacity: without a measured rate its
  view's ``prefill_tokens_per_s`` is ``weight × scheduler.cost.default_prefill_tokens_per_s``
  (weight 1 leaves it unset, the cost's default), so a weight-2 worker's queue costs half as
  many seconds and the cost-based policies (exact_kv, load_aware, p2c) send it about twice the
  work. Round robin, consistent hashing and the bounded-load cap (a count of requests) ignore
  weights.
"""

from __future__ import annotations

import logging
import random
import time
from array import array
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from time import perf_counter
from types import MappingProxyType
from typing import Any, Literal

import msgspec

from cortex.dispatch.endpoints import ENGINES, EXACT_FOR, SERVED_BY, Endpoint, request_prompt
from cortex.dispatch.observer import RouteObserver
from cortex.dispatch.request import ServeRequest
from cortex.dispatch.route import Route
from cortex.dispatch.settings import PoolSettings
from cortex.dispatch.worker_report import WorkerReport
from cortex.errors import BadRequest, NotFound
from cortex.ledger.book import LedgerBook
from cortex.ledger.kv_events import EngineFamily
from cortex.ledger.state import TargetState
from cortex.profile.profile_set import ProfileSet
from cortex.profile.request_keys import request_block_keys, reusable_tokens
from cortex.profile.trio_tokenize import encode_offloaded
from cortex.prompt.request_text import RequestPrompt
from cortex.prompt.unrenderable import Unrenderable
from cortex.scheduling import (
    CostConfig,
    Decision,
    FastScheduler,
    PendingWork,
    RequestFacts,
    Role,
    Scheduler,
    WorkerView,
    worker_matches,
)
from cortex.scheduling.chain import no_events_chain
from cortex.scheduling.p2c import PowerOfTwo
from cortex.scheduling.policy import Policy
from cortex.scheduling.round_robin import RoundRobin
from cortex.tokenize.segment_cache import Lookup
from cortex.workers.spec import WorkerSpec

log = logging.getLogger("cortex.gateway")

# Trust order of ledger states: a worker is as trusted as its least trusted DP rank.
_DISTRUST = {TargetState.READY: 0, TargetState.SYNCING: 1, TargetState.STALE: 2,
             TargetState.PARTIAL: 3}
_FAMILIES = {"vllm": EngineFamily.VLLM, "sglang": EngineFamily.SGLANG}


@dataclass(frozen=True, slots=True)
class WorkerFigures:
    """What the registry knows about a worker right now (health and engine-reported load)."""

    healthy: bool = True
    engine_queue: int | None = None
    kv_usage: float | None = None
    prefill_tokens_per_s: float | None = None


_NO_KEYS = array("Q")

# "cortex": the events chain on the ledger (exact_kv → load_aware → p2c → round_robin). The
# others route without the ledger, for comparisons (benchmarks, the demo) and for engines that
# publish no events: round robin, power of two choices, consistent hashing with bounded loads.
PoolPolicy = Literal["cortex", "round_robin", "p2c", "consistent_hash"]


class ModelPool:
    def __init__(
        self,
        model: str,
        book: LedgerBook,
        *,
        profiles: ProfileSet,
        settings: PoolSettings = PoolSettings(),
        passthrough: bool = False,
        policy: PoolPolicy | Policy = "cortex",
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.model = model
        self._book = book
        self._profiles = profiles
        self.profile = profiles.profile(model)
        self.passthrough = passthrough
        self._route_on_partial = settings.route_on_partial
        self.max_prompt_chars = settings.max_prompt_chars  # longer: not tokenized (0: any)
        self._clock = clock
        self.tokenizer = (None if self.profile is None or passthrough
                          else self.profile.new_cached_tokenizer(settings.segment_cache_bytes,
                                                                 settings.prompt_reuse_bytes))
        for note in [] if self.tokenizer is None else self.profile.tokenization_notes():
            log.info("model %s: %s (slower, still exact)", model, note)
        if self.profile is not None and self.profile.chat_templates is not None:
            self.profile.chat_templates.use_render_cache(settings.render_cache_bytes, model)
        self.pending = PendingWork()
        self._workers: dict[str, WorkerSpec] = {}
        self.workers: Mapping[str, WorkerSpec] = MappingProxyType(self._workers)  # read-only
        self._families: tuple[EngineFamily, ...] = ()  # of the workers (``_membership_changed``)
        self.chat_engine = "vllm"  # whose chat rendering the pool reproduces (same)
        self.targets: dict[str, tuple[int, ...]] = {}
        self._untrusted: dict[str, frozenset[int]] = {}  # worker -> ranks not routed exactly
        self._untrusted_any: frozenset[int] = frozenset()  # all of them (per-request filter)
        self._figures: dict[str, WorkerFigures] = {}
        self._capacity_listeners: list[Callable[[str], None]] = []
        self._reports: dict[str, WorkerReport] = {}  # what each worker said about itself
        rng = rng or random.Random()
        cost, watermarks = settings.cost, settings.watermarks
        self.default_prefill_tokens_per_s = (cost or CostConfig()).default_prefill_tokens_per_s
        self._scheduler = FastScheduler(rng, cost, watermarks, settings.bounds)
        self._rng, self._cost, self._watermarks = rng, cost, watermarks
        self.policy = "cortex"  # the name of the policy routing (use_policy)
        self._fixed: Scheduler | None = None  # None: the events chain (``scheduler``)
        self._reads_ledger = True  # whether the policy is given the ledger's matches
        self.use_policy(policy)

    def use_policy(self, policy: PoolPolicy | Policy) -> None:
        """Route with ``policy`` from the next decision on: one of ``PoolPolicy``'s names, or
        a policy object compared against Cortex's (reference routers of benchmarks), which is
        given the ledger's matches as ``"cortex"`` is, within the same watermarks, and decides
        alone: round robin only where it declines. A passthrough pool stays round robin."""
        if self.passthrough:
            policy = "round_robin"
        if not isinstance(policy, str):
            self.policy = policy.name
            self._fixed = Scheduler((policy, RoundRobin()), self._watermarks)
            self._reads_ledger = True
            return
        marks = self._watermarks
        self.policy = policy
        self._reads_ledger = policy == "cortex"
        if policy == "cortex":
            self._fixed = None
        elif policy == "round_robin":
            self._fixed = Scheduler((RoundRobin(),), marks)
        elif policy == "p2c":
            self._fixed = Scheduler((PowerOfTwo(self._rng, self._cost), RoundRobin()), marks)
        elif policy == "consistent_hash":
            self._fixed = Scheduler(no_events_chain(), marks)
        else:
            raise ValueError(f"unknown pool policy {policy!r}")

    @property
    def exact_off(self) -> str | None:
        """Why exact routing is off for this model (``None``: on)."""
        return self._profiles.exact_routing_off(self.model)

    def note_report(self, name: str, model: str | None, block_size: int | None,
                    prefix_caching: bool | None = None, sglang: bool = False) -> str | None:
        """Record what worker ``name`` says it serves; a disagreement with the profile turns
        exact routing off for the model (visible reason) until the worker agrees again.
        ``sglang``: the worker is an SGLang engine (its one-token pages may be folded)."""
        before = self.exact_off
        reason = self._profiles.note_worker(self.model, name, model, block_size, prefix_caching,
                                           sglang and self._book.folds_pages(self.model))
        if self.exact_off != before:
            self._refresh_all()
        return reason

    # ------------------------------------------------------------------ membership

    def set_worker(self, spec: WorkerSpec, targets: tuple[int, ...] = ()) -> None:
        self._workers[spec.name] = spec
        self.targets[spec.name] = targets
        self._membership_changed()
        self.refresh(spec.name)

    def bootstrap_port(self, spec: WorkerSpec) -> int | None:
        """A PD prefill worker's bootstrap port: as registered, else as it reported it."""
        if spec.bootstrap_port is not None:
            return spec.bootstrap_port
        report = self._reports.get(spec.name)
        return None if report is None else report.bootstrap_port

    def set_report(self, name: str, report: WorkerReport) -> None:
        """What the worker said about itself; may make it pairable (capacity listeners)."""
        if name in self.workers:
            self._reports[name] = report
            self.refresh(name)  # its KV pool size is in its view
            for listener in self._capacity_listeners:
                listener(name)

    def awaiting_report(self, spec: WorkerSpec) -> bool:
        """An SGLang prefill worker registered without a bootstrap port is not paired before
        its own report (``/server_info``) says which port it uses."""
        return (spec.engine == "sglang" and spec.role is Role.PREFILL
                and spec.bootstrap_port is None and spec.name not in self._reports)

    def remove_worker(self, name: str) -> None:
        self._reports.pop(name, None)
        self._profiles.forget_worker(self.model, name)
        self._workers.pop(name, None)
        self._membership_changed()
        self.targets.pop(name, None)
        if self._untrusted.pop(name, None) is not None:
            self._untrusted_any = frozenset().union(*self._untrusted.values())
        self._figures.pop(name, None)
        self.pending.untrack(name)

    def set_figures(self, name: str, figures: WorkerFigures) -> None:
        if name in self.workers:
            self._figures[name] = figures
            self.refresh(name)
            for listener in self._capacity_listeners:
                listener(name)

    def on_capacity(self, listener: Callable[[str], None]) -> None:
        """``listener(worker)`` after pending work left a worker or its figures changed."""
        self._capacity_listeners.append(listener)
        self.pending.on_release(listener)

    def refresh(self, name: str) -> None:
        """Re-read the worker's health, load and ledger state into its view."""
        spec = self.workers.get(name)
        if spec is None:
            return
        figures = self._figures.get(name, WorkerFigures())
        state = self._routing_state(name)
        rate = figures.prefill_tokens_per_s
        if rate is None and spec.weight != 1.0:
            rate = spec.weight * self.default_prefill_tokens_per_s
        report = self._reports.get(name)
        self.pending.track(WorkerView(
            spec.name, self.targets.get(name, ()), figures.healthy, state,
            spec.role, 0, 0, figures.engine_queue, figures.kv_usage, rate,
            None if report is None else report.kv_tokens))

    def _refresh_all(self) -> None:
        for name in self.workers:
            self.refresh(name)

    def ledger_state(self, name: str) -> TargetState | None:
        """The least trusted state of the worker's ranks; ``None`` = no usable ledger."""
        targets = self.targets.get(name)
        if not targets or self.exact_off is not None or self.passthrough:
            return None
        states = [self._book.state(target) for target in targets]
        return max(states, key=_DISTRUST.__getitem__)

    def _routing_state(self, name: str) -> TargetState | None:
        """The state the worker is routed by: READY when some rank is trusted (the others are
        left out of its matches), else its least trusted rank's. Keeps ``_untrusted``."""
        targets = self.targets.get(name, ())
        state = self.ledger_state(name)
        untrusted = frozenset()
        if state is not None and len(targets) > 1 and not self._trusted(state):
            untrusted = frozenset(t for t in targets if not self._trusted(self._book.state(t)))
            if len(untrusted) < len(targets):
                state = TargetState.READY
            else:
                untrusted = frozenset()
        if untrusted != self._untrusted.get(name, frozenset()):
            if untrusted:
                self._untrusted[name] = untrusted
            else:
                self._untrusted.pop(name, None)
            self._untrusted_any = frozenset().union(*self._untrusted.values())
        if state is TargetState.PARTIAL and self._route_on_partial:
            state = TargetState.READY  # a lower bound: misses possible, never a false hit
        return state

    def _trusted(self, state: TargetState) -> bool:
        return state is TargetState.READY or (state is TargetState.PARTIAL
                                              and self._route_on_partial)

    def views(self) -> tuple[WorkerView, ...]:
        return self.pending.views()

    # ------------------------------------------------------------------ deciding

    async def prepare(self, request: ServeRequest, observer: RouteObserver) -> None:
        """Fill ``request``'s prompt, token ids and block keys (and the time they took) when
        the pool routes it exactly; leave them ``None`` to route it on load alone, counting
        why with ``observer`` (a prompt Cortex cannot render as the engine will, a template
        that fails, a prompt over ``max_prompt_chars``). A client's malformed request raises
        ``BadRequest``. A long new text is encoded off the trio thread. The workers whose
        engine does not serve the endpoint are excluded (``not_serving``: 404 when none
        does)."""
        request.excluded.extend(self.not_serving(request.endpoint))
        tokenizer = self.tokenizer
        profile = self.profile
        if tokenizer is None or profile is None or self.exact_off is not None:
            return
        endpoint = request.endpoint
        prompt = None
        try:
            if endpoint in EXACT_FOR:
                self._check_exact_for(endpoint)
            prompt = request_prompt(endpoint, request.body, profile.chat_templates,
                                    self.chat_engine)
        except Unrenderable as why:  # not exactly as the engine will: route on load only
            observer.unrenderable(self.model, why.reason)
            log.debug("routed by load: %s", why)
        except BadRequest:
            raise
        except Exception as error:  # noqa: BLE001 (counted) a template that cannot render: route on load only
            observer.template_failed(self.model, error)
        if prompt is None:
            return
        if prompt.text is not None and 0 < self.max_prompt_chars < len(prompt.text):
            observer.prompt_too_long(self.model, len(prompt.text))
            return  # too costly to tokenize: routed by load, never a guess
        waited = False  # whether the text was encoded off the trio thread
        if prompt.token_ids is not None:
            token_ids = prompt.token_ids
        else:
            tokenize_start = perf_counter()
            token_ids = tokenizer.encode_now(prompt.text or "", prompt.add_special_tokens,
                                             tokenizer.offload_min_chars)
            if type(token_ids) is Lookup:  # a long new text: off the trio thread
                token_ids = await encode_offloaded(tokenizer, token_ids)
                waited = True
            request.timings["tokenize_s"] = perf_counter() - tokenize_start
        request.prompt = prompt
        request.token_ids = token_ids
        if waited and self.exact_off is not None:  # turned off while the text was encoded
            return
        clock = self._clock
        start = clock()
        request.keys = self._keys_for(token_ids, prompt)
        request.timings["hash_s"] = clock() - start

    def _check_exact_for(self, endpoint: Endpoint) -> None:
        """``Unrenderable`` when a worker renders ``endpoint``'s requests its own way
        (``EXACT_FOR``): no one prediction holds for every worker."""
        engines = EXACT_FOR[endpoint]
        for spec in self._workers.values():
            if spec.engine not in engines:
                raise Unrenderable("engine_rendering", f"{spec.engine} worker in the pool")

    def not_serving(self, endpoint: Endpoint) -> tuple[str, ...]:
        """The workers whose engine does not serve ``endpoint`` (``SERVED_BY``); a clear 404
        when none does."""
        engines = SERVED_BY[endpoint]
        if engines is ENGINES:  # chat, completions: every worker (no scan on the hot path)
            return ()
        workers = self._workers
        unable = tuple(name for name, spec in workers.items() if spec.engine not in engines)
        if unable and len(unable) == len(workers):
            kinds = " or ".join(sorted(engines))
            raise NotFound(f"POST {endpoint.value} is served by {kinds} engines only, and no "
                           f"worker of model {self.model!r} is one; use /v1/completions")
        return unable

    def _keys_for(self, token_ids: Any, prompt: RequestPrompt) -> Any:
        """The keys of the blocks an engine could serve this prompt from its cache."""
        assert self.profile is not None
        return request_block_keys(token_ids, self.profile.block_size, self.model,
                                  prompt.lora_name, prompt.cache_salt,
                                  reusable_tokens(len(token_ids), prompt.cache_limit))

    def decide(
        self,
        token_ids: Any | None,
        prompt: RequestPrompt | None,
        exclude: Collection[str] = (),
        role: Role = Role.BOTH,
        keys: Any = None,
    ) -> Route:
        """Pick a worker for a prompt already tokenized (``token_ids``) or not (``None``);
        ``keys``: its block keys when already computed (``prepare``)."""
        clock = self._clock
        timings: dict[str, float] = {}
        views = self.pending.views()
        if exclude:
            views = tuple(view for view in views if view.worker not in exclude)
        if self.passthrough:
            assert self._fixed is not None
            decision = self._fixed.decide(RequestFacts(_NO_KEYS, 0, 1), views, {}, role)
            return self._route(decision, None, None, 0, timings)
        target_blocks: dict[int, int] = {}
        raised: Mapping[int, int] | None = None  # in-flight credit: target -> its ledger depth
        token_count = 0
        block_size = self.profile.block_size if self.profile is not None else 1
        given, keys = keys, _NO_KEYS
        if token_ids is not None and prompt is not None and self.exact_off is None:
            keys = given
            if keys is None:
                start = clock()
                keys = self._keys_for(token_ids, prompt)
                timings["hash_s"] = clock() - start
            token_count = len(token_ids)
            if self._reads_ledger:
                target_blocks = self._match(keys, block_size)
                if self._fixed is None and len(self.pending.prefixes):
                    raised = self._credit_inflight(keys, target_blocks)
                if self._untrusted_any:  # some worker's other DP ranks are trusted: drop these
                    untrusted = self._untrusted_any
                    target_blocks = {t: b for t, b in target_blocks.items()
                                     if t not in untrusted}
        request = RequestFacts(keys, token_count, block_size)
        if self._fixed is None:
            decision = self._scheduler.decide(request, views, target_blocks, role)
        elif self._reads_ledger:  # a compared policy object: the same matches as "cortex"
            decision = self._fixed.decide(request, views, worker_matches(target_blocks, views),
                                         role)
        else:  # a named comparison policy: no ledger
            decision = self._fixed.decide(request, views, {}, role)
        return self._route(decision, target_blocks, token_ids, token_count, timings,
                           keys if self._fixed is None else None, raised)

    def _credit_inflight(self, keys: Any, target_blocks: dict[int, int]) -> Mapping[int, int]:
        """Raise each target's match to the prompt blocks requests in flight there carry
        (``scheduling.inflight_prefixes``): what the engine will hold by the time it schedules
        this request, before its events have told the ledger. Cortex's own chain only: the
        compared policies get the ledger's matches, as their peers' indexers would.

        Routing counts all of it; the prediction only what is certain (``_certain_prediction``):
        the blocks of requests past their first token there. Before it a request may not have
        reached the engine (two decided microseconds apart can arrive in the other order),
        its attempt may fail, and SGLang shares nothing within a prefill batch. Still wrong
        when a holder is preempted (its blocks may be gone). Returns the targets raised, each
        with its ledger depth."""
        return self.pending.prefixes.extend(keys, target_blocks)

    def _certain_prediction(self, decision: Decision, target: int, ledger: int,
                            keys: Any) -> Decision:
        """The decision with its prediction capped at what the ledger and the certain part of
        the in-flight credit give ``target`` (``PendingWork.certain``); routing used all of it."""
        certain = {target: ledger}
        self.pending.certain.extend(keys, certain)
        predicted = min(decision.predicted_cached_tokens,
                        certain[target] * self.profile.block_size)
        if predicted == decision.predicted_cached_tokens:
            return decision
        return msgspec.structs.replace(decision, predicted_cached_tokens=predicted)

    def holders(self, token_ids: Any, prompt: RequestPrompt) -> dict[str, int]:
        """Worker -> leading blocks of this prompt (those an engine could serve cached) the
        ledger credits it with, any state; for operators' and tests' questions, not routing."""
        if self.profile is None:
            return {}
        found = self._match(self._keys_for(token_ids, prompt), self.profile.block_size)
        held: dict[str, int] = {}
        for target, blocks in found.items():  # a worker holds what its best DP rank holds
            worker = self._book.info(target).worker
            held[worker] = max(held.get(worker, 0), blocks)
        return held

    def _match(self, keys: Any, block_size: int) -> dict[int, int]:
        families = self._families
        if len(families) == 1:
            return self._book.match(families[0], self.model, block_size, keys)
        found: dict[int, int] = {}
        for family in families:
            found.update(self._book.match(family, self.model, block_size, keys))
        return found

    def _membership_changed(self) -> None:
        """The engine families whose ledgers ``_match`` asks, in engine-name order, and whose
        chat rendering to reproduce: SGLang's when every worker is SGLang, else vLLM's (a
        mixed pool's SGLang workers then miss on chats whose rendering differs)."""
        engines = sorted({spec.engine for spec in self.workers.values()})
        self._families = tuple(_FAMILIES[engine] for engine in engines)
        self.chat_engine = "sglang" if engines == ["sglang"] else "vllm"

    def _route(
        self,
        decision: Decision,
        target_blocks: dict[int, int] | None,
        token_ids: Any | None,
        token_count: int,
        timings: dict[str, float],
        keys: Any = None,
        raised: Mapping[int, int] | None = None,
    ) -> Route:
        spec = self._workers[decision.worker]
        rank = None
        targets = self.targets.get(spec.name, ())
        if target_blocks and len(targets) > 1:
            best = max(range(len(targets)), key=lambda r: (target_blocks.get(targets[r], 0), -r))
            if target_blocks.get(targets[best], 0):
                rank = best
        prefix = None
        uncached = max(token_count - decision.predicted_cached_tokens, 0)  # routing's estimate
        if target_blocks is not None and keys is not None and len(keys) and targets:
            # the blocks this request will leave on its target, for the next ones (a worker of
            # several DP ranks whose rank the engine picks: no target to credit)
            target = targets[rank] if rank is not None else (
                targets[0] if len(targets) == 1 else None)
            if target is not None:
                prefix = (target, keys, target_blocks.get(target, 0))
        if prefix is not None and raised and prefix[0] in raised:
            # routed on blocks still in flight there: predicted only what is certain of them
            decision = self._certain_prediction(decision, prefix[0], raised[prefix[0]], keys)
        hold = self.pending.hold(spec.name, uncached, prefix)
        return Route(decision, spec, rank, hold,
                     None if token_ids is None else token_count, timings)
