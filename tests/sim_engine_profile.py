"""The model profile the simulated-engine tests serve: the DeepSeek tokenizer with the test chat
template of ``tests.deepseek_profile``, loaded once (loading takes about a second)."""

from __future__ import annotations

import os
import tempfile
from functools import cache
from typing import Any

from cortex.profile.model_profile import ModelProfile, ProfileSpec, load_profile
from tests import deepseek_profile as ds

SYSTEM = "You are a careful assistant. " * 40  # ~240 tokens: many full blocks


@cache
def deepseek() -> ModelProfile:
    with tempfile.TemporaryDirectory() as tmp:
        template = os.path.join(tmp, "chat.jinja")
        with open(template, "w") as f:
            f.write(ds.TEMPLATE)
        return load_profile(ProfileSpec(model="deepseek", tokenizer_path=ds.TOKENIZER_JSON,
                                        block_size=16, chat_template_path=template,
                                        bos_token=ds.BOS, eos_token=ds.EOS))


def chat(content: str = "What is 2+2?", **extra: Any) -> dict[str, Any]:
    """A chat body: the long system prompt, then one user turn."""
    return {"model": "deepseek", "messages": [{"role": "system", "content": SYSTEM},
                                              {"role": "user", "content": content}], **extra}
