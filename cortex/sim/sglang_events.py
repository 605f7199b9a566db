"""SGLang's KV events as its recorder builds them, and its queue that coalesces them.

Pure. Facts from SGLang 0.5.23's ``mem_cache/events.py::KVCacheEventRecorder``
(``shared/protocols/engine-scheduling.md`` §8.3); both simulated SGLang caches (the one-shot
``cortex.sim.prefix_cache.SglangPrefixCache`` and the batching model's radix tree,
``cortex.sim.batching.sglang_radix``) build their events here, so the two publish the same
fields:

* ``medium`` is always ``"GPU"``; ``lora_id`` is never set (SGLang publishes the adapter's
  name); ``group_idx`` and ``kv_cache_spec_kind`` are left unset;
* a ``BlockStored`` names the pages of one radix node, chained to the last page of its parent
  node (``parent_hash`` None under the root), with the node's tokens and
  ``block_size = page_size``;
* a ``BlockRemoved`` names every page of one evicted node.

``SglangEventQueue`` holds events until the engine publishes them (after a prefill batch,
every ``decode_log_interval``-th decode batch, when idle). Like ``enqueue``, it merges an event
into the queue's tail when the two continue each other: two removals (same medium), or a store
whose parent is the last page of the tail store, in the same namespace (LoRA, salt) and page
size. Merging never changes what a consumer ends up with; it only makes fewer events.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cortex.ledger.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, Event

SGLANG_MEDIUM = "GPU"


def pages_stored(
    block_hashes: Sequence[int],
    parent_hash: int | None,
    token_ids: Sequence[int],
    page_size: int,
    lora_name: str | None,
    cache_salt: str | None,
) -> BlockStored:
    """The store of consecutive pages of one radix path."""
    return BlockStored(
        block_hashes=list(block_hashes),
        parent_hash=parent_hash,
        token_ids=list(token_ids),
        block_size=page_size,
        medium=SGLANG_MEDIUM,
        lora_name=lora_name,
        cache_salt=cache_salt,
    )


def pages_removed(block_hashes: Sequence[int]) -> BlockRemoved:
    """The removal of evicted pages."""
    return BlockRemoved(list(block_hashes), medium=SGLANG_MEDIUM)


@dataclass(slots=True)
class _PendingStore:
    hashes: list[int]
    parent: int | None
    tokens: list[int]
    page_size: int
    lora_name: str | None
    cache_salt: str | None


class SglangEventQueue:
    """Events recorded and not yet published, in recording order (merged as SGLang merges)."""

    def __init__(self) -> None:
        self._queue: list[_PendingStore | list[int] | AllBlocksCleared] = []

    def __len__(self) -> int:
        return len(self._queue)

    def record_store(
        self,
        block_hashes: Sequence[int],
        parent_hash: int | None,
        token_ids: Sequence[int],
        page_size: int,
        lora_name: str | None,
        cache_salt: str | None,
    ) -> None:
        if not block_hashes:
            return
        tail = self._queue[-1] if self._queue else None
        if (
            isinstance(tail, _PendingStore)
            and tail.hashes[-1] == parent_hash
            and tail.page_size == page_size
            and tail.lora_name == lora_name
            and tail.cache_salt == cache_salt
        ):
            tail.hashes.extend(block_hashes)
            tail.tokens.extend(token_ids)
            return
        self._queue.append(_PendingStore(
            list(block_hashes), parent_hash, list(token_ids), page_size, lora_name, cache_salt))

    def record_remove(self, block_hashes: Sequence[int]) -> None:
        if not block_hashes:
            return
        tail = self._queue[-1] if self._queue else None
        if isinstance(tail, list):
            tail.extend(block_hashes)
        else:
            self._queue.append(list(block_hashes))

    def record_all_cleared(self) -> None:
        self._queue.append(AllBlocksCleared())

    def take(self) -> list[Event]:
        """Every queued event, now (the queue is left empty)."""
        events: list[Event] = []
        for item in self._queue:
            if isinstance(item, _PendingStore):
                events.append(pages_stored(item.hashes, item.parent, item.tokens,
                                           item.page_size, item.lora_name, item.cache_salt))
            elif isinstance(item, list):
                events.append(pages_removed(item))
            else:
                events.append(item)
        self._queue = []
        return events

    def clear(self) -> None:
        """Drop everything queued (an engine restart publishes nothing)."""
        self._queue = []
