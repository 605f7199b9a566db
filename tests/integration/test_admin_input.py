"""The admin API's input through a running gateway (issue 22 §5): every field bounded, a 400
that names it (never a 500), nothing left behind by a refused worker, and the ledger's target
ids given back on delete."""

from __future__ import annotations

import json

from tests.gateway_cluster import gateway_cluster


def worker(port: int, **fields: object) -> bytes:
    return json.dumps({"name": f"extra{port}", "url": f"http://127.0.0.1:{port}",
                       "engine": "vllm", "events": f"tcp://127.0.0.1:{port}", **fields}).encode()


async def test_bad_worker_fields_are_400s_that_name_the_field():
    async with gateway_cluster(("vllm-0.33",)) as cluster:
        before = {spec.name for spec in cluster.running.registry.specs()}
        cases = {
            worker(31001, dp_size=70000): "dp_size must be in [1, 1024]",
            worker(31002, name="evil\r\nx-injected: 1"): "name must be 1-128 visible ASCII",
            worker(31003, name="wörker"): "name must be 1-128 visible ASCII",
            worker(31004, model="m" * 300): "model longer than 256",
            worker(31005).replace(b'"engine"', b'"weight": 1e309, "engine"'): "weight must be",
        }
        for body, why in cases.items():
            answer = await cluster.admin(b"POST", b"/admin/workers", body)
            assert answer.status == 400, (why, answer.body)
            assert why in answer.body.decode(), answer.body
        # one engine, two spellings of its address
        first = await cluster.admin(b"POST", b"/admin/workers", worker(31006))
        assert first.status == 201
        twin = worker(31006, name="twin", url="http://localhost:31006")
        answer = await cluster.admin(b"POST", b"/admin/workers", twin)
        assert answer.status == 400 and b"is already worker extra31006" in answer.body
        listed = json.loads((await cluster.admin(b"GET", b"/admin/workers")).body)
        assert {w["name"] for w in listed["workers"]} == before | {"extra31006"}


async def test_a_worker_that_does_not_fit_the_ledger_leaves_nothing_and_delete_frees_ids(
        monkeypatch):
    async with gateway_cluster(("vllm-0.33",)) as cluster:
        book = cluster.running.book
        registered = len(book.states())
        monkeypatch.setattr("cortex.ledger.book.MAX_TARGETS", registered + 3)
        answer = await cluster.admin(b"POST", b"/admin/workers", worker(31010, dp_size=4))
        assert answer.status == 400 and b"dp_size 4" in answer.body
        assert "extra31010" not in cluster.running.registry
        assert len(book.states()) == registered  # no target id kept by the refused worker
        assert (await cluster.admin(b"POST", b"/admin/workers",
                            worker(31011, dp_size=3))).status == 201
        assert (await cluster.admin(b"DELETE", b"/admin/workers/extra31011")).status == 200
        assert (await cluster.admin(b"POST", b"/admin/workers",
                            worker(31012, dp_size=3))).status == 201  # the ids came back
