"""How a simulated engine turns a request body into prompt token ids: like a real engine.

Independent of Cortex's tokenizer path on purpose (no segment cache, no piece splitting): the
simulator is the check that Cortex's block keys match what an engine really computes.

Rules:

* Chat (``messages``): the model profile's chat template renders the whole conversation
  (``add_generation_prompt`` default true unless ``continue_final_message``, which cuts the text
  right after the last message's content; ``tools``; ``chat_template_kwargs``; the profile's
  ``bos_token``/``eos_token``), then ONE full ``Tokenizer.encode(text, add_special_tokens=...)``
  with ``add_special_tokens`` false by default (the template writes BOS). Content given as a
  list of parts is the text parts joined with ``"\\n"``; a non-text part becomes
  ``MEDIA_PLACEHOLDER`` (real engines put their own placeholder tokens there).
* Text (``/v1/completions`` ``prompt``, ``/generate`` ``text``): one full encode with
  ``add_special_tokens`` true by default.
* When a text is encoded with special tokens and the profile says ``add_bos``, ``bos_id`` is
  prepended (HF tokenizers add it in their post-processor; the profile states it explicitly).
* Token ids (``prompt`` / ``input_ids`` as a list of ints) are taken as they are.
* One prompt per request: a batch (list of prompts) is refused (400).
* The ids of the last ``MEMO_ENTRIES`` distinct (text, add_special_tokens) are remembered, so a
  replayed prompt does not stall the event loop again (an encode of a 4k-token text takes tens
  of milliseconds here); a new text is always one full encode.
* No profile (or no chat template) means text (or chat) requests are refused with 400, as a
  real engine without a chat template refuses chat.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from cortex.errors import BadRequest
from cortex.profile.model_profile import ModelProfile

MEDIA_PLACEHOLDER = "<media>"
MEMO_ENTRIES = 256
_MAX_TOKEN_ID = 1 << 32


class SimTokenizer:
    __slots__ = ("profile", "_memo")

    def __init__(self, profile: ModelProfile | None) -> None:
        self.profile = profile
        self._memo: OrderedDict[tuple[str, bool], list[int]] = OrderedDict()

    def chat_ids(self, body: Mapping[str, Any]) -> list[int]:
        profile = self.profile
        if profile is None or profile.chat_template is None:
            raise BadRequest("this simulated engine has no chat template")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        prepared = [_plain_message(m) for m in messages]
        continue_final = _flag(body, "continue_final_message", False)
        kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(kwargs, dict):
            raise BadRequest("chat_template_kwargs must be an object")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise BadRequest("tools must be a list")
        text = profile.chat_template.render(
            prepared,
            add_generation_prompt=_flag(body, "add_generation_prompt", not continue_final),
            bos_token=profile.bos_token or "",
            eos_token=profile.eos_token or "",
            tools=tools,
            extra=kwargs,
        )
        if continue_final:
            last = prepared[-1].get("content")
            if isinstance(last, str) and last and (end := text.rfind(last)) >= 0:
                text = text[: end + len(last)]
        return self._encode(text, _flag(body, "add_special_tokens", False))

    def prompt_ids(self, body: Mapping[str, Any], prompt: object, name: str) -> list[int]:
        """A completions ``prompt`` or ``/generate`` ``text``/``input_ids``: text or ids."""
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
            if len(prompt) != 1:
                raise BadRequest(f"{name}: the simulated engine takes one prompt per request")
            prompt = prompt[0]
        if isinstance(prompt, str):
            return self._encode(prompt, _flag(body, "add_special_tokens", True))
        if isinstance(prompt, list) and prompt:
            for v in prompt:
                if type(v) is not int or not 0 <= v < _MAX_TOKEN_ID:
                    raise BadRequest(f"{name}: token ids must be integers in [0, 2**32)")
            return list(prompt)
        raise BadRequest(f"{name} must be a string or a non-empty list of token ids")

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        profile = self.profile
        if profile is None:
            raise BadRequest("this simulated engine has no tokenizer: send token ids")
        key = (text, add_special_tokens)
        ids = self._memo.get(key)
        if ids is not None:
            self._memo.move_to_end(key)
            return list(ids)
        ids = profile.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens and profile.add_bos and profile.bos_id is not None:
            ids.insert(0, profile.bos_id)
        if not ids:
            raise BadRequest("the prompt is empty")
        self._memo[key] = ids
        if len(self._memo) > MEMO_ENTRIES:
            self._memo.popitem(last=False)
        return list(ids)


def _plain_message(message: object) -> dict[str, Any]:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise BadRequest("each message must be an object with a string role")
    content = message.get("content")
    if content is None or isinstance(content, str):
        return message
    if not isinstance(content, list):
        raise BadRequest("message content must be a string, a list of parts or null")
    texts = []
    for part in content:
        if not isinstance(part, dict):
            raise BadRequest("content parts must be objects")
        if part.get("type") == "text":
            if not isinstance(part.get("text"), str):
                raise BadRequest("a text content part needs a string text")
            texts.append(part["text"])
        else:
            texts.append(MEDIA_PLACEHOLDER)
    return {**message, "content": "\n".join(texts)}


def _flag(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be a boolean")
    return value
