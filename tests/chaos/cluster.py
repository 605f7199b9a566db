"""The chaos tests' cluster: ``tests.gateway_cluster``'s harness (engines that can be killed
and revived on the same ports, ``kill``/``revive``/``compare``) with four engines that evict,
seeded engines, short upstream deadlines and fast health probes.

``async with chaos_cluster(flavors, seed=...) as cluster`` returns once every worker is live and
every ledger READY (listeners, not timers).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from cortex.config.tree import (
    HealthConfig,
    ServerConfig,
    UpstreamConfig,
)
from cortex.front.limits import ServerLimits
from cortex.sim.serving import TimingConfig
from cortex.upstream.limits import PoolLimits
from tests.gateway_cluster import Cluster, gateway_cluster, model_config

CHAOS_TIMING = TimingConfig(prefill_tokens_per_s=400_000, decode_s_per_token=0.002,
                            max_running=32)
# Short upstream deadlines, so a hung engine costs a request ~3 s before it moves on; not
# shorter: on a shared 2-vCPU machine the event loop of this one process (gateway, four
# engines and twenty clients) can lag by a few hundred ms, and a deadline that the lag alone
# can pass would turn a healthy worker into a failed attempt.
CHAOS_UPSTREAM = UpstreamConfig(
    limits=PoolLimits(connect_timeout_s=2.0, head_timeout_s=3.0, read_timeout_s=5.0),
    retries_before_first_byte=3)
CHAOS_HEALTH = HealthConfig(interval_s=0.2, timeout_s=2.0, failures_to_open=2, open_s=0.3,
                            load_interval_s=0.3)


ChaosCluster = Cluster


@asynccontextmanager
async def chaos_cluster(
    flavors: Sequence[str] = ("vllm-0.33", "sglang-0.5.23", "vllm-0.33", "sglang-0.5.23"),
    *,
    seed: int = 0,
    timing: TimingConfig = CHAOS_TIMING,
    capacity_blocks: int = 256,  # small: the storm's traffic makes the engines evict
    segment_cache_bytes: int = 1 << 20,  # and the render and prompt-reuse caches
    upstream: UpstreamConfig = CHAOS_UPSTREAM,
    health: HealthConfig = CHAOS_HEALTH,
    server_limits: ServerLimits = ServerLimits(),
) -> AsyncIterator[Cluster]:
    async with gateway_cluster(flavors, seed=seed, timing=timing,
                               capacity_blocks=capacity_blocks, config_changes={
                                   "server": ServerConfig(host="127.0.0.1", port=0,
                                                          limits=server_limits),
                                   "models": (model_config(
                                       segment_cache_bytes=segment_cache_bytes,
                                       render_cache_bytes=segment_cache_bytes,
                                       prompt_reuse_bytes=segment_cache_bytes),),
                                   "health": health, "upstream": upstream}) as cluster:
        yield cluster
