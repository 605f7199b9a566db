# cython: language_level=3
"""The typed KV-event decoder's merge of SGLang's one-store-per-page runs, in C.

``extend_run(run, ev, tokens, map_era)`` appends the pages of the decoded SGLang store ``ev``
(a ``cortex.events.decoder_typed`` struct; ``tokens`` its unpacked token ids) to the
``BlockStored`` ``run`` decoded just before it, when ``ev`` continues it
(``cortex.events.decoder_semantics.continues``, the reference, which the generic path applies),
and says whether it did. It makes ``stored_event``'s checks on ``ev`` alone first (pages, token
count); anything unusual (binary hashes, a bad count) returns False and leaves ``run`` as it
was, for the ordinary path. Both paths give equal batches (tests/property/test_decoder_fuzz.py,
tests/property/test_page_fold.py). SGLang 0.5.15 publishes a 32k-token prompt at page size 1
as 32k stores: this keeps their decoding near msgspec's own cost.
"""

from cpython.array cimport array
from libc.stdint cimport uint64_t

cdef object _MASK = (1 << 64) - 1


def extend_run(object run, object ev, array tokens, bint map_era) -> bint:
    if not run.reproducible or run.group_idx is not None or run.kv_cache_spec_kind is not None:
        return False
    parent = ev.parent_block_hash
    if type(parent) is not int:
        return False
    cdef list hashes = ev.block_hashes
    cdef Py_ssize_t n = len(hashes), i
    size = ev.block_size
    if n == 0 or len(tokens) != n * size or size != run.block_size:
        return False
    if ev.medium != run.medium or ev.lora_id != run.lora_id:
        return False
    if map_era:
        if ev.lora_name != run.lora_name or ev.cache_salt != run.cache_salt:
            return False
    else:
        metadata = ev.metadata
        if run.lora_name is not None or run.cache_salt != (
                None if metadata is None else metadata.cache_salt):
            return False
    cdef list run_hashes = run.block_hashes
    if not run_hashes or (parent & _MASK) != run_hashes[len(run_hashes) - 1]:
        return False
    for i in range(n):
        if type(hashes[i]) is not int:
            return False
    for i in range(n):
        value = hashes[i]
        run_hashes.append(value if value >= 0 else value & _MASK)
    run.token_ids.extend(tokens)
    return True
