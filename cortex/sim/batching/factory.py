"""Which continuous-batching model runs a simulated engine's ranks, built from its settings.

Pure. ``BatchingSettings`` are a simulated engine's knobs of the batching model, in the
engine-neutral names ``SimEngine`` and ``cortex sim`` use; ``rank_models`` maps them onto a
flavour (keyed by engine family): its ``make`` builds one rank's model from that rank's block
hasher (``SimKVEngine`` calls it per rank, and again at each restart, with the new process's
hasher), its ``max_running`` is the batch limit the engine reports.

* vLLM: ``cortex.sim.batching.vllm`` with ``max_num_batched_tokens``, ``max_num_seqs`` (vLLM's
  defaults where left None), ``block_size``, and ``num_gpu_blocks = capacity_blocks + 1`` (vLLM
  counts the null block: ``capacity_blocks`` blocks hold KV, as in the one-shot cache).
* SGLang: ``cortex.sim.batching.sglang`` with ``chunked_prefill_size = max_num_batched_tokens``
  and ``max_running_requests = max_num_seqs`` (SGLang's defaults where left None), ``page_size
  = block_size`` (the engine's page is its event block) and a pool of ``capacity_blocks``
  pages (``max_total_tokens = capacity_blocks x block_size``).

``default_step_profile()`` is the one place the default step timing comes from (see there).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from cortex.errors import ConfigError
from cortex.ledger.kv_events import EngineFamily
from cortex.sim.batching.core import BatchingEngine
from cortex.sim.engine_hashes import ChainHasher, VllmChainHasher
from cortex.sim.step_profiles import load_step_profile
from cortex.sim.step_time import StepProfile


@dataclass(frozen=True, slots=True)
class RankModels:
    """How to build one rank's model, and what the engine reports of it."""

    make: Callable[[ChainHasher], BatchingEngine]
    max_running: int  # the batch limit (vLLM max_num_seqs)


DEFAULT_STEP_PROFILE = "llama-3.1-8b-h100-vllm"  # cortex/sim/profiles/: every figure cited


@functools.cache
def default_step_profile() -> StepProfile:
    """The step timing a batching engine uses unless given one: Llama-3.1-8B in bf16 on one
    H100 under vLLM (``cortex/sim/profiles/llama-3.1-8b-h100-vllm.toml``, each coefficient
    traced to a published measurement there)."""
    return load_step_profile(DEFAULT_STEP_PROFILE)


@dataclass(frozen=True, slots=True)
class BatchingSettings:
    """How a simulated engine's batching model runs (None: the flavour's default).

    ``max_num_batched_tokens``: the token budget of a step (SGLang: its chunked prefill size);
    ``max_num_seqs``: requests running at once at most (SGLang: max_running_requests);
    ``profile``: the step timing (None: ``default_step_profile()``); ``speedup``: the engine's
    clock runs this many times faster than trio's (a step of ``s`` seconds sleeps
    ``s / speedup``)."""

    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    profile: StepProfile | None = None
    speedup: float = 1.0

    def __post_init__(self) -> None:
        problems = [f"{name} must be >= 1" for name in ("max_num_batched_tokens", "max_num_seqs")
                    if getattr(self, name) is not None and not getattr(self, name) >= 1]
        if not self.speedup > 0:
            problems.append("speedup must be > 0")
        if problems:
            raise ConfigError(problems)

    @property
    def step_profile(self) -> StepProfile:
        return self.profile if self.profile is not None else default_step_profile()


def available(family: EngineFamily) -> bool:
    """Whether a batching model exists for engines of ``family`` (both flavours now)."""
    return family in (EngineFamily.VLLM, EngineFamily.SGLANG)


def rank_models(family: EngineFamily, settings: BatchingSettings, *, capacity_blocks: int,
                block_size: int) -> RankModels:
    """The ranks' models for ``family`` (``ConfigError`` when the settings do not fit it, or
    when the family has no batching model yet)."""
    if family is EngineFamily.VLLM:
        from cortex.sim.batching.vllm import VllmBatchingEngine, VllmSchedulerConfig

        given = {name: value for name, value in (
            ("max_num_batched_tokens", settings.max_num_batched_tokens),
            ("max_num_seqs", settings.max_num_seqs)) if value is not None}
        config = VllmSchedulerConfig(num_gpu_blocks=capacity_blocks + 1, block_size=block_size,
                                     **given)
        profile = settings.step_profile

        def make(hasher: ChainHasher) -> BatchingEngine:
            assert isinstance(hasher, VllmChainHasher)
            return VllmBatchingEngine(config, profile, hasher)

        return RankModels(make, config.max_num_seqs)
    if family is EngineFamily.SGLANG:
        from cortex.sim.batching.sglang import SglangBatchingConfig, SglangBatchingEngine
        from cortex.sim.engine_hashes import SglangChainHasher

        given = {name: value for name, value in (
            ("chunked_prefill_size", settings.max_num_batched_tokens),
            ("max_running_requests", settings.max_num_seqs)) if value is not None}
        sglang = SglangBatchingConfig(max_total_tokens=capacity_blocks * block_size,
                                      page_size=block_size, **given)
        profile = settings.step_profile

        def make_sglang(hasher: ChainHasher) -> BatchingEngine:
            assert isinstance(hasher, SglangChainHasher)
            return SglangBatchingEngine(sglang, profile, hasher)

        return RankModels(make_sglang, sglang.running_cap)
    raise ConfigError([f"no batching model for {family.value} engines"])
