"""The KV events a simulated vLLM engine publishes, built one way for every model of its cache
(``cortex.sim.prefix_cache.VllmPrefixCache``, ``cortex.sim.batching.vllm_blocks``).

Pure. Field values (``shared/protocols/kv-events.md``; the wire encoder, ``cortex.sim.wire``,
drops the fields an engine version does not send):

* ``BlockStored``: one per store of consecutive full blocks of one request; ``parent_hash`` is
  the hash of the block before them (None when they start at block 0); ``token_ids`` are their
  tokens; medium ``"GPU"``, KV cache group 0 of kind ``"full_attention"`` (one group: the
  simulated model is plain attention); ``lora_name`` and the engine's adapter id
  (``LoraRegistry.lora_id``) for a LoRA request; the request's ``cache_salt``.
* ``BlockRemoved``: one per evicted block, one hash each, medium ``"GPU"``, group 0.
* ``note_digests`` records the raw digest of each hash an event names, for the bytes-hash wire
  mode (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from cortex.ledger.kv_events import BlockRemoved, BlockStored
from cortex.sim.engine_hashes import BlockHash

MEDIUM = "GPU"
GROUP_IDX = 0
KV_CACHE_SPEC_KIND = "full_attention"


def vllm_block_stored(
    hashes: Sequence[BlockHash],
    parent: BlockHash | None,
    token_ids: Sequence[int],
    block_size: int,
    *,
    lora_name: str | None,
    lora_id: int | None,
    cache_salt: str | None,
) -> BlockStored:
    """The store of ``hashes`` (consecutive blocks after ``parent``) holding ``token_ids``."""
    return BlockStored(
        block_hashes=[h.value for h in hashes],
        parent_hash=None if parent is None else parent.value,
        token_ids=list(token_ids),
        block_size=block_size,
        medium=MEDIUM,
        lora_name=lora_name,
        lora_id=lora_id,
        cache_salt=cache_salt,
        group_idx=GROUP_IDX,
        kv_cache_spec_kind=KV_CACHE_SPEC_KIND,
    )


def vllm_block_removed(block_hash: BlockHash) -> BlockRemoved:
    """The eviction of one block."""
    return BlockRemoved([block_hash.value], medium=MEDIUM, group_idx=GROUP_IDX)


def note_digests(digests: dict[int, bytes], hashes: Iterable[BlockHash]) -> None:
    """Record the raw digest of each of ``hashes`` (SGLang's have none)."""
    for h in hashes:
        if h.digest is not None:
            digests[h.value] = h.digest
