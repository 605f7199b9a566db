"""Fetch a peer replica's ledger snapshot at start (the I/O shell of the warm start).

``fetch_snapshot`` GETs ``<ledger.warm_start_url>/admin/ledger/snapshot`` with the peer's
bearer token, within ``warm_start_timeout_s`` and ``warm_start_max_bytes``, and decodes it
(``cortex.ledger.snapshot``). Every failure — unreachable, timeout, not 200, too large,
malformed — is one ``SnapshotError`` whose message never holds the token; the caller logs it,
counts it and starts without a snapshot. Each stream's image then goes to its ingestion, which
loads it and has the sync machine prove it continuous by replay or discard it.
"""

from __future__ import annotations

from typing import Protocol
from urllib.parse import urlsplit

import trio

from cortex.errors import CortexError
from cortex.ledger.book import LedgerSettings
from cortex.ledger.snapshot import LedgerSnapshot, SnapshotError, decode

SNAPSHOT_PATH = "/admin/ledger/snapshot"


class HttpGet(Protocol):
    """``cortex.upstream.connection_pool.ConnectionPool.request`` as used here."""

    def request(self, origin: str, method: bytes, target: bytes,
                headers: list[tuple[bytes, bytes]], body: bytes = b"", *,
                head_timeout_s: float | None = None) -> object: ...


async def fetch_snapshot(settings: LedgerSettings, upstream: HttpGet) -> LedgerSnapshot:
    """The peer's snapshot, or ``SnapshotError`` (rules above)."""
    url = settings.warm_start_url
    if url is None:
        raise SnapshotError("no warm_start_url configured")
    parts = urlsplit(url)
    origin = f"{parts.scheme}://{parts.netloc}"
    path = (parts.path.rstrip("/") + SNAPSHOT_PATH).encode()
    headers = [(b"accept", b"application/msgpack")]
    if settings.warm_start_token is not None:
        headers.append((b"authorization", b"Bearer " + settings.warm_start_token.encode()))
    try:
        with trio.fail_after(settings.warm_start_timeout_s):
            exchange = upstream.request(origin, b"GET", path, headers,
                                        head_timeout_s=settings.warm_start_timeout_s)
            async with exchange as response:  # type: ignore[attr-defined]
                status = response.status
                body = await response.read(settings.warm_start_max_bytes)
    except trio.TooSlowError:
        raise SnapshotError(f"peer {origin}: no snapshot within "
                            f"{settings.warm_start_timeout_s} s") from None
    except (CortexError, OSError) as error:
        raise SnapshotError(f"peer {origin}: {type(error).__name__}: {error}") from None
    if status != 200:
        raise SnapshotError(f"peer {origin}: {SNAPSHOT_PATH} answered {status}")
    return decode(body)
