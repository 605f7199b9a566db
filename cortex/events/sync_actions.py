"""What the per-target sync machine (``cortex.events.sync``) is handed and what it hands back.

Pure data, no behaviour beyond ``contiguous_run``: a ``SequencedBatch`` in (a live or replayed
batch with its publisher sequence number and payload digest), ``Action``s out, which the I/O
shell (``cortex.events.subscriber``) executes in order:

* ``ApplyBatch`` — apply the batch's events to the target's ledger (``replayed``: it came from
  a replay, for the counters);
* ``DropEntries`` — drop every entry the target holds (with the reason, for the log);
* ``SetState`` — publish a new ``TargetState`` (with the reason);
* ``RequestReplay`` — fetch a replay from ``start_seq`` and answer the machine with its result;
  always the last action of a list.

The order the machine emits them in, and why, is written in ``cortex.events.sync``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cortex.ledger.kv_events import AllBlocksCleared, EventBatch
from cortex.ledger.state import TargetState


@dataclass(frozen=True, slots=True)
class SequencedBatch:
    """A batch with its publisher sequence number and payload digest.

    ``batch`` is None when the payload could not be decoded (its events are lost).
    """

    seq: int
    digest: bytes
    batch: EventBatch | None

    @property
    def clears_cache(self) -> bool:
        return self.batch is not None and any(
            isinstance(e, AllBlocksCleared) for e in self.batch.events
        )


@dataclass(frozen=True, slots=True)
class ApplyBatch:
    seq: int
    batch: EventBatch
    replayed: bool


@dataclass(frozen=True, slots=True)
class DropEntries:
    reason: str


@dataclass(frozen=True, slots=True)
class SetState:
    state: TargetState
    reason: str


@dataclass(frozen=True, slots=True)
class RequestReplay:
    start_seq: int
    max_items: int | None  # None: as many as the publisher holds (shell's own cap)


Action = ApplyBatch | DropEntries | SetState | RequestReplay


def contiguous_run(items: Sequence[SequencedBatch], start: int) -> list[SequencedBatch]:
    """The longest prefix of ``items`` numbered ``start, start + 1, ...`` (empty if none)."""
    run: list[SequencedBatch] = []
    expected = start
    for item in items:
        if item.seq != expected:
            break
        run.append(item)
        expected += 1
    return run
