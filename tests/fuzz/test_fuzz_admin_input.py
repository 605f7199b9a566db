"""The admin API under hostile input (issue 22 §5), through a running gateway: workers made of
field values picked from what careless operators and attackers send — huge and negative
numbers, NaN and infinities, wrong types, control characters, non-ASCII, very long strings,
nested objects, twin addresses — added and deleted at random.

Invariants after every request: the answer is 201, 200 or 400 (never a 5xx), every 400
carries an error message, ``/admin/workers`` still answers and the registry holds exactly
the workers that were accepted; ``/metrics`` answers at the end; at the end, once every accepted
worker is deleted, the ledger holds as many targets as before the first request (nothing
left behind by a refusal, everything given back on delete).

Seeded (``random.Random``): the same requests every run; a failure names its seed and step.
"""

from __future__ import annotations

import json
import random

from tests.gateway_cluster import gateway_cluster

STEPS = 150

HOSTILE: dict[str, list[object]] = {
    "name": ["ok", "a" * 128, "a" * 129, "", "evil\r\nx: 1", "wörker", "tab\tname", None, 7,
             ["x"], {"x": 1}, " lead", "名前"],
    "url": ["http://127.0.0.1:{port}", "http://localhost:{port}", "http://[::1]:{port}",
            "ftp://127.0.0.1:{port}", "http://127.0.0.1:99999", "http://", "", None, 3,
            "http://127.0.0.1:{port}/path?q=1", "http://user:pw@127.0.0.1:{port}",
            "http://127.0.0.1:{port}\r\nx: 1"],
    "engine": ["vllm", "sglang", "VLLM", "tgi", "", None, 1],
    "events": ["tcp://127.0.0.1:{port}", "tcp://localhost:{port}", "tcp://*:{port}",
               "ipc:///tmp/x", "nonsense", "", None, ["tcp://127.0.0.1:1"]],
    "dp_size": [1, 2, 4, 1024, 1025, 70000, 0, -1, 2**63, 1.5, "2", None, True],
    "weight": [1, 0.5, 1e6, 1e6 + 1, 1e309, -1e309, float("nan"), -1, 0, "1", None, [1]],
    "model": ["m", "m" * 256, "m" * 257, "", None, 5, "mödel", "m\nx"],
    "extra": [{"unknown_field": 1}, {"topic": "t" * 300}, {"topic": "kv"}, {}],
}


def hostile_worker(rng: random.Random, port: int) -> dict[str, object]:
    worker: dict[str, object] = {}
    for key, values in HOSTILE.items():
        if key == "extra":
            worker.update(rng.choice(values) if rng.random() < 0.3 else {})  # type: ignore[arg-type]
            continue
        if rng.random() < 0.04:
            continue  # missing
        if rng.random() < 0.8:  # mostly sane values, so some workers are accepted
            value: object = values[0]
        else:
            value = rng.choice(values)
        if isinstance(value, str):
            value = value.replace("{port}", str(port))
        worker[key] = value
    if "name" in worker and worker["name"] == "ok":
        worker["name"] = f"fz{port}"
    return worker


async def test_hostile_admin_input_never_5xx_and_leaves_nothing_behind():
    rng = random.Random(22)
    async with gateway_cluster(("vllm-0.33",)) as cluster:
        running = cluster.running
        book = running.book
        targets_before = len(book.states())
        names_before = {spec.name for spec in running.registry.specs()}
        accepted: set[str] = set()
        statuses: dict[int, int] = {}
        for step in range(STEPS):
            port = 32000 + rng.randrange(200)
            if accepted and rng.random() < 0.25:
                name = rng.choice(sorted(accepted))
                answer = await cluster.admin(b"DELETE", f"/admin/workers/{name}".encode())
                assert answer.status == 200, (step, answer.status, answer.body)
                accepted.discard(name)
            else:
                body = json.dumps(hostile_worker(rng, port), allow_nan=True).encode()
                if rng.random() < 0.05:
                    body = body[: rng.randrange(len(body))]  # cut short: malformed JSON
                answer = await cluster.admin(b"POST", b"/admin/workers", body)
                assert answer.status in (201, 400), (step, body, answer.status, answer.body)
                statuses[answer.status] = statuses.get(answer.status, 0) + 1
                if answer.status == 201:
                    accepted.add(json.loads(body)["name"])
                else:
                    assert json.loads(answer.body)["error"]["message"], (step, answer.body)
            listed = await cluster.admin(b"GET", b"/admin/workers")
            assert listed.status == 200, (step, listed.body)
            names = {w["name"] for w in json.loads(listed.body)["workers"]}
            assert names == names_before | accepted, step
            assert {spec.name for spec in running.registry.specs()} == names, step
        metrics = await cluster.admin(b"GET", b"/metrics")
        assert metrics.status == 200
        for name in sorted(accepted):
            assert (await cluster.admin(b"DELETE",
                                f"/admin/workers/{name}".encode())).status == 200
        assert len(book.states()) == targets_before
        assert {spec.name for spec in running.registry.specs()} == names_before
        print("admin fuzz answers:", statuses)
        assert statuses.get(201, 0) >= 10 and statuses.get(400, 0) >= 30, statuses
