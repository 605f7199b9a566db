"""Sequence-number tracking of one KV-event publisher (one engine process, one DP rank).

Pure: no I/O, no clock. Wire facts (kv-events.md §2, §6): a publisher numbers its non-empty
batches 0, 1, 2, ... without ever skipping; the counter restarts at 0 with the engine process;
ZeroMQ may drop messages for a slow subscriber, and a subscriber misses whatever was published
before its connection completed (slow joiner).

Rules of ``Sequencer.observe(seq, digest)`` (``next`` = the sequence number expected next):

1. No expectation yet (fresh, or after ``reset``) → ACCEPT. The first message after a
   (re)connect is never a gap: it may have any ``seq`` (slow joiner).
2. ``seq == next`` → ACCEPT.
3. ``seq > next`` → GAP(lo=next, hi=seq): batches ``[lo, hi)`` are missing.
4. ``seq < next`` and ``(seq, digest)`` is in the window of recently accepted batches →
   DUPLICATE. Payloads carry the engine's float timestamp, so a batch of a restarted engine
   never has the digest of an old batch with the same number.
5. ``seq < next`` otherwise → RESTART: the publisher's counter restarted with the engine.
   (A duplicate older than the window is indistinguishable from a restart and is treated as
   one; that only costs a resynchronisation.)

Only ACCEPT changes the state (``next = seq + 1``, the pair enters the window). After GAP,
DUPLICATE or RESTART the caller decides: ``accept`` a batch it applied (e.g. from a replay),
``expect`` a sequence number, or ``reset`` to forget the publisher.

Invariants: the window holds at most ``window`` pairs, the most recently accepted ones; every
seq in it is < ``next``. ``observe`` and ``accept`` are O(1).
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass

import xxhash

DEFAULT_WINDOW = 4096


def payload_digest(payload: bytes) -> bytes:
    """The digest the sequencer compares: 128-bit XXH3 of the payload bytes."""
    return xxhash.xxh3_128_digest(payload)


class VerdictKind(enum.Enum):
    ACCEPT = "accept"
    DUPLICATE = "duplicate"
    GAP = "gap"
    RESTART = "restart"


@dataclass(frozen=True, slots=True)
class Verdict:
    kind: VerdictKind
    # For GAP only: the missing range [lo, hi).
    lo: int | None = None
    hi: int | None = None

    @classmethod
    def gap(cls, lo: int, hi: int) -> Verdict:
        return cls(VerdictKind.GAP, lo, hi)


ACCEPT = Verdict(VerdictKind.ACCEPT)
DUPLICATE = Verdict(VerdictKind.DUPLICATE)
RESTART = Verdict(VerdictKind.RESTART)


class Sequencer:
    """Tracks ``next`` and a bounded window of accepted ``(seq, digest)`` pairs."""

    __slots__ = ("_next", "_recent", "_window")

    def __init__(self, window: int = DEFAULT_WINDOW) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        self._window = window
        self._next: int | None = None
        self._recent: OrderedDict[int, bytes] = OrderedDict()

    @property
    def next_seq(self) -> int | None:
        """The sequence number expected next, or None when nothing is expected."""
        return self._next

    @property
    def last_accepted(self) -> tuple[int, bytes] | None:
        """The most recently accepted ``(seq, digest)`` when ``next == seq + 1``, else None
        (nothing accepted since the last reset, or ``expect`` moved ``next`` since)."""
        if self._next is None or not self._recent:
            return None
        seq = next(reversed(self._recent))
        return (seq, self._recent[seq]) if seq + 1 == self._next else None

    def observe(self, seq: int, digest: bytes) -> Verdict:
        """Classify a live batch (rules 1-5 above); only ACCEPT records it."""
        expected = self._next
        if expected is None or seq == expected:
            self.accept(seq, digest)
            return ACCEPT
        if seq > expected:
            return Verdict.gap(expected, seq)
        if self._recent.get(seq) == digest:
            return DUPLICATE
        return RESTART

    def accept(self, seq: int, digest: bytes) -> None:
        """Record a batch the caller applied: ``next = seq + 1``, the pair enters the window."""
        if self._next is not None and seq < self._next:
            # Going backwards (a new incarnation accepted without reset): older pairs with
            # numbers >= seq belong to the previous timeline.
            self._recent.clear()
        recent = self._recent
        recent[seq] = digest
        recent.move_to_end(seq)
        if len(recent) > self._window:
            recent.popitem(last=False)
        self._next = seq + 1

    def expect(self, next_seq: int | None) -> None:
        """Set the sequence number expected next without recording a batch (None: nothing)."""
        if next_seq is not None and self._next is not None and next_seq < self._next:
            self._recent.clear()
        self._next = next_seq

    def reset(self) -> None:
        """Forget the publisher: no expectation, empty window (reconnect / restart)."""
        self._next = None
        self._recent.clear()
