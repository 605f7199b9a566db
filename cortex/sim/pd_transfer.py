"""KV transfer between simulated prefill and decode engines: offers on the prefill side, a TCP
listener that hands them out, and the decode side's fetch. Works across processes.

The real engines move KV over RDMA (SGLang: Mooncake/NIXL after a handshake on the prefill's
*bootstrap* port; vLLM: NIXL, reached through the side channel ``remote_host:remote_port``).
The simulator keeps the rendezvous and drops the bytes: the prefill engine listens on a TCP
port (SGLang flavor: the bootstrap port; vLLM flavor: the side-channel port) and the decode
engine connects to it, so a decode sent to the wrong place, with the wrong room or request id,
or after the prefill died, cannot get its KV — exactly what makes wrong orchestration fail.

Wire (one exchange per connection, newline-terminated JSON objects):

* decode -> prefill: ``{"key": str, "wait": bool, "engine_id": str | null, "block_ids": any}``
  (``key``: SGLang the room as a decimal string, vLLM the ``remote_request_id``);
* prefill -> decode: ``{"ok": true, "token_ids": [...], "engine_id": str}`` once the offer is
  ready, or ``{"ok": false, "error": str}``.

``OfferTable`` rules (one table per prefill engine, single trio thread):

* ``open(key)`` registers a prefill request's offer (a key already owned -> ``BadRequest``);
  ``ready(key, token_ids, ...)`` makes it fetchable; ``close(key)`` ends the prefill request's
  part (fetched, failed, cancelled or expired): the offer is gone and waiters get an error.
* ``take(key, wait, ...)``: a ready offer is handed out once (its ``fetched`` event set, the
  entry removed). With ``wait`` (SGLang: the decode leg may arrive before the prefill leg) a
  missing key is waited for; without it (vLLM: the prefill answered already) missing = unknown.
  A waiter that leaves removes the placeholder it created.
* Invariant: with no request in flight on either side, the table is empty (``keys()``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import trio

from cortex.errors import BadRequest, CortexError

MAX_LINE_BYTES = 16 << 20


class KvTransferFailed(CortexError):
    """The decode side could not get the prompt's KV from its prefill peer."""

    http_status = 500


@dataclass(slots=True)
class Offer:
    owned: bool = False  # a prefill request registered it
    token_ids: list[int] | None = None  # set when ready
    engine_id: str = ""
    block_ids: Any = None
    waiters: int = 0
    changed: trio.Event = field(default_factory=trio.Event)
    fetched: trio.Event = field(default_factory=trio.Event)
    closed: bool = False


class OfferTable:
    def __init__(self, on_change: Callable[[], None] = lambda: None) -> None:
        self._offers: dict[str, Offer] = {}
        self._on_change = on_change

    def keys(self) -> list[str]:
        return sorted(self._offers)

    def open(self, key: str) -> Offer:
        offer = self._offers.get(key)
        if offer is None:
            offer = self._offers[key] = Offer()
        elif offer.owned:
            raise BadRequest(f"bootstrap room / request id {key} is already in flight")
        offer.owned = True
        self._on_change()
        return offer

    def ready(self, key: str, token_ids: list[int], engine_id: str,
              block_ids: Any = None) -> None:
        offer = self._offers[key]
        offer.token_ids, offer.engine_id, offer.block_ids = list(token_ids), engine_id, block_ids
        self._wake(offer)

    def close(self, key: str) -> None:
        offer = self._offers.pop(key, None)
        if offer is not None:
            offer.closed = True
            self._wake(offer)
        self._on_change()

    async def take(self, key: str, *, wait: bool, engine_id: str | None = None,
                   block_ids: Any = None) -> Offer:
        """The ready offer under ``key`` (handed out once), or ``KvTransferFailed``."""
        offer = self._offers.get(key)
        if offer is None:
            if not wait:
                raise KvTransferFailed(f"unknown or expired transfer {key}")
            offer = self._offers[key] = Offer()
            self._on_change()
        offer.waiters += 1
        try:
            while offer.token_ids is None and not offer.closed:
                changed = offer.changed
                await changed.wait()
        finally:
            offer.waiters -= 1
            if not offer.owned and offer.waiters == 0 and self._offers.get(key) is offer:
                del self._offers[key]
                self._on_change()
        if offer.closed or offer.fetched.is_set():
            raise KvTransferFailed(f"transfer {key} was aborted by the prefill engine")
        if engine_id is not None and engine_id != offer.engine_id:
            raise KvTransferFailed(f"transfer {key}: engine id {engine_id!r} is not "
                                   f"{offer.engine_id!r}")
        if offer.block_ids is not None and block_ids != offer.block_ids:
            raise KvTransferFailed(f"transfer {key}: block ids do not match")
        offer.fetched.set()
        self._offers.pop(key, None)
        self._wake(offer)
        return offer

    def _wake(self, offer: Offer) -> None:
        offer.changed.set()
        offer.changed = trio.Event()
        self._on_change()


async def serve_offers(table: OfferTable, host: str, port: int, *,
                       task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """Listen on ``host:port`` (0 = any free port; the bound port is the started value)."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        task_status.started(bound)
        await trio.serve_listeners(_handler(table), listeners, handler_nursery=nursery)


def _handler(table: OfferTable) -> Callable[[trio.SocketStream], Any]:
    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            try:
                ask = msgspec.json.decode(await _read_line(stream))
                key = str(ask["key"])
                answer: dict[str, Any] | None = None
                async with trio.open_nursery() as nursery:
                    # a decode that hangs up stops waiting (its request was cancelled)
                    nursery.start_soon(_cancel_on_eof, stream, nursery.cancel_scope)
                    try:
                        offer = await table.take(key, wait=bool(ask.get("wait")),
                                                 engine_id=ask.get("engine_id"),
                                                 block_ids=ask.get("block_ids"))
                        answer = {"ok": True, "token_ids": offer.token_ids,
                                  "engine_id": offer.engine_id}
                    except KvTransferFailed as error:
                        answer = {"ok": False, "error": str(error)}
                    nursery.cancel_scope.cancel()
                if answer is None:  # the decode hung up while waiting
                    return
                await stream.send_all(msgspec.json.encode(answer) + b"\n")
            except (trio.BrokenResourceError, trio.ClosedResourceError, EOFError,
                    msgspec.DecodeError, KeyError, TypeError):
                return

    return handle


async def _cancel_on_eof(stream: trio.SocketStream, scope: trio.CancelScope) -> None:
    try:
        while await stream.receive_some(1024):
            pass
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    scope.cancel()


async def _read_line(stream: trio.SocketStream) -> bytes:
    data = b""
    while b"\n" not in data:
        chunk = await stream.receive_some(65536)
        if not chunk:
            raise EOFError("peer closed before a whole line")
        data += chunk
        if len(data) > MAX_LINE_BYTES:
            raise EOFError("line too long")
    return data.partition(b"\n")[0]


async def fetch(host: str, port: int, key: str, *, wait: bool, engine_id: str | None = None,
                block_ids: Any = None) -> list[int]:
    """The prompt token ids whose KV the prefill engine at ``host:port`` holds under ``key``
    (``KvTransferFailed`` if it cannot be reached, refuses, or dies meanwhile)."""
    try:
        stream = await trio.open_tcp_stream(host, port)
    except (OSError, ValueError) as error:  # (ValueError: a name IDNA cannot encode)
        raise KvTransferFailed(f"prefill peer {host}:{port} unreachable: {error}") from None
    async with stream:
        try:
            await stream.send_all(msgspec.json.encode(
                {"key": key, "wait": wait, "engine_id": engine_id, "block_ids": block_ids})
                + b"\n")
            answer = msgspec.json.decode(await _read_line(stream))
        except (trio.BrokenResourceError, EOFError, msgspec.DecodeError) as error:
            raise KvTransferFailed(f"prefill peer {host}:{port} went away: {error}") from None
    if not isinstance(answer, dict) or not answer.get("ok"):
        error = answer.get("error") if isinstance(answer, dict) else answer
        raise KvTransferFailed(f"prefill peer {host}:{port}: {error}")
    return list(answer["token_ids"])
