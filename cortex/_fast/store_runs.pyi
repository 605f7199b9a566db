"""Contract of ``cortex._fast.store_runs``: see the module's docstring (the typed decoder's
merge of SGLang page runs; reference ``cortex.events.decoder_semantics.continues``)."""

from array import array

from cortex.ledger.kv_events import BlockStored

def extend_run(run: BlockStored, ev: object, tokens: array[int], map_era: bool) -> bool: ...
