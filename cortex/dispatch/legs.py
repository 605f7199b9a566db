"""One upstream exchange in hand (``Leg``), its body as the client's body (``LegBody``), and
the one failure that is not an error yet.

A leg is opened by ``Gateway.open_leg``: its head and first body chunk have arrived, which is
the last moment a failure can still be retried on another worker.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import trio

from cortex.dispatch.exits import Exits
from cortex.errors import UpstreamError
from cortex.upstream.response import UpstreamResponse
from cortex.upstream.sse import CachedTokensSniffer


def retryable_status(status: int) -> bool:
    """A worker's answer that another worker may serve better: overloaded (429) or failed
    (5xx). Only before anything reached the client, within the retry budget."""
    return status == 429 or 500 <= status <= 599


@dataclass(slots=True)
class Leg:
    response: UpstreamResponse
    first: bytes | None
    chunks: AsyncIterator[bytes]

    def whole_body(self) -> bytes | None:
        """The whole body when it is already in hand (it came with the head and the first
        read, or was empty); ``None`` while more may follow. No I/O."""
        if self.first is None:
            return b""  # the body ended before any byte
        return self.first if self.response.ended_now() else None


class RetryableStatus(Exception):
    """A worker answered 429 or 5xx before anything reached the client: try another."""

    phase = "head"

    def __init__(self, status: int) -> None:
        super().__init__(f"worker answered {status}")
        self.status = status


class LegBody:
    """A leg's body as the client's streamed response body: the first chunk (offered with the
    head, ``chunk_ready``), then the rest as it arrives (``transform``-ed if given), sniffed
    for ``cached_tokens``.

    Not an async generator on purpose: ``aclose()`` on a generator that never started runs
    none of its ``finally``, and the server may close a body before asking for any chunk (the
    client left while the head was written). Here ``aclose`` always closes ``stack`` — the
    upstream exchange and the in-flight accounting — exactly once.
    """

    __slots__ = (
        "_closed",
        "_leg",
        "_on_cached_tokens",
        "_on_failure",
        "_sniffer",
        "_stack",
        "_started",
        "_transform",
    )

    def __init__(self, leg: Leg, stack: Exits,
                 on_failure: Callable[[UpstreamError], None],
                 on_cached_tokens: Callable[[int], None] | None,
                 transform: Callable[[bytes], bytes] | None) -> None:
        self._leg = leg
        self._stack = stack
        self._on_failure = on_failure
        self._on_cached_tokens = on_cached_tokens
        self._transform = transform
        self._sniffer = CachedTokensSniffer()
        self._started = False
        self._closed = False

    def __aiter__(self) -> LegBody:
        return self

    def chunk_ready(self) -> bytes | None:
        """The first chunk, in hand since the leg opened, without waiting (the server sends
        it with the head); ``None`` once taken or for an empty body (``__anext__`` says)."""
        if self._started or self._closed or self._leg.first is None:
            return None
        self._started = True
        return self._deliver(self._leg.first)

    async def __anext__(self) -> bytes:
        if self._closed:
            raise StopAsyncIteration
        leg = self._leg
        if not self._started:
            self._started = True
            chunk = leg.first
        else:
            try:
                chunk = await leg.chunks.__anext__()
            except StopAsyncIteration:
                chunk = None
            except UpstreamError as error:
                self._on_failure(error)
                await self._close(complete=False)
                raise
            except BaseException:
                await self._close(complete=False)
                raise
        if chunk is None:
            await self._close(complete=True)
            raise StopAsyncIteration
        return self._deliver(chunk)

    def _deliver(self, chunk: bytes) -> bytes:
        self._sniffer.feed(chunk)
        return chunk if self._transform is None else self._transform(chunk)

    async def aclose(self) -> None:
        await self._close(complete=False)

    async def _close(self, *, complete: bool) -> None:
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            await self._stack.aclose()
        cached = self._sniffer.cached_tokens
        if complete and self._on_cached_tokens is not None and cached is not None:
            self._on_cached_tokens(cached)
