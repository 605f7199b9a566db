"""Replay client: ask a publisher's ROUTER for its buffered batches (kv-events.md §6).

One fresh DEALER (linger 0) per request, closed afterwards, so a late answer to an abandoned
request can never be mistaken for the answer to the next one. The request is
``encode_replay_request(start_seq)``; replies of both generations (with / without topic frame)
are parsed by the decoder. Reading stops at the end marker, at ``max_items`` items, or at the
overall deadline, whichever comes first. A publisher serves requests only between its queue
polls (up to ~100 ms), so deadlines are seconds, not milliseconds.

What the outcome means:

* ``refused`` — no reply of any kind before the deadline (no ROUTER there, a ROUTER that does
  not answer, or a request it rejected: engines answer malformed requests with silence).
* ``ended`` — the end marker arrived: the publisher sent every batch it holds from
  ``start_seq`` on. Not ended and not refused: truncated (deadline or ``max_items``).
* ``items`` — in the order received. Whether they start at ``start_seq`` and are contiguous is
  for the caller to judge (``contiguous_from``): a buffer that no longer reaches back starts
  later; a ROUTER over its send high-water mark silently drops replies.
* ``malformed_frames`` — replies the decoder rejected (skipped; they still count as a reply).
"""

from __future__ import annotations

from dataclasses import dataclass

import trio
import zmq

from cortex.errors import DecodeError
from cortex.events import zmq_trio
from cortex.events.frames import encode_replay_request, parse_replay_reply
from cortex.ledger.kv_events import ReplayEnd, ReplayItem

DEFAULT_TIMEOUT_S = 3.0


@dataclass(frozen=True, slots=True)
class ReplayOutcome:
    start_seq: int
    items: tuple[ReplayItem, ...]
    ended: bool
    refused: bool
    malformed_frames: int = 0

    @property
    def truncated(self) -> bool:
        return not self.ended and not self.refused

    @property
    def first_seq(self) -> int | None:
        return self.items[0].seq if self.items else None

    def contiguous_from(self, start: int | None = None) -> tuple[ReplayItem, ...]:
        """The leading items numbered ``start, start + 1, ...`` (default: ``start_seq``)."""
        expected = self.start_seq if start is None else start
        run: list[ReplayItem] = []
        for item in self.items:
            if item.seq != expected:
                break
            run.append(item)
            expected += 1
        return tuple(run)


async def fetch_replay(
    ctx: zmq.Context,
    endpoint: str,
    start_seq: int,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_items: int | None = None,
) -> ReplayOutcome:
    """Request every buffered batch from ``start_seq`` and collect the replies.

    Never raises for anything the peer does; cancellation propagates."""
    if max_items is not None and max_items < 1:
        raise ValueError(f"max_items must be >= 1, got {max_items}")
    items: list[ReplayItem] = []
    malformed = 0
    replied = False
    ended = False
    dealer = ctx.socket(zmq.DEALER)
    dealer.ipv6 = True  # tcp://[v6 literal]:port endpoints (IPv4 ones still work)
    try:
        dealer.linger = 0
        dealer.connect(endpoint)
        with trio.move_on_after(timeout_s):
            await zmq_trio.send_multipart(dealer, encode_replay_request(start_seq))
            while max_items is None or len(items) < max_items:
                frames = await zmq_trio.recv_multipart(dealer)
                replied = True
                try:
                    reply = parse_replay_reply(frames)
                except DecodeError:
                    malformed += 1
                    continue
                if isinstance(reply, ReplayEnd):
                    ended = True
                    break
                items.append(reply)
    finally:
        dealer.close(linger=0)
    return ReplayOutcome(
        start_seq=start_seq,
        items=tuple(items),
        ended=ended,
        refused=not replied,
        malformed_frames=malformed,
    )
