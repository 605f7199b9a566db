"""Contract of the Cython unit ``cortex._fast.blockkeys``: Cortex's own chained block keys.

Shared by the ledger (keys of stored blocks, from the events' token ids) and the request path
(keys of a prompt's full blocks), so both produce identical keys for identical prefixes.

Definition (a pure-Python reference using the ``xxhash`` package must agree bit for bit):

    part(None) = b"\\x00";  part(s) = b"\\x01" + u32le(len(utf8(s))) + utf8(s)
    namespace_seed(model, lora, salt) = XXH3_64(b"cortex-ns-v1" + part(model) + part(lora)
                                                + part(salt), seed=0)
    key(block 0)  = XXH3_64(u32le(t) for t in block tokens, seed=ns)
    key(block i)  = XXH3_64(u64le(key(block i-1)) + u32le(t) for t in block tokens, seed=0)

The namespace seeds the root block only; a chained block inherits it through its parent's key.
(Revised from ``seed=ns`` on every block: vLLM names a request's cache salt only in the extra
keys of its first block, so a later BlockStored of the same request — parent set, no salt —
could not be keyed in the right namespace. With the namespace carried by the chain, the ledger
needs the namespace only for stores without a parent.) ``block_keys(..., parent_key=k)``
therefore ignores ``seed``.

Only full blocks are keyed; a trailing partial block is ignored. Token ids must lie in
[0, 2**32) (ValueError otherwise). Blocks Cortex cannot reproduce from tokens (multimodal,
prompt embeddings) get ``opaque_key``: its input length is 30 bytes, never a multiple of 4, so it
can never equal a token block's key input — such blocks never produce a false hit.

    opaque_key(parent, engine_hash, ns) = XXH3_64(b"cortex-opaque\\x00" + u64le(parent or 0)
                                                  + u64le(engine_hash),
                                                  seed=ns if parent is None else 0)
"""

from array import array
from collections.abc import Sequence

def namespace_seed(
    model: str, lora_name: str | None = None, cache_salt: str | None = None
) -> int: ...
def block_keys(
    token_ids: Sequence[int], block_size: int, seed: int, parent_key: int | None = None,
    max_tokens: int = -1,
) -> array[int]:
    """``array('Q')`` of the keys (what ``BlockTree.match`` reads without conversion); with
    ``max_tokens`` >= 0 only the full blocks of the first ``max_tokens`` ids."""
def opaque_key(parent_key: int | None, engine_hash: int, seed: int) -> int: ...
