"""``consistent_hash``: for engines without KV events — the prompt's prefix names a ring point.

Rules:

* The ring holds ``virtual_nodes`` points per open worker at ``XXH3_64("<worker>#<i>")``; a
  worker's points depend only on its id, so a worker joining or leaving moves only the keys next
  to its own points. Rings are cached per set of open workers (at most ``_RING_CACHE`` sets).
* The request's point is the chained key of block ``min(prefix_blocks, len(keys)) - 1``, which
  names the whole leading prefix (a shared system prompt maps every request to one point; a
  longer ``prefix_blocks`` separates sessions). A prompt shorter than one block has no key:
  the policy declines and the next policy decides.
* Bounded loads: walking clockwise from the point, the first worker whose in-flight count after
  this request stays within ``ceil(load_factor × mean)`` (mean including this request) wins.
  Some worker is always at or below the mean, so the walk always ends.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence

import xxhash

from cortex.scheduling.decision import Decision, Mode
from cortex.scheduling.view import RequestFacts, WorkerView

_RING_CACHE = 64


class ConsistentHash:
    name = "consistent_hash"

    def __init__(
        self, prefix_blocks: int = 4, virtual_nodes: int = 64, load_factor: float = 1.25
    ) -> None:
        if prefix_blocks < 1 or virtual_nodes < 1 or load_factor < 1:
            raise ValueError("prefix_blocks and virtual_nodes must be >= 1, load_factor >= 1")
        self.prefix_blocks = prefix_blocks
        self.virtual_nodes = virtual_nodes
        self.load_factor = load_factor
        self._rings: dict[tuple[str, ...], tuple[list[int], list[str]]] = {}

    def ring(self, workers: tuple[str, ...]) -> tuple[list[int], list[str]]:
        """Sorted ring points and the worker owning each."""
        ring = self._rings.get(workers)
        if ring is None:
            points = sorted(
                (xxhash.xxh3_64_intdigest(f"{worker}#{i}".encode()), worker)
                for worker in workers for i in range(self.virtual_nodes)
            )
            ring = ([p for p, _ in points], [w for _, w in points])
            if len(self._rings) >= _RING_CACHE:
                self._rings.clear()
            self._rings[workers] = ring
        return ring

    def decide(
        self, request: RequestFacts, workers: Sequence[WorkerView], matched: Mapping[str, int]
    ) -> Decision | None:
        keys = request.keys
        if not len(keys):
            return None
        point = keys[min(self.prefix_blocks, len(keys)) - 1]
        by_id = {view.worker: view for view in workers}
        positions, owners = self.ring(tuple(sorted(by_id)))
        mean = (sum(view.in_flight for view in workers) + 1) / len(workers)
        cap = math.ceil(self.load_factor * mean)
        start = bisect.bisect_left(positions, point)
        home = None
        for step in range(len(owners)):
            owner = owners[(start + step) % len(owners)]
            if home is None:
                home = owner
            if by_id[owner].in_flight + 1 <= cap:
                reason = (f"ring point of the first {min(self.prefix_blocks, len(keys))} blocks"
                          + ("" if owner == home else f"; {home} above {cap} in flight, spilled"))
                return Decision(owner, Mode.CONSISTENT_HASH, reason)
        raise AssertionError("bounded-load walk found no worker at or below the mean")
