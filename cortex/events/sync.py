"""The per-target sync state machine: how far the ledger of one (worker, DP rank) is trusted.

Pure: no I/O, no clock. It turns live batches (through a ``Sequencer``), replay results and
the facts of each batch (decodable? contains AllBlocksCleared?) into ``Action`` lists that the
I/O shell executes in order, and it moves the target through the ``TargetState`` values of
``cortex.ledger.state``. The shell decodes every payload before handing it in (``batch=None``
means the payload could not be decoded), so no feedback from the ledger is needed.

Rules (``has_replay`` = the target has a replay endpoint):

* Start / reconnect (``start``): drop the target's entries, SYNCING. With replay: request a
  replay from 0 and hold live batches meanwhile. Without replay: the first live batch decides:
  seq 0 → READY, seq > 0 → PARTIAL (slow joiner: history before it is unknown).
* History replay result (replay from 0):
  - complete (end marker seen, items contiguous) and starting at 0, or only the end marker
    (nothing was ever published) → apply the items → READY, expect the next number;
  - items start after 0 (buffer no longer reaches back), are not contiguous, or came without
    end marker in time → apply the contiguous run from the first item → PARTIAL;
  - refused (no reply at all) → PARTIAL, no expectation (the next live batch is accepted);
    ``history_refused`` then asks the shell to try again later (``retry_history``: drop,
    SYNCING, replay from 0 — with backoff, the shell's), and a first live batch numbered 0
    proves the stream complete by itself: READY (the ledger was empty since the start).
  Then the held live batches are processed as if they had just arrived: batches the replay
  already covered are dropped by sequence number; a gap among them is repaired as below.
* Warm start (``start_from_snapshot(seq, digest)``): the shell has just loaded a peer replica's
  snapshot of the target, taken after batch ``seq`` whose payload digest was ``digest``, into
  a target holding nothing else: SYNCING, request a replay from ``seq`` (not ``seq + 1``: the
  batch the snapshot ends with must be seen again to prove it is the same publisher's).
  - The reply is complete (end marker, contiguous) and its first item is ``seq`` with
    ``digest`` → the snapshot continues in this engine's stream: apply the items after it →
    READY, expect the next number. This is the only way a snapshot is kept.
  - Anything else → discard the snapshot (drop the entries): the buffer no longer reaches back
    to ``seq`` (first item later, or none), the engine restarted (a different digest at
    ``seq``, or fewer batches than ``seq``), or the reply is truncated. Then as at start:
    refused → PARTIAL (the same endpoint would refuse a history replay too); otherwise request
    a history replay from 0. A snapshot that cannot be proved continuous is never kept.
  (Digests compare payloads, which carry the engine's timestamp: a restarted engine that got
  back to ``seq`` has another batch there.)
* GAP(lo, hi) while READY or PARTIAL: with replay → STALE, hold live batches, request a
  replay from ``lo`` (at most ``hi - lo + 1`` items). The replay closes the gap when its items
  are contiguous from ``lo`` up to at least ``hi - 1`` and it either ended with the end marker
  or reached ``hi``: apply them, back to the state before the gap, then the held batches.
  Otherwise (first item after ``lo``, truncated, refused) → PARTIAL, drop the target's entries
  (missed removals would be false hits), expect ``hi`` and continue with the held batches.
  Without replay → PARTIAL, drop the entries, continue with the batch that showed the gap.
* RESTART (sequence went backwards): drop the entries; the new incarnation's seq 0 → READY
  (its cache started empty); a first seq > 0 → as at start (replay from 0, else PARTIAL).
  Limit: a restart is visible only when the sequence goes backwards. If the new process's
  first batch we receive has seq >= next (its earlier ones lost), no sequencer can tell;
  health probes (a restarted engine was unhealthy) must catch that case.
* DUPLICATE → dropped and counted (as ``replay_overlap`` when a replay already applied it).
* A batch that could not be decoded lost its events → PARTIAL, drop the entries (like an
  unrepaired gap), continue after it.
* A batch containing AllBlocksCleared applied while PARTIAL → READY (the engine's cache is
  known empty from that point; everything after it is applied in order).
* Suspected restart (``suspect(why)``: the shell saw the engine unreachable — a failed probe or
  connect — or its identity change): a sequencer cannot see a restart whose new process has
  not published yet, and the ledger would then claim blocks the new engine lacks. While READY
  or PARTIAL with a batch applied: STALE (entries kept, not routable), live batches held
  (more than ``SUSPECT_HOLD_MAX`` held: give up, as below). ``verify()`` (the engine answers
  again): with replay, request a replay from the last applied batch ``seq`` and prove the
  stream continues it exactly as a warm start does (first item ``seq`` with the same digest,
  complete) → apply what follows, back to the state before; anything else → the engine
  restarted or cannot prove it did not: drop the entries, SYNCING, history replay from 0
  (refused → PARTIAL). Without replay nothing can prove it: drop the entries and start over
  (the next batch decides). Nothing applied yet, or already unroutable: nothing to suspect.
  A suspicion arriving while a replay is pending is taken up when it ends.

What goes in and comes out (``SequencedBatch``, the ``Action`` types) is in
``cortex.events.sync_actions``. Ordering invariants of the emitted actions (the shell may checkpoint between actions):
a downgrade's ``SetState`` comes before the drops and applies it justifies; an upgrade to
READY comes after the applies that justify it. While batches from a replay are applied the
published state is SYNCING or STALE (never exact-routable). ``RequestReplay`` is always the
last action of a list; the shell fetches and answers with ``on_replay_result``. While a
replay is pending every live batch is held.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from cortex.events.counters import IngestCounters
from cortex.events.sequencer import DEFAULT_WINDOW, Sequencer, VerdictKind
from cortex.events.sync_actions import (
    Action,
    ApplyBatch,
    DropEntries,
    RequestReplay,
    SequencedBatch,
    SetState,
    contiguous_run,
)
from cortex.ledger.state import TargetState

SYNCING = TargetState.SYNCING
READY = TargetState.READY
STALE = TargetState.STALE
PARTIAL = TargetState.PARTIAL


class _Purpose(enum.Enum):
    HISTORY = "history"
    GAP = "gap"
    SNAPSHOT = "snapshot"  # a peer's snapshot, or our own ledger after a suspected restart


SUSPECT_HOLD_MAX = 10_000  # live batches held while a suspected restart awaits its proof


@dataclass(frozen=True, slots=True)
class _PendingReplay:
    purpose: _Purpose
    request: RequestReplay
    hi: int = 0  # GAP: first held sequence number
    # GAP: state to return to when the gap is closed; SNAPSHOT: when the snapshot is proved
    resume: TargetState = PARTIAL
    digest: bytes = b""  # SNAPSHOT: digest of batch ``request.start_seq`` in the snapshot
    label: str = "warm start: snapshot"  # SNAPSHOT: whose entries to prove (for reasons)


def _reason_after_run(final: TargetState, planned: TargetState, reason: str) -> str:
    if final is planned:
        return reason
    if final is READY:
        return f"{reason}; AllBlocksCleared among the replayed batches"
    return f"{reason}; a replayed batch could not be decoded"


class TargetSync:
    """Sync state of one target. Call ``start`` first; then feed live batches and replays."""

    def __init__(
        self,
        *,
        has_replay: bool,
        counters: IngestCounters | None = None,
        window: int = DEFAULT_WINDOW,
    ) -> None:
        self.has_replay = has_replay
        self.counters = counters if counters is not None else IngestCounters()
        self._seq = Sequencer(window)
        self._state = SYNCING
        self._reason = "not started"
        self._pending: _PendingReplay | None = None
        self._held: list[SequencedBatch] = []
        self._replayed_upto: int | None = None  # highest seq applied from a replay
        self._suspected: TargetState | None = None  # the state before a suspected restart
        self._suspicion_due: str | None = None  # a suspicion that arrived during a replay
        self._history_refused = False  # the last history replay got no reply: try again

    # --- read-only view ---------------------------------------------------------------

    @property
    def state(self) -> TargetState:
        return self._state

    @property
    def reason(self) -> str:
        return self._reason

    @property
    def replay_pending(self) -> RequestReplay | None:
        return self._pending.request if self._pending is not None else None

    @property
    def held(self) -> int:
        return len(self._held)

    @property
    def next_seq(self) -> int | None:
        return self._seq.next_seq

    @property
    def history_refused(self) -> bool:
        """The history replay got no reply and nothing proved the ledger complete since: the
        shell should ``retry_history`` later."""
        return self._history_refused

    @property
    def resume_point(self) -> tuple[int, bytes] | None:
        """``(seq, digest)`` of the last applied batch when the ledger is READY and follows the
        stream up to it with nothing pending: what a snapshot of the target records (a peer
        continues from it with ``start_from_snapshot``). None otherwise."""
        if self._state is not READY or self._pending is not None or self._held:
            return None
        return self._seq.last_accepted

    # --- inputs -----------------------------------------------------------------------

    def start(self) -> list[Action]:
        """(Re)connected: forget everything, drop the entries, fetch history if possible."""
        out: list[Action] = []
        self._seq.reset()
        self._pending = None
        self._held = []
        self._replayed_upto = None
        self._suspected = self._suspicion_due = None
        self._history_refused = False
        self._set(SYNCING, "started: history unknown", out, force=True)
        out.append(DropEntries("start: history unknown"))
        if self.has_replay:
            self._request_history(out)
        return out

    def start_from_snapshot(self, seq: int, digest: bytes) -> list[Action]:
        """(Re)connected with a peer's snapshot already loaded (taken after batch ``seq``,
        payload ``digest``): check that this engine's stream continues it (rules above)."""
        if not self.has_replay:
            raise RuntimeError("a snapshot can only be continued through a replay endpoint")
        if seq < 0:
            raise ValueError(f"snapshot sequence number must be >= 0, got {seq}")
        out: list[Action] = []
        self._seq.reset()
        self._held = []
        self._replayed_upto = None
        self._set(SYNCING, f"warm start: snapshot up to sequence {seq}, checking the engine's "
                  "replay reaches back to it", out, force=True)
        request = RequestReplay(seq, None)
        self._pending = _PendingReplay(_Purpose.SNAPSHOT, request, resume=READY, digest=digest)
        out.append(request)
        return out

    def retry_history(self) -> list[Action]:
        """Ask again for the history a refused replay did not give: start over (drop, SYNCING,
        replay from 0; live batches held). Nothing to do unless ``history_refused``."""
        if not self._history_refused or self._pending is not None or self._suspected:
            return []
        held, self._held = self._held, []
        out = self.start()
        self._held = held
        return out

    def suspect(self, why: str) -> list[Action]:
        """The engine may have restarted without a sign in its stream yet (rules above)."""
        out: list[Action] = []
        if self._pending is not None:
            self._suspicion_due = why
        elif (self._suspected is None and self._state in (READY, PARTIAL)
              and self._seq.last_accepted is not None):
            self._suspected = self._state
            self._set(STALE, f"{why}: the engine may have restarted", out)
        return out

    def verify(self) -> list[Action]:
        """The suspected engine answers again: prove its stream continues the ledger's."""
        out: list[Action] = []
        resume, self._suspected = self._suspected, None
        if resume is None or self._pending is not None:
            return out
        last = self._seq.last_accepted
        assert last is not None
        if not self.has_replay:
            held, self._held = self._held, []
            out.extend(self.start())
            self._reason = "engine unreachable, nothing to prove its stream continued"
            for msg in held:
                self._receive(msg, out)
            return out
        seq, digest = last
        self._seq.reset()
        request = RequestReplay(seq, None)
        self._pending = _PendingReplay(_Purpose.SNAPSHOT, request, resume=resume,
                                       digest=digest, label="after the engine was unreachable,"
                                       " the ledger")
        self._set(STALE, f"checking the engine's replay continues sequence {seq}", out,
                  force=True)
        out.append(request)
        return out

    def on_live(self, msg: SequencedBatch) -> list[Action]:
        out: list[Action] = []
        self._receive(msg, out)
        return out

    def on_replay_result(
        self, items: Sequence[SequencedBatch], *, ended: bool, refused: bool
    ) -> list[Action]:
        """The outcome of the pending replay: items in the order received, ``ended`` (end
        marker seen), ``refused`` (no reply at all before the deadline)."""
        pending = self._pending
        if pending is None:
            raise RuntimeError("on_replay_result without a pending replay")
        self._pending = None
        held, self._held = self._held, []
        out: list[Action] = []
        self.counters.replays += 1
        if pending.purpose is _Purpose.HISTORY:
            self._finish_history(items, ended, refused, out)
        elif pending.purpose is _Purpose.SNAPSHOT:
            self._finish_snapshot(pending, items, ended, refused, out)
        else:
            self._finish_gap(pending, items, ended, refused, out)
        for msg in held:
            self._receive(msg, out)
        due, self._suspicion_due = self._suspicion_due, None
        if due is not None and self._pending is None:
            out.extend(self.suspect(due))
        return out

    def _give_up_suspicion(self, out: list[Action]) -> None:
        """Too much arrived while the engine's continuity was unproven: start over."""
        held, self._held = self._held, []
        self._suspected = None
        out.extend(self.start())
        for msg in held:
            self._receive(msg, out)

    # --- live batches -----------------------------------------------------------------

    def _receive(self, msg: SequencedBatch, out: list[Action]) -> None:
        if self._pending is not None or self._suspected is not None:
            self._held.append(msg)
            if self._pending is None and len(self._held) > SUSPECT_HOLD_MAX:
                self._give_up_suspicion(out)
            return
        verdict = self._seq.observe(msg.seq, msg.digest)
        kind = verdict.kind
        if kind is VerdictKind.ACCEPT:
            if self._state is SYNCING:  # first batch without replay: where did we join?
                if msg.seq == 0:
                    self._set(READY, "first batch is sequence 0", out)
                else:
                    self._set(PARTIAL, f"joined at sequence {msg.seq} without replay", out)
            elif self._history_refused and msg.seq == 0 and self._state is PARTIAL:
                # nothing applied since the refused replay emptied the ledger: whole after all
                self._set(READY, "history replay refused, but the stream starts at sequence 0",
                          out)
            self._apply_live(msg, out)
        elif kind is VerdictKind.DUPLICATE:
            if self._replayed_upto is not None and msg.seq <= self._replayed_upto:
                self.counters.replay_overlap += 1
            else:
                self.counters.duplicates += 1
        elif kind is VerdictKind.GAP:
            assert verdict.lo is not None and verdict.hi is not None
            self._on_gap(msg, verdict.lo, verdict.hi, out)
        else:
            self._on_restart(msg, out)

    def _on_gap(self, msg: SequencedBatch, lo: int, hi: int, out: list[Action]) -> None:
        self.counters.gaps += 1
        if self.has_replay:
            resume = self._state if self._state in (READY, PARTIAL) else PARTIAL
            self._set(STALE, f"sequence gap [{lo}, {hi})", out)
            request = RequestReplay(lo, hi - lo + 1)
            self._pending = _PendingReplay(_Purpose.GAP, request, hi, resume)
            self._held.append(msg)
            out.append(request)
            return
        self.counters.gaps_unrepaired += 1
        reason = f"sequence gap [{lo}, {hi}) and no replay endpoint"
        self._set(PARTIAL, reason, out)
        out.append(DropEntries(reason))
        self._seq.accept(msg.seq, msg.digest)
        self._apply_live(msg, out)

    def _on_restart(self, msg: SequencedBatch, out: list[Action]) -> None:
        self.counters.restarts += 1
        self._seq.reset()
        self._replayed_upto = None
        if msg.seq == 0:
            out.append(DropEntries("publisher restarted"))
            self._set(READY, "publisher restarted at sequence 0", out)
        elif self.has_replay:
            self._set(SYNCING, f"publisher restarted, first seen sequence {msg.seq}", out)
            out.append(DropEntries("publisher restarted"))
            self._held.append(msg)
            self._request_history(out)
            return
        else:
            reason = f"publisher restarted, joined at sequence {msg.seq} without replay"
            self._set(PARTIAL, reason, out)
            out.append(DropEntries("publisher restarted"))
        self._seq.accept(msg.seq, msg.digest)
        self._apply_live(msg, out)

    def _apply_live(self, msg: SequencedBatch, out: list[Action]) -> None:
        """Apply one accepted live batch (already recorded by the sequencer)."""
        if msg.batch is None:
            reason = f"batch {msg.seq} could not be decoded"
            self._set(PARTIAL, reason, out)
            out.append(DropEntries(reason))
            return
        out.append(ApplyBatch(msg.seq, msg.batch, replayed=False))
        if self._state is PARTIAL and msg.clears_cache:
            self._set(READY, f"AllBlocksCleared in batch {msg.seq}", out)

    # --- replays ----------------------------------------------------------------------

    def _request_history(self, out: list[Action]) -> None:
        request = RequestReplay(0, None)
        self._pending = _PendingReplay(_Purpose.HISTORY, request)
        out.append(request)

    def _apply_run(
        self, run: Sequence[SequencedBatch], logical: TargetState, out: list[Action]
    ) -> TargetState:
        """Apply replayed batches in order while the published state is not routable.

        Returns the state they justify, starting from ``logical``."""
        for msg in run:
            self._seq.accept(msg.seq, msg.digest)
            self._replayed_upto = msg.seq
            if msg.batch is None:
                logical = PARTIAL
                out.append(DropEntries(f"replayed batch {msg.seq} could not be decoded"))
                continue
            out.append(ApplyBatch(msg.seq, msg.batch, replayed=True))
            if logical is PARTIAL and msg.clears_cache:
                logical = READY
        return logical

    def _finish_history(
        self, items: Sequence[SequencedBatch], ended: bool, refused: bool, out: list[Action]
    ) -> None:
        if refused:
            self.counters.replay_refused += 1
            self._history_refused = True
            self._set(PARTIAL, "history replay refused (no reply in time)", out)
            return
        first = items[0].seq if items else None
        run = contiguous_run(items, first) if first is not None else []
        complete = ended and len(run) == len(items)
        if not complete:
            self.counters.replay_truncated += 1
        if first is not None and first > 0:
            self.counters.replay_unrecoverable += 1
        if complete and first in (None, 0):
            logical, reason = READY, "history replayed from sequence 0"
        elif first is not None and first > 0:
            logical, reason = PARTIAL, f"replay buffer starts at sequence {first}"
        else:
            logical, reason = PARTIAL, "history replay truncated"
        final = self._apply_run(run, logical, out)
        if not run and complete:
            self._seq.expect(0)  # nothing published yet: the first batch must be 0
        self._set(final, _reason_after_run(final, logical, reason), out)

    def _finish_snapshot(
        self,
        pending: _PendingReplay,
        items: Sequence[SequencedBatch],
        ended: bool,
        refused: bool,
        out: list[Action],
    ) -> None:
        seq, label = pending.request.start_seq, pending.label
        warm = label == "warm start: snapshot"  # (a suspected restart is counted as one)
        if refused:
            self.counters.replay_refused += 1
            self.counters.snapshot_discarded += warm
            reason = f"{label} up to sequence {seq}: replay refused (no reply in time), dropped"
            self._set(PARTIAL, reason, out)
            out.append(DropEntries(reason))
            return
        run = contiguous_run(items, seq)
        proven = bool(ended and run and len(run) == len(items)
                      and run[0].digest == pending.digest)
        if proven:
            self.counters.snapshot_continued += warm
            self._seq.accept(seq, pending.digest)  # the batch the entries end with
            final = self._apply_run(run[1:], pending.resume, out)
            reason = f"{label} up to sequence {seq} continued by replay"
            if final is not pending.resume:
                reason = _reason_after_run(final, pending.resume, reason)
            self._set(final, reason, out)
            return
        self.counters.snapshot_discarded += warm
        self.counters.restarts += not warm
        if not items or items[0].seq != seq:
            self.counters.replay_unrecoverable += 1
            why = "the engine's replay no longer reaches back to it"
        elif items[0].digest != pending.digest:
            why = "another batch at that sequence number (engine restarted)"
        else:
            self.counters.replay_truncated += 1
            why = "replay truncated"
        reason = f"{label} up to sequence {seq} dropped: {why}"
        self._set(SYNCING, reason, out, force=True)
        out.append(DropEntries(reason))
        self._request_history(out)

    def _finish_gap(
        self,
        pending: _PendingReplay,
        items: Sequence[SequencedBatch],
        ended: bool,
        refused: bool,
        out: list[Action],
    ) -> None:
        lo, hi = pending.request.start_seq, pending.hi
        if refused:
            self.counters.replay_refused += 1
            self._unrepaired(lo, hi, "replay refused (no reply in time)", out)
            return
        usable = [m for m in items if m.seq >= lo]
        run = contiguous_run(usable, lo)
        last = run[-1].seq if run else None
        if last is not None and last >= hi - 1 and (ended or last >= hi):
            self.counters.gaps_repaired += 1
            final = self._apply_run(run, pending.resume, out)
            reason = f"gap [{lo}, {hi}) repaired by replay"
            self._set(final, _reason_after_run(final, pending.resume, reason), out)
            return
        if not usable or usable[0].seq > lo:
            self.counters.replay_unrecoverable += 1
            why = "replay buffer no longer holds it"
        else:
            self.counters.replay_truncated += 1
            why = "replay truncated"
        self._unrepaired(lo, hi, why, out)

    def _unrepaired(self, lo: int, hi: int, why: str, out: list[Action]) -> None:
        self.counters.gaps_unrepaired += 1
        reason = f"gap [{lo}, {hi}) not repaired: {why}"
        self._set(PARTIAL, reason, out)
        out.append(DropEntries(reason))
        self._seq.expect(hi)

    # --- state ------------------------------------------------------------------------

    def _set(
        self, state: TargetState, reason: str, out: list[Action], *, force: bool = False
    ) -> None:
        self._reason = reason
        if state is READY:
            self._history_refused = False  # proved complete: nothing to fetch again
        if state is not self._state or force:
            self._state = state
            out.append(SetState(state, reason))
