"""Why a request of a model that routes exactly is routed by load instead. Pure.

A request Cortex cannot render exactly as the engine will (a field or item it does not model,
state the engine keeps between requests) must not be guessed at: a wrong prompt is a false
hit. The converters raise ``Unrenderable`` with one of ``REASONS``; the gateway routes the
request by load and counts it (``cortex_unpredicted_total{reason}``).

* ``template_failed``: the chat template raised on the conversation.
* ``prompt_too_long``: longer than the model's ``max_prompt_chars`` (never tokenized).
* ``engine_state``: the prompt depends on state the engine keeps (``previous_response_id``,
  ``conversation``, ``prompt`` templates stored by the provider).
* ``unmodelled``: a field, item, block or tool type whose rendering Cortex does not reproduce
  (named in the exception's text, for the debug log).
* ``engine_rendering``: the pool has a worker whose engine converts this API differently from
  the rendering Cortex reproduces (vLLM's), so no prediction holds for every worker.
"""

from __future__ import annotations

REASONS = ("template_failed", "prompt_too_long", "engine_state", "unmodelled",
           "engine_rendering")


class Unrenderable(Exception):  # (a routing outcome, not a client error: no CortexError)
    """The request cannot be rendered exactly; ``reason`` is one of ``REASONS``."""

    def __init__(self, reason: str, detail: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown reason {reason!r}; one of {REASONS}")
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
