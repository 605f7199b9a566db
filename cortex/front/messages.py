"""What the lean HTTP server hands a handler, and what a handler hands back.

Contract (shared by the data plane, the simulated engines and the tests):

* ``HttpRequest`` is one fully read request: the server has enforced its limits (header count
  and size, body size, read timeouts) before the handler runs. Header names are lower-case
  bytes (the server lower-cases them); values are raw bytes without surrounding whitespace.
* A handler is ``async def handler(request) -> HttpResponse``. It may raise ``CortexError``
  leaves; the server maps them to a JSON error response in one place
  (``cortex.front.errors_http``). Any other exception is a bug: the server answers 500, logs it
  and counts it.
* ``HttpResponse.body`` is either ``bytes`` (sent with ``content-length``) or an async iterator
  of ``bytes`` chunks, streamed as they come (chunked transfer encoding unless the handler set
  ``content-length``). Each chunk is written and flushed before the next is awaited: no
  buffering, no per-token parsing. A streamed body may offer a chunk it already holds:
  ``chunk_ready()`` (optional, synchronous, no I/O) returns it, or ``None`` if there is none
  in hand; the server sends a chunked (or close-delimited) head together with that chunk in
  one write, so a stream whose first event is ready reaches the client in one segment.
* ``HttpResponse.after_sent`` (optional, synchronous) runs once the response has been handed
  to the kernel, or its writing failed: bookkeeping the client need not wait for (a measurement
  of the answer, say). It must not raise; if it does, the server logs it and counts a handler
  error. With a streamed body it runs after the body's ``aclose()``.
* For a streamed body the server always calls ``aclose()`` on the iterator when it stops
  reading it — normal end, client gone, or error — so the handler's ``finally`` blocks run
  (an upstream connection is closed, in-flight accounting released).
* If the client goes away while the handler runs or the body streams, the handler's task is
  cancelled (trio ``Cancelled``), which is how an upstream request gets aborted.
* If the body iterator raises after the head was sent, the server closes the connection
  without the terminating chunk, so the client sees a broken response, never a hang or a
  truncated body that looks complete.
* Hop-by-hop headers (``connection``, ``keep-alive``, ``transfer-encoding``, ``te``,
  ``trailer``, ``upgrade``, ``proxy-*``) in ``HttpResponse.headers`` are dropped by the server;
  it manages framing and keep-alive itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

Headers = list[tuple[bytes, bytes]]


@dataclass(slots=True)
class HttpRequest:
    method: bytes  # b"POST"
    target: bytes  # b"/v1/chat/completions?x=1" (path and query, as received)
    headers: Headers
    body: bytes = b""
    client: tuple[str, int] | None = None
    http_version: bytes = b"1.1"

    @property
    def path(self) -> bytes:
        return self.target.split(b"?", 1)[0]

    def header(self, name: bytes) -> bytes | None:
        """The first value of header ``name`` (lower-case), or ``None``."""
        for key, value in self.headers:
            if key == name:
                return value
        return None


@dataclass(slots=True)
class HttpResponse:
    status: int
    headers: Headers = field(default_factory=list)
    body: bytes | AsyncIterator[bytes] = b""
    after_sent: Callable[[], None] | None = None


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]


def json_response(status: int, payload: bytes, headers: Headers | None = None) -> HttpResponse:
    """A complete JSON response from already-encoded bytes."""
    return HttpResponse(status, [(b"content-type", b"application/json"), *(headers or [])],
                        payload)
