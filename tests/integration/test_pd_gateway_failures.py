"""Issue 6 §4 on SGLang PD clusters: a leg that fails (a non-2xx head) must cancel the other leg
at once, as the SGLang gateway does (protocols/pd-disaggregation.md §1.3 step 4): otherwise
the client waits for the surviving leg's own timeout (SGLang: 300 s for a room that never
comes). Here the engines' PD timeouts are 30 s and the client allows 10 s; the retry or
fallback rules (§4) decide what the client finally gets, but it must not wait 30 s.

Also: a prefill worker registered without a bootstrap port (the protocol: "from the worker's
registration or server info") should still pair with its decode.
"""

from __future__ import annotations

import json
from dataclasses import replace

import trio

from cortex.sim.pd import PdSimSettings
from tests.gateway_cluster import MODEL
from tests.integration.test_pd_gateway import NO_BYPASS, engine, messages, pd_cluster

PATIENT = PdSimSettings(waiting_timeout_s=30.0, bootstrap_timeout_s=30.0, kv_lease_s=30.0)

async def timed_chat(cluster, question: str) -> tuple[int, float, bytes]:
    started = trio.current_time()
    with trio.move_on_after(10) as scope:
        response = await cluster.chat(messages(question))
    if scope.cancelled_caught:
        raise AssertionError("the client waited more than 10 s for an answer")
    return response.status, trio.current_time() - started, response.body



async def test_sglang_decode_answering_500_cancels_the_prefill_leg_at_once():
    async with pd_cluster("sglang", ("prefill", "decode", "decode"),
                          pd_settings=PATIENT) as cluster:
        engine(cluster, "e1").faults.update({"fail_status": 500})
        engine(cluster, "e2").faults.update({"fail_status": 500})
        status, _, _ = await timed_chat(cluster, "Decode is broken.")
        assert status >= 500



async def test_sglang_prefill_answering_500_cancels_the_decode_leg_and_falls_back():
    async with pd_cluster("sglang", ("prefill", "decode", "both"),
                          pd_settings=PATIENT) as cluster:
        engine(cluster, "e0").faults.update({"fail_status": 500})
        status, _, body = await timed_chat(cluster, "Prefill is broken.")
        assert status == 200, body  # fallen back to the `both` worker
        assert json.loads(body)["choices"][0]["message"]["content"] == " The quick brown fox"


async def test_sglang_bootstrap_port_learnt_from_server_info():
    async with pd_cluster("sglang", ("prefill", "decode"), pd_settings=PATIENT,
                          config_changes={"pd": NO_BYPASS}) as cluster:
        reload = cluster.running.reload_workers
        assert reload is not None
        specs = [replace(spec, bootstrap_port=None) for spec in cluster.config.workers]
        _, problems = reload(specs)
        assert not problems
        pool = cluster.running.pools[MODEL]
        await cluster.until(lambda: pool.workers["e0"].bootstrap_port is None)
        status, _, body = await timed_chat(cluster, "Where is your bootstrap?")
        assert status == 200, body
