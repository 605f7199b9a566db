"""Continuous-batching engine models: what one engine rank computes in each step, which KV
blocks it holds, which KV events it publishes and when, and how long each step takes.

Pure (no trio, no ZeroMQ, no clock): a model is fed requests (``add``, ``abort``) and run one
step at a time (``step``); the simulated engine's I/O shell (``cortex.sim.engine``) sleeps each
step's ``seconds`` on its clock and delivers what the step produced. The interface both
flavours implement is ``cortex.sim.batching.core.BatchingEngine``; the facts they follow are
in ``shared/protocols/engine-scheduling.md``.
"""
