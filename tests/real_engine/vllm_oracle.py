"""vLLM's own conversion of Messages and Responses requests into chat, run in the engine's venv.

``python vllm_oracle.py < requests.json``: each request ``{"api": "messages"|"responses",
"body": {...}, "template": "<chat template source>"}`` is converted with vLLM's code
(``AnthropicServingMessages.to_chat_completion_request`` with the inline-system probe vLLM
runs on the template; ``construct_input_messages`` + ``construct_tool_dicts`` +
``build_chat_params``) and printed as one JSON list of ``/tokenize`` chat bodies: what the
engine renders for the request, fed to the engine's own ``/tokenize``. The test side then
compares those token ids with Cortex's. (Not imported by Cortex's tests: it needs vLLM.)
"""

from __future__ import annotations

import json
import sys


def messages(body: dict, template: str) -> dict:
    from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages as Serving

    request = AnthropicMessagesRequest.model_validate(body)
    merge = Serving._detect_merge_inline_system(template)
    # thinking disabled: the effort vLLM's server probes from the template (Cortex's own
    # probe is checked here only through this request's rendering: the tiny templates ignore
    # efforts, so vLLM's probe answers "low")
    chat = Serving.to_chat_completion_request(request, merge_inline_system=merge,
                                              disabled_thinking_effort="low")
    return _tokenize_body(chat.messages, None if chat.tools is None else
                          [tool.model_dump() for tool in chat.tools],
                          chat.build_chat_params(None, "auto").chat_template_kwargs)


def _tokenize_body(messages: list, tools: list | None, kwargs: dict) -> dict:
    """A ``/tokenize`` chat body rendering ``messages`` and ``tools`` with ``kwargs`` (vLLM's
    merged template kwargs: the standard ones taken out, the rest passed on). ``/tokenize``
    validates messages as chat messages, which have no ``input_text``/``output_text`` parts;
    vLLM's parser reads those exactly as ``text`` parts (``renderers/chat_utils.py``), so they
    are sent as such."""
    kwargs = dict(kwargs)
    messages = json.loads(json.dumps(messages, default=lambda o: o.model_dump()))
    for message in messages:
        if isinstance(message.get("content"), list):
            message["content"] = [
                {**part, "type": "text"} if isinstance(part, dict) and part.get("type") in (
                    "input_text", "output_text") else part for part in message["content"]]
    return {"messages": messages,
            "tools": tools,
            "add_generation_prompt": kwargs.pop("add_generation_prompt"),
            "continue_final_message": kwargs.pop("continue_final_message"),
            "documents": kwargs.pop("documents", None),
            "chat_template_kwargs": kwargs}


def responses(body: dict) -> dict:
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
    from vllm.entrypoints.openai.responses.utils import (
        construct_input_messages,
        construct_tool_dicts,
    )

    request = ResponsesRequest.model_validate(body)
    messages = construct_input_messages(request_instructions=request.instructions,
                                        request_input=request.input)
    return _tokenize_body(messages, construct_tool_dicts(request.tools, request.tool_choice),
                          request.build_chat_params(None, "auto").chat_template_kwargs)


def main() -> None:
    requests = json.load(sys.stdin)
    out = [messages(r["body"], r["template"]) if r["api"] == "messages" else
           responses(r["body"]) for r in requests]
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
