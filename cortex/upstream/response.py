"""A worker's response as the pool hands it out: the head, and the body read on demand.

Rules:

* ``status``, ``headers`` (lower-case names, values stripped), ``http_version``, ``reason``
  are the final head; ``reused`` says the exchange ran on a kept-alive connection.
* The body is read once, either chunk by chunk (``body_chunks``: bytes as they arrive,
  de-chunked by llhttp, no parsing; one item is what one socket read brought, so HTTP chunk
  boundaries are not kept) or whole (``read``, bounded by ``limit``). Each wait for
  the socket is bounded by the pool's ``read_timeout_s``; failures are ``UpstreamBroken`` /
  ``UpstreamTimeout`` with phase ``body``.
* ``complete`` turns true once the end of the body was received; only then (or when the rest
  is already buffered) may the pool reuse the connection. The response does not own the
  connection: the exchange's context manager releases it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from cortex.upstream.connection import NotReady, UpstreamConnection
from cortex.upstream.errors import UpstreamBroken
from cortex.upstream.request_head import Headers

MiB = 1024 * 1024


class UpstreamResponse:
    """The head of a worker's response; the body is read with ``body_chunks`` or ``read``."""

    __slots__ = (
        "_complete",
        "_conn",
        "_read_timeout_s",
        "headers",
        "http_version",
        "reason",
        "reused",
        "status",
    )

    def __init__(self, conn: UpstreamConnection, status: int, headers: Headers,
                 http_version: bytes, reason: bytes, read_timeout_s: float) -> None:
        self.status = status
        self.headers = headers  # lower-case names, values stripped, order kept
        self.http_version = http_version
        self.reason = reason
        self.reused = conn.exchanges > 0  # ran on a kept-alive connection
        self._conn = conn
        self._read_timeout_s = read_timeout_s
        self._complete = False

    @property
    def complete(self) -> bool:
        """The whole body has been received."""
        return self._complete

    def ended_now(self) -> bool:
        """``complete``, or the end already received with every body byte taken — known
        without reading the socket (a small answer that came whole with its head)."""
        if not self._complete and self._conn.body_ended():
            self._complete = True
        return self._complete

    def header(self, name: bytes) -> bytes | None:
        """The first value of header ``name`` (lower-case), or ``None``."""
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def chunk_now(self) -> bytes | None | NotReady:
        """The next body bytes if they are already in hand (no I/O), ``None`` at the end, else
        ``NOT_READY`` (then ``body_chunks`` waits for them)."""
        if self._complete:
            return None
        chunk = self._conn.body_now()
        if chunk is None:
            self._complete = True
        return chunk

    def body_chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (de-chunked), each wait bounded by ``read_timeout_s``."""
        return _BodyChunks(self)

    async def read(self, limit: int = 64 * MiB) -> bytes:
        """The whole body; more than ``limit`` bytes is ``UpstreamBroken`` (phase ``body``)."""
        parts: list[bytes] = []
        total = 0
        while (chunk := await self._next_chunk()) is not None:
            total += len(chunk)
            if total > limit:
                raise UpstreamBroken(f"response body larger than {limit} bytes",
                                     origin=self._conn.origin, phase="body",
                                     response_started=True)
            parts.append(chunk)
        return b"".join(parts)

    async def _next_chunk(self) -> bytes | None:
        if self._complete:
            return None
        chunk = await self._conn.receive_body(self._read_timeout_s)
        if chunk is None:
            self._complete = True
        return chunk


class _BodyChunks:
    """Async iterator over a response body (a class, not a generator: nothing to finalize)."""

    __slots__ = ("_response",)

    def __init__(self, response: UpstreamResponse) -> None:
        self._response = response

    def __aiter__(self) -> _BodyChunks:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self._response._next_chunk()
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        """Nothing to release: the exchange's context manager owns the connection."""
