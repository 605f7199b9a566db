"""perf/replay_matrix.py: the per-cell verdict against the best other router, and the tables."""

from __future__ import annotations

from perf.replay_matrix import full_table, summary


def _router(mean: float, p99: float, itl_p99: float, exact: float | None = None,
            over: float | None = None, failed: int = 0) -> dict:
    ledger = {"exact_share": exact} if over is None else {"exact_share": exact,
                                                          "over_share": over}
    return {"hit_rate": 0.5, "ttft_ms": {"mean": mean, "p50": mean, "p99": p99},
            "itl_ms": {"p50": 1.0, "p99": itl_p99}, "output_tokens_per_s": 10.0,
            "load_spread": 1.0, "ledger": ledger, "failed": failed}


def _cell(**routers: dict) -> dict:
    return {"cell": {"workload": "herd", "cache": "all", "load": 0.85}, "routers": routers}


def test_the_verdict_names_the_best_other_router_on_each_figure() -> None:
    cells = [_cell(cortex=_router(100, 300, 20, 0.9, 0.0),
                   p2c=_router(90, 400, 10), round_robin=_router(120, 250, 30, failed=1))]
    row = summary(cells).splitlines()[2]
    assert "p2c 90" in row and "round_robin 250" in row
    assert "loses mean to p2c (+11%), p99 to round_robin (+20%)" in row
    assert "20 / 10 (worse)" in row and "90.0% / 0.0%" in row


def test_a_cell_cortex_wins_and_a_run_without_false_hit_figures() -> None:
    cells = [_cell(cortex=_router(80, 200, 5, 0.99, failed=2), p2c=_router(90, 400, 10))]
    row = summary(cells).splitlines()[2]
    assert "lowest mean and p99, 2 failed" in row and "| 99.0% |" in row
    rows = full_table(cells).splitlines()[2:]
    assert len(rows) == 2 and "| -" in rows[1]  # p2c predicts nothing
