"""A PD pool holding both engine flavors: every request is paired within one flavor.

A vLLM prefill cannot hand its KV to an SGLang decode (nor the reverse): the SGLang decode
would wait for a room the vLLM engine never offers, the vLLM decode refuses a request without
``kv_transfer_params``. The replay's ``cortex-pd`` cluster (``perf/replay.py``) is such a
mixed pool. Here every request, idle cluster, has two decode workers of equal cost, one of each
flavor (ties ordered per request): a pairing that ignores the flavor meets a cross-flavor pair
in eight requests but with probability 2**-8 (it failed at the first request when it did).
"""

from __future__ import annotations

import json

from cortex.pd.plan import PdSettings
from cortex.sim.pd import PdSimSettings
from tests.gateway_cluster import SYSTEM_TEXT, gateway_cluster

FLAVOR = {"e0": "sglang", "e1": "vllm", "e2": "sglang", "e3": "vllm"}
SHORT = PdSimSettings(waiting_timeout_s=5.0, bootstrap_timeout_s=5.0, kv_lease_s=5.0)


async def test_each_prefill_pairs_with_a_decode_of_its_own_flavor():
    async with gateway_cluster(
            ("sglang-0.5.23", "vllm-0.33", "sglang-0.5.23", "vllm-0.33"),
            roles=("prefill", "decode", "decode", "prefill"), pd_settings=SHORT,
            config_changes={"pd": PdSettings(retries=0, bypass_max_uncached_tokens=0)},
    ) as cluster:
        for i in range(8):
            response = await cluster.chat([{"role": "system", "content": SYSTEM_TEXT},
                                           {"role": "user", "content": f"Question {i}?"}])
            assert response.status == 200, response.body
            prefill = response.header(b"x-cortex-prefill-worker").decode()
            decode = response.header(b"x-cortex-decode-worker").decode()
            assert FLAVOR[prefill] == FLAVOR[decode], (prefill, decode)
            assert response.header(b"x-cortex-pd") == FLAVOR[prefill].encode()
            assert json.loads(response.body)["choices"][0]["message"]["content"]
        assert cluster.running.gateway.pd.counters.failed == 0  # type: ignore[attr-defined]
