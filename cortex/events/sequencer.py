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

Invariants: the window holds at most ``window`` pairs, accepted among the last ``window``
sequence numbers (a ring indexed by ``seq % window``); every seq in it is < ``next``.
``observe`` and ``accept`` are O(1).
"""

from __future__ import annotations

import enum
from array import array
from dataclasses import dataclass

import xxhash

DEFAULT_WINDOW = 4096
DIGEST_BYTES = 16  # ``payload_digest``'s size


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
    """Tracks ``next`` and a bounded window of accepted ``(seq, digest)`` pairs.

    The window is a ring of ``window`` slots in two flat buffers allocated at the first accept:
    the pair of ``seq`` sits in slot ``seq % window`` (a later seq with the same slot replaces
    it), so it holds the pairs accepted among the last ``window`` sequence numbers, in 25 bytes
    a slot. Accepting allocates nothing that outlives the call: a flood of batches leaves no
    trail of small objects behind (one ``int`` and one ``bytes`` per remembered batch pinned
    allocator pages after a 300k-batch flood, issue 22 §6).
    """

    __slots__ = ("_digests", "_filled", "_last", "_next", "_seqs", "_window")

    def __init__(self, window: int = DEFAULT_WINDOW) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        self._window = window
        self._next: int | None = None
        self._last: int | None = None  # the most recently accepted seq (None: none since reset)
        self._seqs: array[int] | None = None  # slot -> its seq (valid where ``_filled``)
        self._filled = b""  # slot -> 1 when it holds a pair (a bytearray once allocated)
        self._digests = b""  # slot -> its digest, DIGEST_BYTES each

    @property
    def next_seq(self) -> int | None:
        """The sequence number expected next, or None when nothing is expected."""
        return self._next

    @property
    def last_accepted(self) -> tuple[int, bytes] | None:
        """The most recently accepted ``(seq, digest)`` when ``next == seq + 1``, else None
        (nothing accepted since the last reset, or ``expect`` moved ``next`` since)."""
        seq = self._last
        if seq is None or self._next != seq + 1:
            return None
        return seq, self._digest_at(seq % self._window)

    def observe(self, seq: int, digest: bytes) -> Verdict:
        """Classify a live batch (rules 1-5 above); only ACCEPT records it."""
        expected = self._next
        if expected is None or seq == expected:
            self.accept(seq, digest)
            return ACCEPT
        if seq > expected:
            return Verdict.gap(expected, seq)
        return DUPLICATE if self._holds(seq, digest) else RESTART

    def accept(self, seq: int, digest: bytes) -> None:
        """Record a batch the caller applied: ``next = seq + 1``, the pair enters the window."""
        if len(digest) != DIGEST_BYTES:
            raise ValueError(f"a digest has {DIGEST_BYTES} bytes, got {len(digest)}")
        if self._next is not None and seq < self._next:
            # Going backwards (a new incarnation accepted without reset): older pairs with
            # numbers >= seq belong to the previous timeline.
            self._clear()
        if self._seqs is None:
            self._seqs = array("Q", bytes(8 * self._window))
            self._filled = bytearray(self._window)
            self._digests = bytearray(DIGEST_BYTES * self._window)
        slot = seq % self._window
        self._seqs[slot] = seq
        self._filled[slot] = 1
        self._digests[slot * DIGEST_BYTES:(slot + 1) * DIGEST_BYTES] = digest
        self._last = seq
        self._next = seq + 1

    def expect(self, next_seq: int | None) -> None:
        """Set the sequence number expected next without recording a batch (None: nothing)."""
        if next_seq is not None and self._next is not None and next_seq < self._next:
            self._clear()
        self._next = next_seq

    def reset(self) -> None:
        """Forget the publisher: no expectation, empty window (reconnect / restart)."""
        self._next = None
        self._clear()

    def _clear(self) -> None:
        self._last = None
        if self._seqs is not None:
            self._filled[:] = bytes(self._window)

    def _holds(self, seq: int, digest: bytes) -> bool:
        slot = seq % self._window
        return (self._seqs is not None and self._filled[slot] == 1 and self._seqs[slot] == seq
                and self._digest_at(slot) == digest)

    def _digest_at(self, slot: int) -> bytes:
        return bytes(self._digests[slot * DIGEST_BYTES:(slot + 1) * DIGEST_BYTES])
