"""Simulated engines (GPU-free) for tests, the demo and benchmarks; never imported by the gateway.

Event side, pure cores first:

* ``engine_hashes`` — the engines' own block hashes (vLLM pickle/CBOR chains, SGLang pages).
* ``prefix_cache`` — paged prefix caches (vLLM block pool, SGLang radix) emitting KV events.
* ``wire`` — per-version payload and frame encoding (byte-identical to the real engines).
* ``faults`` — delivery fault decisions (drop, duplicate, reorder, stall).
* ``publisher`` — trio + pyzmq publisher per DP rank (PUB + replay ROUTER), port probing.
* ``kv_engine`` — ``SimKVEngine``: caches + publishers for every DP rank.

HTTP side (``cortex sim``):

* ``serving`` — pure timing model ("fixed"): FIFO queue, batch limit, prefill and decode time.
* ``batching`` — pure continuous-batching engine models ("batching"), timed by ``step_time``;
  ``stepper`` — the trio task stepping one rank's model and delivering its tokens and events.
* ``tokenize`` — prompt token ids the way an engine computes them (one full encode).
* ``generation`` — one started request's token stream (either model) and the per-rank totals.
* ``http_faults`` — the HTTP side's fault switches (``SimFaults``) and ``EngineCrashed``.
* ``engine_view`` — the engine as its parts (routes, bodies, PD role) see it: protocols, so
  they need not import ``engine``, which builds them.
* ``bodies`` — JSON/SSE/Prometheus bodies in the engines' shapes.
* ``http_engine`` — the routes of a vLLM or SGLang server, with fault switches.
* ``engine`` — ``SimEngine``: KV side + HTTP side as one service; ``cli`` — ``cortex sim``;
  ``serve_line`` — the ``cortex serve`` command line for running engines.
* ``pd`` — prefill/decode roles (SGLang bootstrap rooms, vLLM ``kv_transfer_params``);
  ``pd_transfer`` — the KV hand-over between them over TCP.
"""
