"""Ingestion counters of one target (one worker's DP rank): plain monotonic ints.

Pure data. The sync state machine counts what it decides (duplicates, gaps, restarts, replay
outcomes); the subscriber shell counts what it sees on the wire and what the ledger reported.
Metrics export reads these; nothing here knows about Prometheus.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields


@dataclass(slots=True)
class IngestCounters:
    # Wire (subscriber shell)
    messages: int = 0  # live multipart messages received
    malformed_frames: int = 0  # live or replay messages whose framing could not be parsed
    decode_errors: int = 0  # payloads that failed to decode (their events are lost)
    unknown_events: int = 0  # events with an unknown tag, skipped (applied batches only)
    unknown_fields: int = 0  # unknown keys / trailing elements inside known events
    topic_mismatch: int = 0  # messages whose topic does not start with the subscribed prefix
    rank_mismatch: int = 0  # applied batches stamped with another DP rank than the source's
    # Sequencing and sync (sync state machine)
    duplicates: int = 0  # live batches seen again (same seq, same payload), dropped
    replay_overlap: int = 0  # live batches already applied from a replay, dropped
    gaps: int = 0  # sequence gaps detected
    gaps_repaired: int = 0  # gaps closed by replay
    gaps_unrepaired: int = 0  # gaps that dropped the target's entries
    restarts: int = 0  # publisher sequence went backwards (engine restarted)
    replays: int = 0  # replay requests answered or timed out
    replay_refused: int = 0  # replay requests without any reply before the deadline
    replay_truncated: int = 0  # replies without end marker in time, or not contiguous
    replay_unrecoverable: int = 0  # replies starting after the requested sequence number
    snapshot_continued: int = 0  # warm starts whose peer snapshot the engine's replay continued
    snapshot_discarded: int = 0  # warm starts whose snapshot could not be proved continuous
    # Ledger (results of applied batches)
    batches_applied: int = 0
    stored_blocks: int = 0
    removed_blocks: int = 0
    unknown_parent: int = 0
    unknown_removal: int = 0
    duplicate_store: int = 0  # stores of a hash the target already held (refcount + 1)
    skipped_non_main: int = 0  # stores of KV-cache groups that are not prefix blocks
    hash_conflict: int = 0  # held hashes stored again with another key (entry replaced)
    invalid_events: int = 0  # events the ledger could not use (e.g. absurd block size)

    def add(self, other: IngestCounters) -> None:
        """Add every counter of ``other`` into this one."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def total(cls, counters: Iterable[IngestCounters]) -> IngestCounters:
        """The sum over several targets (a fresh object; the inputs are not touched)."""
        result = cls()
        for c in counters:
            result.add(c)
        return result
