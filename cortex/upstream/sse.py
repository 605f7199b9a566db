"""Learn the engine-reported cached prompt tokens from a passing response body. Pure.

The gateway streams response bytes through untouched; it only wants two numbers out of them,
which engines report as

* OpenAI-compatible (vLLM, SGLang): ``usage.prompt_tokens_details.cached_tokens`` and
  ``usage.prompt_tokens`` — in the JSON body, or in a streamed event (with
  ``stream_options.include_usage`` the usage comes in the last data event before
  ``data: [DONE]``);
* SGLang native ``/generate``: ``meta_info.cached_tokens`` and ``meta_info.prompt_tokens``;
* OpenAI Responses: ``usage.input_tokens_details.cached_tokens`` and ``usage.input_tokens``,
  in the JSON body or, streamed, in the ``response`` of an event (``response.completed``);
* Anthropic Messages: ``usage.cache_read_input_tokens``, the prompt being ``input_tokens`` +
  ``cache_read_input_tokens`` + ``cache_creation_input_tokens`` (vLLM reports the uncached
  rest as ``input_tokens``), in the JSON body or, streamed, in ``message_start``'s
  ``message`` or a ``message_delta``.

``CachedTokensSniffer.feed(chunk)`` is cheap on every chunk: one ``bytes.find`` of
``b"cache"`` (a prefix of both ``cached_tokens`` and ``cache_read_input_tokens``) over the
chunk (plus what is kept of the current SSE event, so a needle
split across chunks is found) and, for SSE, one search for the end of an event. Only an event
(or a JSON body) that contains the needle is parsed. Rules:

* The body kind is taken from its first non-blank byte: ``{`` → one JSON document, anything
  else → an SSE stream (``data:`` lines, events end with a blank line, ``\\n`` or ``\\r\\n``).
* The first event / document whose JSON carries an integer ``cached_tokens`` at one of the
  paths above fixes both answers (``prompt_tokens`` from the same object, or ``None``); later
  bytes are ignored. The answers do not depend on how the bytes were split into chunks.
* A JSON body is kept (as chunk references, up to ``max_body_bytes``) and parsed lazily when an
  answer is read; an SSE stream keeps only the unfinished current event (up to
  ``max_event_bytes``), and a final event without its blank line is parsed when an answer is
  read. Bytes over a bound make the sniffer give up (``None`` from then on; which chunk
  crosses the bound depends on the split, so only the answers within the bounds are
  split-independent); unparsable JSON is skipped. Never an exception.
"""

from __future__ import annotations

import msgspec

NEEDLE = b"cache"
_json_decode = msgspec.json.Decoder().decode
_BLANK = b" \t\r\n"


class CachedTokensSniffer:
    """Feed a response body chunk by chunk; read ``cached_tokens`` / ``prompt_tokens``."""

    __slots__ = (
        "_cached",
        "_done",
        "_found",
        "_kind",
        "_parts",
        "_pending",
        "_pending_armed",
        "_prompt",
        "_size",
        "_tail",
        "max_body_bytes",
        "max_event_bytes",
    )

    def __init__(self, *, max_body_bytes: int = 8 * 1024 * 1024,
                 max_event_bytes: int = 1024 * 1024) -> None:
        self.max_body_bytes = max_body_bytes
        self.max_event_bytes = max_event_bytes
        self._kind: str | None = None  # "json" | "sse" once the first non-blank byte is seen
        self._done = False
        self._cached: int | None = None
        self._prompt: int | None = None
        self._parts: list[bytes] = []  # json: the body so far
        self._size = 0
        self._found = False  # json: the needle occurs in the body
        self._tail = b""  # json: last bytes of the previous chunk (needle split across chunks)
        self._pending = b""  # sse: the unfinished current event
        self._pending_armed = False  # sse: the unfinished event contains the needle

    @property
    def cached_tokens(self) -> int | None:
        self._settle()
        return self._cached

    @property
    def prompt_tokens(self) -> int | None:
        self._settle()
        return self._prompt

    @property
    def done(self) -> bool:
        """An answer is fixed: feeding more is useless (the gateway may stop feeding)."""
        return self._done

    def feed(self, chunk: bytes) -> None:
        if self._done or not chunk:
            return
        kind = self._kind
        if kind is None:
            stripped = chunk.lstrip(_BLANK)
            if not stripped:
                return
            kind = self._kind = "json" if stripped[:1] == b"{" else "sse"
            chunk = stripped
        if kind == "sse":
            self._feed_sse(chunk)
        else:
            self._feed_json(chunk)

    # -- JSON body ---------------------------------------------------------------------

    def _feed_json(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size > self.max_body_bytes:
            self._give_up()
            return
        self._parts.append(chunk)
        if not self._found:
            self._found = NEEDLE in self._tail + chunk[:len(NEEDLE) - 1] or NEEDLE in chunk
            keep = len(NEEDLE) - 1
            self._tail = chunk[-keep:] if len(chunk) >= keep else (self._tail + chunk)[-keep:]

    # -- SSE stream --------------------------------------------------------------------

    def _feed_sse(self, chunk: bytes) -> None:
        data = self._pending + chunk if self._pending else chunk
        end, sep = _last_event_end(data)
        if end < 0:  # still inside one event
            if len(data) > self.max_event_bytes:
                self._give_up()
                return
            self._pending = data
            if not self._pending_armed:
                self._pending_armed = data.find(NEEDLE, max(0, len(data) - len(chunk)
                                                            - len(NEEDLE) + 1)) >= 0
            return
        armed = self._pending_armed or data.find(NEEDLE, 0, end) >= 0
        rest = data[end + sep:]
        if armed:
            for event in _split_events(data[:end]):
                if NEEDLE in event and self._take(_event_data(event)):
                    return
        if len(rest) > self.max_event_bytes:
            self._give_up()
            return
        self._pending, self._pending_armed = rest, NEEDLE in rest

    # -- answers -----------------------------------------------------------------------

    def _settle(self) -> None:
        """Parse what is held back until an answer is asked for."""
        if self._done:
            return
        if self._kind == "json" and self._found:
            if self._take(b"".join(self._parts)):
                return
        elif self._kind == "sse" and self._pending_armed:
            self._take(_event_data(self._pending))

    def _take(self, payload: bytes) -> bool:
        """Parse one JSON document; fix the answers if it carries cached_tokens."""
        try:
            doc = _json_decode(payload)
        except (msgspec.DecodeError, ValueError):
            return False
        cached, prompt = _extract(doc)
        if cached is None:
            return False
        self._cached, self._prompt = cached, prompt
        self._done = True
        self._parts, self._pending, self._tail = [], b"", b""
        return True

    def _give_up(self) -> None:
        self._done = True
        self._parts, self._pending, self._tail = [], b"", b""


def _last_event_end(data: bytes) -> tuple[int, int]:
    """(index, separator length) of the last blank line in ``data``, or (-1, 0)."""
    lf = data.rfind(b"\n\n")
    crlf = data.rfind(b"\r\n\r\n")
    if crlf >= 0 and crlf + 2 >= lf:  # "\r\n\r\n" ends at least as late as "\n\n"
        return crlf, 4
    if lf >= 0:
        return lf, 2
    return -1, 0


def _split_events(block: bytes) -> list[bytes]:
    """Complete events of a block that ends on an event boundary."""
    return block.replace(b"\r\n", b"\n").split(b"\n\n")


def _event_data(event: bytes) -> bytes:
    """The joined ``data:`` field values of one SSE event."""
    lines = []
    for line in event.replace(b"\r\n", b"\n").split(b"\n"):
        if line.startswith(b"data:"):
            value = line[5:]
            lines.append(value[1:] if value[:1] == b" " else value)
    return b"\n".join(lines)


def _extract(doc: object) -> tuple[int | None, int | None]:
    """(cached_tokens, prompt_tokens) from an OpenAI chat/completions, Responses or Anthropic
    usage object, or an SGLang meta_info object."""
    if not isinstance(doc, dict):
        return None, None
    for holder in (doc, doc.get("response"), doc.get("message")):
        if not isinstance(holder, dict):
            continue
        usage = holder.get("usage")
        if isinstance(usage, dict):
            found = _from_usage(usage)
            if found[0] is not None:
                return found
    meta = doc.get("meta_info")
    if isinstance(meta, dict):
        cached = _as_int(meta.get("cached_tokens"))
        if cached is not None:
            return cached, _as_int(meta.get("prompt_tokens"))
    return None, None


def _from_usage(usage: dict) -> tuple[int | None, int | None]:
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict):  # chat, completions
        cached = _as_int(details.get("cached_tokens"))
        if cached is not None:
            return cached, _as_int(usage.get("prompt_tokens"))
    details = usage.get("input_tokens_details")
    if isinstance(details, dict):  # Responses
        cached = _as_int(details.get("cached_tokens"))
        if cached is not None:
            return cached, _as_int(usage.get("input_tokens"))
    cached = _as_int(usage.get("cache_read_input_tokens"))
    if cached is not None:  # Anthropic: input_tokens is the uncached rest
        rest = _as_int(usage.get("input_tokens"))
        created = _as_int(usage.get("cache_creation_input_tokens")) or 0
        return cached, None if rest is None else rest + cached + created
    return None, None


def _as_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None
