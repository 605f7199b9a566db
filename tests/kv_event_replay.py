"""The simplest consumer of a simulated engine's KV events, for tests: it replays every event
in order and says which prefixes the engine holds.

(namespace, engine hash) -> path from the root, with a copy count, since vLLM may store and
remove one hash twice (two physical blocks). Replaying everything an engine published must
give exactly the engine's ``truth()``; an event that names an unknown parent or removes an
unknown hash fails an assertion.
"""

from __future__ import annotations

from collections import Counter

from cortex.ledger.kv_events import AllBlocksCleared, BlockRemoved, Event
from cortex.sim.batching.core import TruthEntry

Key = tuple[tuple[str | None, str | None], int]


class EventModel:
    """(namespace, hash) -> path, with a copy count."""

    def __init__(self) -> None:
        self.copies: Counter[Key] = Counter()
        self.entry: dict[Key, TruthEntry] = {}

    def apply(self, event: Event) -> None:
        if isinstance(event, AllBlocksCleared):
            self.copies.clear()
            self.entry.clear()
        elif isinstance(event, BlockRemoved):
            matches = [k for k in self.copies if k[1] in event.block_hashes]
            assert len(matches) == len(set(event.block_hashes)), "removal of an unknown hash"
            for key in matches:
                self.copies[key] -= 1
                if self.copies[key] == 0:
                    del self.copies[key], self.entry[key]
        else:
            ns = (event.lora_name, event.cache_salt)
            path: tuple[int, ...] = ()
            if event.parent_hash is not None:
                path = self.entry[(ns, event.parent_hash)][2]
            size = event.block_size
            for index, block_hash in enumerate(event.block_hashes):
                path += tuple(event.token_ids[index * size : (index + 1) * size])
                key = (ns, block_hash)
                assert self.entry.setdefault(key, (*ns, path)) == (*ns, path)
                self.copies[key] += 1

    def truth(self) -> set[TruthEntry]:
        return set(self.entry.values())
