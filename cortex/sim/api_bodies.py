"""Answers of a simulated engine to Anthropic Messages and OpenAI Responses requests. Pure.

The shapes vLLM answers ``POST /v1/messages`` and ``POST /v1/responses`` with (0.32,
``entrypoints/anthropic`` and ``entrypoints/openai/responses``), reduced to what clients and
Cortex read: the official ``anthropic`` and ``openai`` clients parse them, and Cortex's
cached-tokens sniffer finds the cache report in them.

* Messages: ``usage`` has ``input_tokens`` (the prompt tokens not read from the cache),
  ``output_tokens`` and ``cache_read_input_tokens``; streamed, each event is ``event: <type>``
  + ``data: <json>``: ``message_start`` (with the usage), ``content_block_start``, one
  ``content_block_delta`` per token, ``content_block_stop``, ``message_delta``
  (``stop_reason`` ``max_tokens``, usage), ``message_stop``.
* Responses: ``usage`` has ``input_tokens``, ``output_tokens``, ``total_tokens``,
  ``input_tokens_details.cached_tokens``; status ``incomplete`` (every simulated answer ends on
  its token limit); streamed: ``response.created``, one ``response.output_text.delta`` per
  token, ``response.completed`` with the whole response; each event carries
  ``sequence_number``.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import msgspec

_counter = itertools.count(1)


def _event(kind: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + msgspec.json.encode(payload) + b"\n\n"


@dataclass(slots=True)
class MessagesShape:
    model: str
    id: str = field(default_factory=lambda: f"msg_sim{next(_counter)}")

    def _usage(self, prompt: int, completion: int, cached: int) -> dict[str, Any]:
        return {"input_tokens": prompt - cached, "output_tokens": completion,
                "cache_read_input_tokens": cached}

    def _message(self, content: list[dict[str, Any]], stop: str | None,
                 usage: dict[str, Any]) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "content": content,
                "model": self.model, "stop_reason": stop, "stop_sequence": None,
                "usage": usage}

    def full(self, text: str, prompt: int, completion: int, cached: int) -> dict[str, Any]:
        return self._message([{"type": "text", "text": text}], "max_tokens",
                             self._usage(prompt, completion, cached))

    def start_events(self, prompt: int, cached: int) -> bytes:
        message = self._message([], None, self._usage(prompt, 0, cached))
        return (_event("message_start", {"type": "message_start", "message": message})
                + _event("content_block_start", {"type": "content_block_start", "index": 0,
                                                 "content_block": {"type": "text",
                                                                   "text": ""}}))

    def token_event(self, text: str) -> bytes:
        return _event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                              "delta": {"type": "text_delta", "text": text}})

    def end_events(self, text: str, prompt: int, completion: int, cached: int) -> bytes:
        return (_event("content_block_stop", {"type": "content_block_stop", "index": 0})
                + _event("message_delta", {
                    "type": "message_delta", "usage": self._usage(prompt, completion, cached),
                    "delta": {"stop_reason": "max_tokens", "stop_sequence": None}})
                + _event("message_stop", {"type": "message_stop"}))


@dataclass(slots=True)
class ResponsesShape:
    model: str
    id: str = field(default_factory=lambda: f"resp_sim{next(_counter)}")
    created: int = field(default_factory=lambda: int(time.time()))
    sequence: int = 0

    def full(self, text: str, prompt: int, completion: int, cached: int) -> dict[str, Any]:
        output = [{"type": "message", "id": f"msg_{self.id}", "role": "assistant",
                   "status": "incomplete",
                   "content": [{"type": "output_text", "text": text, "annotations": []}]}]
        usage = {"input_tokens": prompt, "output_tokens": completion,
                 "total_tokens": prompt + completion,
                 "input_tokens_details": {"cached_tokens": cached},
                 "output_tokens_details": {"reasoning_tokens": 0}}
        return self._response("incomplete", output, usage)

    def _response(self, status: str, output: list[dict[str, Any]],
                  usage: dict[str, Any] | None) -> dict[str, Any]:
        return {"id": self.id, "object": "response", "created_at": self.created,
                "model": self.model, "status": status, "output": output,
                "incomplete_details": {"reason": "max_output_tokens"}
                if status == "incomplete" else None,
                "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
                "usage": usage}

    def _next(self, kind: str, payload: dict[str, Any]) -> bytes:
        self.sequence += 1
        return _event(kind, {"type": kind, "sequence_number": self.sequence, **payload})

    def start_events(self, prompt: int, cached: int) -> bytes:
        return self._next("response.created",
                          {"response": self._response("in_progress", [], None)})

    def token_event(self, text: str) -> bytes:
        return self._next("response.output_text.delta", {
            "item_id": f"msg_{self.id}", "output_index": 0, "content_index": 0,
            "delta": text, "logprobs": []})

    def end_events(self, text: str, prompt: int, completion: int, cached: int) -> bytes:
        return self._next("response.completed",
                          {"response": self.full(text, prompt, completion, cached)})


class StoredIds:
    """The ids of the last ``capacity`` stored Responses answers (the oldest forgotten): a
    request naming another ``previous_response_id`` gets 404, as from vLLM with its store."""

    __slots__ = ("_ids", "capacity")

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()

    def add(self, response_id: str) -> None:
        self._ids[response_id] = None
        if len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._ids
