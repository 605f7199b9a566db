"""One generation request as Cortex serves it: the record every step after parsing reads.

Rules:

* Built once, by the gateway, when the request's body is parsed (``ServeRequest.parse``);
  the model's pool fills what it learns of the prompt (``ModelPool.prepare``: the prompt, its
  token ids and block keys, the time they took); after that the serving strategies
  (``cortex.dispatch.single``, ``cortex.pd.orchestrate``) only read it, apart from
  ``excluded``, the workers this request must not be sent to, which grows as attempts fail.
* ``prompt``/``token_ids``/``keys`` are ``None`` when the request is routed on load alone
  (no profile, exact routing off, a prompt Cortex cannot render as the engine will, or too long
  to tokenize): never a guessed prediction.
* ``http.body`` stays the bytes the client sent; ``body`` is their parse (the engine gets the
  bytes unchanged unless Cortex must add a field).
"""

from __future__ import annotations

from typing import Any

import msgspec

from cortex.dispatch.endpoints import Endpoint, body_model, forwarded_headers, parse_body
from cortex.front.messages import HttpRequest
from cortex.prompt.request_text import RequestPrompt


class ServeRequest(msgspec.Struct):
    """(A ``msgspec.Struct``, not a dataclass: one is built per request, in a fraction of a
    dataclass's time.)"""

    endpoint: Endpoint
    http: HttpRequest
    body: dict[str, Any]  # the parsed JSON object
    headers: list[tuple[bytes, bytes]]  # forwarded to the engine
    model: str | None  # the model the body names (None: the only one served)
    started: float  # perf_counter when the body was in: the decision timing's origin
    prompt: RequestPrompt | None = None
    token_ids: Any = None  # array('I') or list[int]; None: not tokenized
    keys: Any = None  # the prompt's block keys (array('Q')); None: not computed
    timings: dict[str, float] = msgspec.field(default_factory=dict)  # tokenize_s, hash_s
    excluded: list[str] = msgspec.field(default_factory=list)  # not tried, then failed ones

    @classmethod
    def parse(cls, endpoint: Endpoint, http: HttpRequest, started: float,
              client_dp_rank: bool = False) -> ServeRequest:
        """The record of ``http`` (a malformed body is the client's ``BadRequest``); the
        forwarded headers keep a client's DP rank only when ``client_dp_rank``."""
        body = parse_body(http.body)
        return cls(endpoint, http, body, forwarded_headers(http.headers, client_dp_rank),
                   body_model(body), started)
