"""Structured logs: one JSON line per record with the request id; secrets never written."""

from __future__ import annotations

import contextvars
import io
import json
import logging

import pytest

from cortex import logs
from cortex.front.exchange import Exchange
from cortex.front.messages import HttpRequest
from cortex.logs import LogConfig

TOKEN = "s3cr3t-admin-token-value"


@pytest.fixture
def captured():
    """Install the handler on a fresh stream; remove it afterwards."""
    stream = io.StringIO()
    installed: list[logging.Handler] = []

    def install(process: int | None = None, **config: object) -> io.StringIO:
        installed.append(logs.configure(LogConfig(**config), secrets=[TOKEN, None],
                                        stream=stream, process=process))
        return stream

    level = logging.getLogger().level
    yield install
    root = logging.getLogger()
    for handler in installed:
        root.removeHandler(handler)
    logs._installed = None
    root.setLevel(level)
    logging.getLogger(logs.ACCESS_LOGGER).disabled = False
    logging.getLogger(logs.ACCESS_LOGGER).setLevel(logging.NOTSET)


def lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def in_context(fn, *args):
    """Run ``fn`` in a copy of the context, as trio runs each task in its own."""
    return contextvars.copy_context().run(fn, *args)


def test_one_json_line_per_record_with_the_standard_keys(captured):
    stream = captured()
    logging.getLogger("cortex.test").info("worker %s is %s\nsecond line", "gpu0", "live")
    (entry,) = lines(stream)
    assert entry["level"] == "info"
    assert entry["logger"] == "cortex.test"
    assert entry["message"] == "worker gpu0 is live\nsecond line"
    assert entry["ts"].endswith("Z") and entry["ts"][10] == "T"
    assert "request_id" not in entry  # logged outside any request
    assert stream.getvalue().count("\n") == 1


def test_level_filters_and_extra_fields_are_written(captured):
    stream = captured(level="warning")
    log = logging.getLogger("cortex.test")
    log.info("not written")
    log.warning("written", extra={"worker": "gpu1", "rank": 2})
    (entry,) = lines(stream)
    assert (entry["message"], entry["worker"], entry["rank"]) == ("written", "gpu1", 2)


def test_the_request_id_of_the_current_context_is_in_every_record(captured):
    stream = captured()
    log = logging.getLogger("cortex.test")

    def handle(request: HttpRequest) -> str:
        request_id = logs.request_started(request)
        log.info("routed")
        return request_id

    given = in_context(handle, HttpRequest(b"POST", b"/", [(b"x-request-id", b"abc-123")]))
    made_1 = in_context(handle, HttpRequest(b"POST", b"/", []))
    made_2 = in_context(handle, HttpRequest(b"POST", b"/", []))
    log.info("outside")
    entries = lines(stream)
    assert given == "abc-123"
    assert made_1 != made_2 and made_1.split("-")[0] == made_2.split("-")[0]
    assert [e.get("request_id") for e in entries] == [given, made_1, made_2, None]


def test_a_client_request_id_is_trimmed_to_printable_and_bounded():
    request = HttpRequest(b"GET", b"/", [(b"x-request-id", b"a b\r\n\x00\"" + b"x" * 500)])
    value = in_context(logs.request_started, request)
    assert value.startswith('ab"x') and len(value) <= logs.MAX_REQUEST_ID
    blank = HttpRequest(b"GET", b"/", [(b"x-request-id", b" \t")])
    assert "-" in in_context(logs.request_started, blank)  # nothing printable: one is made


def test_the_admin_token_is_masked_in_messages_extras_and_tracebacks(captured):
    stream = captured()
    log = logging.getLogger("cortex.test")
    log.warning("admin token is %s", TOKEN, extra={"header": f"authorization: Bearer {TOKEN}"})
    try:
        raise ValueError(f"bad token {TOKEN}")
    except ValueError:
        log.exception("failed")
    log.info("from a client: Authorization: bearer other-credential-xyz")
    text = stream.getvalue()
    assert TOKEN not in text and "other-credential-xyz" not in text
    entries = lines(stream)
    assert entries[0]["message"] == "admin token is ***"
    assert entries[0]["header"] == "authorization: Bearer ***"
    assert "bad token ***" in entries[1]["exc"]
    assert entries[2]["message"].endswith("bearer ***")


def test_plain_text_format_masks_too(captured):
    stream = captured(json=False)

    def handle() -> None:
        logs.request_started(HttpRequest(b"GET", b"/", [(b"x-request-id", b"r1")]))
        logging.getLogger("cortex.test").error("token %s", TOKEN)

    in_context(handle)
    (line,) = stream.getvalue().splitlines()
    assert line.endswith(" error cortex.test [r1] token ***")


@pytest.mark.parametrize("json_lines", [True, False])
def test_a_process_other_than_the_first_writes_its_index(captured, json_lines):
    """``server.processes``: the journal gets every process's lines on one stream."""
    stream = captured(process=2, json=json_lines)
    logging.getLogger("cortex.test").warning("hello")
    if json_lines:
        assert lines(stream)[0]["process"] == 2
    else:
        assert stream.getvalue().rstrip().endswith(" warning p2 cortex.test hello")


def exchange(request: HttpRequest | None, status: int | None, headers=(), *,
             outcome: str = "complete", body_bytes: int = 2, head_ms: float | None = 1.0,
             total_ms: float = 5.0) -> Exchange:
    return Exchange(request, ("127.0.0.1", 5555), status, list(headers), body_bytes, outcome,
                    100.0, None if head_ms is None else 100.0 + head_ms / 1000,
                    100.0 + total_ms / 1000)


def test_access_log_one_record_per_request_when_enabled(captured):
    stream = captured(access_log=True, level="error")  # the access log ignores the level
    request = HttpRequest(b"POST", b"/v1/chat/completions?x=1",
                          [(b"x-request-id", b"req-9"), (b"authorization", TOKEN.encode())],
                          b'{"secret": "body"}', ("127.0.0.1", 5555))

    def handle() -> None:
        logs.request_started(request)
        logs.log_exchange(exchange(request, 200, [(b"x-cortex-assigned-worker", b"gpu0"),
                                                  (b"x-cortex-match-mode", b"exact_kv_events"),
                                                  (b"x-cortex-cache-hit-tokens", b"64")]))

    in_context(handle)
    logs.log_exchange(exchange(HttpRequest(b"GET", b"/nope", []), 404, outcome="refused"))
    logs.log_exchange(exchange(HttpRequest(b"POST", b"/v1/completions", []), None,
                               outcome="client_gone", body_bytes=0, head_ms=None))
    logs.log_exchange(exchange(None, 400, outcome="refused"))
    first, second, third, fourth = lines(stream)
    assert first["logger"] == "cortex.access"
    assert (first["method"], first["path"], first["status"], first["outcome"]) == (
        "POST", "/v1/chat/completions", 200, "complete")
    assert (first["worker"], first["match_mode"], first["cache_hit_tokens"]) == (
        "gpu0", "exact_kv_events", "64")
    assert first["request_id"] == "req-9" and first["client"] == "127.0.0.1:5555"
    assert (first["duration_ms"], first["head_ms"], first["bytes"]) == (5.0, 1.0, 2)
    assert (second["path"], second["status"], second["worker"], second["outcome"]) == (
        "/nope", 404, None, "refused")
    assert (third["status"], third["outcome"], third["head_ms"], third["bytes"]) == (
        0, "client_gone", None, 0)
    assert (fourth["method"], fourth["path"], fourth["status"]) == ("-", "-", 400)
    assert TOKEN not in stream.getvalue() and "body" not in stream.getvalue()


def test_access_log_off_writes_nothing(captured):
    stream = captured(access_log=False)
    logs.log_exchange(exchange(HttpRequest(b"GET", b"/", []), 204))
    assert stream.getvalue() == ""


def test_configure_again_replaces_the_handler(captured):
    first = captured()
    second = captured()
    logging.getLogger("cortex.test").warning("once")
    assert first.getvalue().count("once") == 1  # same stream, one handler installed
    assert second is first
