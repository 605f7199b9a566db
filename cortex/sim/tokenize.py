"""How a simulated engine turns a request body into prompt token ids: like a real engine.

Independent of Cortex's tokenizer path on purpose (no segment cache, no piece splitting): the
simulator is the check that Cortex's block keys match what an engine really computes.

Rules:

* Chat (``messages``) on an SGLang engine: as SGLang 0.5.15 renders it (``sglang_chat``,
  checked against the real server by tests/real_engine/test_sglang.py); what that does not
  model is refused (400). On a vLLM engine:
  the model profile's chat template renders the whole conversation
  (the ``tool_use`` one for a request with tools when the model names one;
  ``add_generation_prompt`` default true unless ``continue_final_message``, which cuts the text
  right after the last message's content; ``tools``; ``documents``; ``chat_template_kwargs``;
  the model's special tokens; ``reasoning_effort`` and ``enable_thinking``; developer turns as
  system turns for a template that does not name that role), then ONE full ``Tokenizer.encode`` with ``add_special_tokens``
  false by default (the template writes BOS). Messages and tools as vLLM's renderer rebuilds
  them (``chat_messages``), a non-text part as ``MEDIA_PLACEHOLDER`` text (real engines put
  their own placeholder tokens there).
* Anthropic Messages and OpenAI Responses: converted into the chat vLLM renders for them
  (``anthropic_messages``, ``responses_input``: the conversion is vLLM's, not Cortex's
  choice), then rendered and encoded as chat; what they do not model is refused (400).
* Text (``/v1/completions`` ``prompt``, ``/generate`` ``text``): one full encode with
  ``add_special_tokens`` true by default.
* When a text is encoded with special tokens and the profile says ``add_bos``, ``bos_id`` is
  prepended (HF tokenizers add it in their post-processor; the profile has read what it
  adds: ``model_profile``).
* Token ids (``prompt`` / ``input_ids`` as a list of ints) are taken as they are.
* ``cache_read_limit``: prompt tokens a request may read from the prefix cache, by each
  engine's own rule. vLLM skips its cache for prompt logprobs (``prompt_logprobs``, or ``echo``
  with completions' ``logprobs`` / chat's ``top_logprobs``, default 0); SGLang matches at most
  ``logprob_start_len`` tokens of a request with ``return_logprob`` (a completion with ``echo``
  and ``logprobs`` asks from 0).
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
from cortex.ledger.kv_events import EngineFamily
from cortex.profile.model_profile import ModelProfile
from cortex.prompt import anthropic_messages, responses_input
from cortex.prompt.chat_messages import (
    TEXT_PART_TYPES,
    developer_as_system,
    engine_messages,
    engine_tools,
)
from cortex.prompt.sglang_chat import sglang_conversation
from cortex.prompt.unrenderable import Unrenderable

MEDIA_PLACEHOLDER = "<media>"
MEMO_ENTRIES = 256
_MAX_TOKEN_ID = 1 << 32


class SimTokenizer:
    __slots__ = ("_memo", "family", "profile")

    def __init__(self, profile: ModelProfile | None,
                 family: EngineFamily = EngineFamily.VLLM) -> None:
        self.profile = profile
        self.family = family
        self._memo: OrderedDict[tuple[str, bool], list[int]] = OrderedDict()

    def chat_ids(self, body: Mapping[str, Any]) -> list[int]:
        profile = self.profile
        if self.family is EngineFamily.SGLANG:
            if profile is None or profile.chat_templates is None:
                raise BadRequest("this simulated engine has no chat template")
            text = _modelled(sglang_conversation, dict(body), templates=profile.chat_templates)
            if text is None:
                raise BadRequest("this simulated engine has no chat template")
            return self._encode(text, False)
        template = None if profile is None or profile.chat_templates is None \
            else profile.chat_templates.pick(body.get("tools"))
        if template is None:
            raise BadRequest("this simulated engine has no chat template")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        prepared, _ = engine_messages([_media_as_text(m) for m in messages])
        prepared = developer_as_system(prepared, template.source)
        continue_final = _flag(body, "continue_final_message", False)
        kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(kwargs, dict):
            raise BadRequest("chat_template_kwargs must be an object")
        effort = body.get("reasoning_effort")
        if effort is not None and not isinstance(effort, str):
            raise BadRequest("reasoning_effort must be a string")
        if effort is not None and effort != "auto":
            kwargs = {"enable_thinking": effort != "none", **kwargs,
                      "reasoning_effort": effort}
        tools = engine_tools(body.get("tools"))
        text = template.render(
            prepared,
            add_generation_prompt=_flag(body, "add_generation_prompt", not continue_final),
            tools=tools,
            documents=body.get("documents"),
            extra=kwargs,
        )
        if continue_final:
            last = prepared[-1].get("content")
            if isinstance(last, str) and last and (end := text.rfind(last)) >= 0:
                text = text[: end + len(last)]
        return self._encode(text, _flag(body, "add_special_tokens", False))

    def messages_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """The chat body vLLM renders for an Anthropic Messages request (400 if not modelled)."""
        templates = None if self.profile is None else self.profile.chat_templates
        if templates is None:
            raise BadRequest("this simulated engine has no chat template")
        return _modelled(anthropic_messages.chat_body, body, merge_inline_system=(
            anthropic_messages.merges_inline_system(templates)), disabled_thinking_effort=(
            anthropic_messages.disabled_effort(templates)))

    def responses_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """The chat body vLLM renders for an OpenAI Responses request (400 if not modelled)."""
        return _modelled(responses_input.chat_body, body)

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
        ids = profile.tokenizer.encode(text, add_special_tokens=False).ids
        if add_special_tokens and profile.add_bos and profile.bos_id is not None:
            ids.insert(0, profile.bos_id)
        if not ids:
            raise BadRequest("the prompt is empty")
        self._memo[key] = ids
        if len(self._memo) > MEMO_ENTRIES:
            self._memo.popitem(last=False)
        return list(ids)


def cache_read_limit(body: Mapping[str, Any], family: EngineFamily) -> int | None:
    """Prompt tokens the engine may serve from its cache for this body (``None``: no limit
    beyond its last-token rule)."""
    chat = "messages" in body
    if family is EngineFamily.VLLM:
        echo_logprobs = body.get("top_logprobs", 0) if chat else body.get("logprobs")
        asked = body.get("prompt_logprobs") is not None or (
            body.get("echo") is True and echo_logprobs is not None)
        return 0 if asked else None
    if not chat and body.get("echo") is True and body.get("logprobs") is not None:
        return 0
    start = body.get("logprob_start_len")
    if body.get("return_logprob") is True and type(start) is int and start >= 0:
        return start
    return None


def _media_as_text(message: object) -> object:
    """The message with each non-text content part replaced by ``MEDIA_PLACEHOLDER`` text."""
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        return message
    parts = [part if not isinstance(part, dict) or not isinstance(part.get("type"), str)
             or part["type"] in TEXT_PART_TYPES  # (a type not a string: refused later)
             else {"type": "text", "text": MEDIA_PLACEHOLDER} for part in message["content"]]
    return {**message, "content": parts}


def _flag(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be a boolean")
    return value


def _modelled(convert: Any, body: dict[str, Any], **options: Any) -> Any:
    try:
        return convert(body, **options)
    except Unrenderable as why:
        raise BadRequest(f"the simulated engine does not model this request: {why}") from None
