"""One upstream exchange in hand (``Leg``) and the one failure that is not an error yet.

A leg is opened by ``Gateway.open_leg``: its head and first body chunk have arrived, which is
the last moment a failure can still be retried on another worker.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from cortex.upstream.response import UpstreamResponse

RETRY_STATUSES = frozenset({502, 503, 504})


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
    """A worker answered 502/503/504 before anything reached the client: try another."""

    def __init__(self, status: int) -> None:
        super().__init__(f"worker answered {status}")
        self.status = status
