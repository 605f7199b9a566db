"""Model-based check of the warm start: a replica continues a peer's snapshot only when it is
the engine's truth.

Replica A follows a simulated publisher and takes a snapshot (its set-based ledger and
``resume_point``) at a random moment. The publisher goes on (more batches, restarts, a bounded
replay buffer); then replica B loads the snapshot and starts from it while batches are dropped,
duplicated, corrupted and replays answer fully, refuse or stop early. After every step B's
ledger must be exactly the engine's cache when B is READY and a subset of it when PARTIAL — a
snapshot that is no longer continuous must never survive.
"""

from __future__ import annotations

from collections import deque

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cortex.events.sync import TargetSync
from cortex.events.sync_actions import ApplyBatch, DropEntries, RequestReplay, SetState
from cortex.ledger.kv_events import BlockRemoved, BlockStored
from cortex.ledger.state import TargetState
from tests.property.test_sync_model import OPS, Publisher


class Replica:
    """The I/O shell over a set-based ledger; replays are answered from the publisher."""

    def __init__(self, pub: Publisher, data: st.DataObject | None) -> None:
        self.pub, self.data = pub, data
        self.sync = TargetSync(has_replay=True, window=64)
        self.ledger: set[int] = set()
        self.state = TargetState.SYNCING
        self.life = pub.life  # incarnation whose history the ledger follows

    def execute(self, actions: list) -> None:
        queue = deque(actions)
        while queue:
            action = queue.popleft()
            if isinstance(action, ApplyBatch):
                for event in action.batch.events:
                    if isinstance(event, BlockStored):
                        self.ledger.update(event.block_hashes)
                    elif isinstance(event, BlockRemoved):
                        self.ledger.difference_update(event.block_hashes)
                    else:
                        self.ledger.clear()
            elif isinstance(action, DropEntries):
                self.ledger.clear()
            elif isinstance(action, SetState):
                self.state = action.state
            else:
                assert isinstance(action, RequestReplay) and not queue
                mode = "ok" if self.data is None else self.data.draw(
                    st.sampled_from(["ok", "ok", "refused", "cut"]), label="replay")
                items = [m for m in self.pub.buffer if m.seq >= action.start_seq]
                ended = True
                refused = mode == "refused"
                if refused:
                    items, ended = [], False
                elif mode == "cut":
                    assert self.data is not None
                    items = items[: self.data.draw(st.integers(0, len(items)))]
                    ended = False
                self.life = self.pub.life
                queue.extend(self.sync.on_replay_result(items, ended=ended, refused=refused))

    def check(self, histories: dict[int, list]) -> None:
        if self.sync.replay_pending is not None:
            return
        assert self.state is self.sync.state
        nxt = self.sync.next_seq
        if self.state is TargetState.SYNCING or nxt is None:
            assert self.state is not TargetState.READY or not self.ledger
            return
        truth = self.pub.truth(histories[self.life], nxt - 1)
        if self.state is TargetState.READY:
            assert self.ledger == truth
        else:
            assert self.state is TargetState.PARTIAL
            assert self.ledger <= truth


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), buffer_steps=st.integers(1, 12))
def test_a_warm_started_ledger_is_true_when_ready_and_never_holds_false_hits(data,
                                                                           buffer_steps):
    pub = Publisher(buffer_steps)
    histories = {0: pub.history}
    peer = Replica(pub, None)
    peer.execute(peer.sync.start())
    for _ in range(data.draw(st.integers(1, 15), label="before snapshot")):
        peer.execute(peer.sync.on_live(pub.publish(data.draw(OPS, label="op"), False)))
    point = peer.sync.resume_point
    assert point is not None and peer.state is TargetState.READY
    snapshot = set(peer.ledger)
    # The engine goes on while B is not there yet (restarts included).
    for _ in range(data.draw(st.integers(0, 15), label="after snapshot")):
        if data.draw(st.integers(0, 9), label="restart?") == 0:
            pub.restart()
            histories[pub.life] = pub.history
        else:
            pub.publish(data.draw(OPS, label="op"), False)
    replica = Replica(pub, data)
    replica.ledger = set(snapshot)
    replica.execute(replica.sync.start_from_snapshot(*point))
    replica.check(histories)
    last = None
    new_life_pending = False
    blind = False
    for _ in range(data.draw(st.integers(0, 25), label="steps")):
        step = data.draw(st.sampled_from(["deliver"] * 6 + ["drop", "dup", "restart",
                                                              "corrupt"]), label="step")
        if step == "restart":
            pub.restart()
            histories[pub.life] = pub.history
            last = None
            new_life_pending = True
            continue
        if step == "dup":
            if last is None:
                continue
            msg = last
        else:
            msg = pub.publish(data.draw(OPS, label="op"), corrupt=step == "corrupt")
            if step == "drop":
                continue
        last = msg
        if new_life_pending:  # as in test_sync_model: a restart seen as seq >= next is blind
            nxt = replica.sync.next_seq
            blind = blind or (nxt is not None and msg.seq >= nxt)
            new_life_pending = False
        replica.life = pub.life
        replica.execute(replica.sync.on_live(msg))
        if not blind:
            replica.check(histories)
