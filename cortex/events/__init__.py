"""The engines' ZeroMQ KV event streams: frames, decoders, the sequencer, replay, and the
subscriber that applies each worker's batches to the ledger (``cortex.ledger``, which owns
the event types, ``cortex.ledger.kv_events``)."""
