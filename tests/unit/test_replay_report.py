"""perf/replay_report.py: the per-router figures computed from request records."""

from __future__ import annotations

from types import SimpleNamespace

from perf.replay_report import markdown, summarize, table

PARAMS = SimpleNamespace(prefill_tokens_per_s=1000.0, decode_ms_per_token=10.0, max_running=1,
                         engine_slots=lambda: 1)


def _record(index: int, worker: str, sent: float, ttft: float, prompt: int, cached: int,
            predicted: int | None, status: int = 200) -> SimpleNamespace:
    return SimpleNamespace(index=index, sent_s=sent, late_s=0.001, status=status,
                           worker=worker, ttft_s=ttft, total_s=ttft + 0.1,
                           prompt_tokens=prompt, cached_tokens=cached, output_tokens=11,
                           predicted=predicted, mode="exact_kv_events")


def test_figures_from_records() -> None:
    records = [_record(0, "a", 0.0, 1.0, 1000, 0, 0),
               _record(1, "b", 0.0, 0.5, 1000, 500, 500),
               _record(2, "a", 1.0, 0.2, 1000, 900, 1000),  # a false hit
               _record(3, "b", 1.0, 9.9, 1000, 0, None, status=503)]
    ledger = {"duplicated_blocks": 7, "blocks_held": 40}
    out = summarize(records, PARAMS, engines=2, ledger=ledger)
    assert out["requests"] == 4 and out["failed"] == 1
    assert out["hit_rate"] == round(1400 / 3000, 4)
    assert out["prefill_tokens"] == 1600
    assert out["per_worker"] == {"a": 2, "b": 1}
    assert out["load_spread"] == round(2 / 1.5, 3)
    # busy: a 1.0 + 0.1 s prefill + 2 x 0.1 s decode, b 0.5 + 0.1 s: mean 0.95 s
    assert out["work_spread"] == round(1.3 / 0.95, 3)
    assert out["ttft_ms"]["p50"] == 500.0
    # own prefill 1.0, 0.5, 0.1 s; waits 0, 0, 0.1 s
    assert out["ttft_parts_ms"]["own_prefill_mean"] == round(1600 / 3, 1)
    assert out["ttft_parts_ms"]["wait_mean"] == round(100 / 3, 1)
    assert out["ledger"] == {"predicted": 3, "exact_share": round(2 / 3, 4),
                             "over_share": round(1 / 3, 4), "abs_error_tokens": 100}
    assert out["duplicated_blocks"] == 7
    # busy: prefill 1.6 s + 3 x 10 decode steps of 10 ms, over 2 engines x 1.3 s
    assert out["utilization"] == round((1.6 + 0.3) / (2 * 1.3), 3)


def test_tables_name_every_router() -> None:
    run = summarize([_record(0, "a", 0.0, 1.0, 100, 50, 50)], PARAMS, 1,
                    {"duplicated_blocks": 0, "blocks_held": 1})
    result = {"routers": {"cortex": run, "round_robin": {**run, "ledger": {
        "predicted": 0, "exact_share": None, "over_share": None,
        "abs_error_tokens": 0}}}}
    assert "cortex" in table(result) and "round_robin" in table(result)
    lines = markdown(result).splitlines()
    assert len(lines) == 4 and lines[1].count("---") == lines[0].count("|") - 1


def test_a_killed_replica_s_failures_are_told_apart() -> None:
    from perf.replay_report import killed_figures

    records = [_record(0, "a", 0.0, 0.1, 1000, 0, 0),  # done before the kill at 1.0 s
               _record(1, "a", 0.5, 0.6, 1000, 0, 0, status=0),  # in flight then: failed
               _record(2, "b", 0.7, 0.1, 1000, 0, 0, status=502),  # failed, ended before
               _record(3, "b", 2.0, 0.1, 1000, 600, 600),
               _record(4, "a", 3.0, 0.1, 1000, 0, 0, status=0)]  # failed after
    assert killed_figures(records, 1.0) == {
        "at_s": 1.0, "failed_in_flight": 1, "failed_before": 1, "failed_after": 1,
        "hit_before": 0.0, "hit_after": 0.6}
