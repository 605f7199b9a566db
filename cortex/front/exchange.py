"""What one request came to, told once it is over: the lean server's record for an access log.

Contract (``HttpServer(..., on_exchange=hook)``; without a hook nothing is built):

* The hook runs once per request the server handed to its handler, when the request is over:
  its last byte handed to the kernel, or the client gone, or the response cut. It also runs
  once for a request the server refused before it could be read (``request`` is ``None``
  then: malformed, too large, too slow). It runs in the connection's task (the request's
  context variables — its request id — are still set), is synchronous and must not raise (if
  it does, the server logs it and counts a handler error).
* ``outcome`` is one of:

  - ``complete``: the whole response went out (whatever its status);
  - ``refused``: Cortex answered an error of its own instead (the handler raised a
    ``CortexError``: no route, bad input, overload, no worker, every attempt failed), or the
    request could not be read;
  - ``upstream_broke``: the response body failed (the worker's answer broke): after the head
    the connection was closed without the body's end, before it the client got the error;
  - ``client_gone``: the client left (reset, or a write failed) before the last byte;
  - ``cancelled``: the server stopped it (its drain deadline passed);
  - ``error``: a bug of the handler (answered 500 if no head had gone out).

* ``status`` is the status whose head went out (``None``: no head did); ``body_bytes`` the body
  bytes written (chunk framing not counted); times are ``time.perf_counter()`` seconds:
  ``started`` when the request was handed to the handler (or refused), ``head_at`` when its
  head went out, ``ended`` when the request was over.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cortex.front.messages import Headers, HttpRequest

COMPLETE = "complete"
REFUSED = "refused"
UPSTREAM_BROKE = "upstream_broke"
CLIENT_GONE = "client_gone"
CANCELLED = "cancelled"
ERROR = "error"


@dataclass(slots=True, frozen=True)
class Exchange:
    request: HttpRequest | None  # None: refused before it could be read
    client: tuple[str, int] | None
    status: int | None
    headers: Headers  # the response's, as the handler gave them (empty if none)
    body_bytes: int
    outcome: str
    started: float
    head_at: float | None
    ended: float


ExchangeHook = Callable[[Exchange], None]
