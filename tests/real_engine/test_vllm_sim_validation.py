"""The simulated vLLM engine against the real one (issue 34 §2): one seeded arrival sequence
through a real vLLM CPU server and through ``cortex sim``'s batching vLLM engine on the
``vllm-cpu-tiny`` step profile, with the same block size, KV pool, token budget and sequence cap
(``perf/validate_sim_vllm.py``, whose pieces this reuses; its full run and figures are in
``perf/RESULTS.md``).

* ``cached_tokens`` is identical on every request: the model's prefix lookup, block allocation,
  eviction order and preemption are vLLM's. The workload's hits do not hang on timing: the
  model alone gives every request the same hit at 0.7-1.3x its speed (checked first, without
  an engine), so a slower or faster machine cannot make a request miss a block it would
  otherwise hit, and an exact match is what is asserted.
* TTFT within a factor: the median of the per-request ratio sim / real TTFT between 1/5 and 5.
  The step profile was fitted on this shared 2-core machine, whose real CPU engine runs in two
  regimes minutes apart with nothing else running (``perf/RESULTS.md``, issue 34 §2: the
  simulator's median TTFT error is 26-40 % against the slow one and 63-130 % against the fast
  one); a tighter bound failed on that alone (a full ``make test`` at 50 %, and at a factor of 3
  on 2026-12-06: real median 170 ms against 30 ms, while the lone requests' TTFTs agreed,
  20-70 ms against 22-40). The bound catches a simulator wrong by an order of magnitude (a
  speed-up left on, a profile of another machine), not the regimes; the tolerance itself is
  measured in ``perf/validate_sim_vllm.py``.
"""

from __future__ import annotations

from perf import validate_sim_vllm as v
from tests.real_engine.farm import ServerSet

SETTINGS = v.Settings()
MIX = v.Mix(requests=30)
TTFT_FACTOR = 5.0  # the median sim / real TTFT ratio must lie within a factor of this


def test_the_simulated_engine_reports_the_real_cached_tokens_and_about_its_ttft(
        farm, engines, tmp_path):
    arrivals = v.workload(v.SEED, MIX)
    alone = v.model_run(arrivals, SETTINGS)
    assert alone.preemptions > 0 and alone.evicted > 0  # the pool is small enough for both
    assert not v.timing_races(arrivals, SETTINGS)

    family = "qwen-tiny"
    (server,) = farm.servers(ServerSet(family, count=1, num_blocks=SETTINGS.num_gpu_blocks,
                                       extra_args=SETTINGS.vllm_args()))
    assert server.options.served_name == v.MODEL
    assert server.options.block_size == SETTINGS.block_size
    assert server.options.max_model_len == SETTINGS.max_model_len
    warm = v.warmup(v.SEED)
    (real,) = v.run_on(server, arrivals, warm)
    with v.sim_process(SETTINGS, engines.model(family) / "tokenizer.json",
                       tmp_path / "sim.log") as sim:
        (simulated,) = v.run_on(sim, arrivals, warm)
    report = v.compare(arrivals, real, simulated)
    print(f"\n{v.table([('real / sim', report)])}")

    assert not report["failed"], report
    assert report["cached_differ"] == [], report
    assert report["cached_tokens"]["real"] > 0.1 * report["cached_tokens"]["prompt"]
    ratio = 1 + report["ttft"]["median_signed"]
    assert 1 / TTFT_FACTOR <= ratio <= TTFT_FACTOR, (report["ttft"], report["ttft_ms"],
                                                     report["lone_ttft_ms"])
