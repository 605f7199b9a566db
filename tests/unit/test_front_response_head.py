"""Response heads of the lean server: server-owned date and server, no hop-by-hop headers,
framing decided by the body kind; the head's bytes, and what cannot be sent."""

from __future__ import annotations

import pytest

from cortex.front.response_head import (
    DateHeader,
    UnsendableResponse,
    encode_head,
    response_headers,
)

HANDLER = [(b"Content-Type", b"application/json"), (b"Connection", b"keep-alive"),
           (b"Keep-Alive", b"timeout=5"), (b"Transfer-Encoding", b"chunked"), (b"TE", b"x"),
           (b"Trailer", b"x"), (b"Upgrade", b"h2c"), (b"Proxy-Connection", b"x"),
           (b"Proxy-Authenticate", b"x"), (b"Date", b"yesterday"), (b"Server", b"uvicorn"),
           (b"X-Cortex-Match-Mode", b"exact_kv_events"), (b"content-length", b"99")]


def names(headers):
    return [name for name, _ in headers]


def test_bytes_body_gets_its_own_length_and_the_servers_date_and_server():
    headers = response_headers(200, HANDLER, b"cortex", False, 11)
    assert headers[:2] == [(b"date", DateHeader.now()), (b"server", b"cortex")]
    assert headers[2:] == [(b"content-type", b"application/json"),
                           (b"x-cortex-match-mode", b"exact_kv_events"),
                           (b"content-length", b"11")]


def test_iterator_body_keeps_the_handlers_length_else_none():
    assert (b"content-length", b"99") in response_headers(200, HANDLER, b"c", False, None)
    plain = response_headers(200, [(b"content-type", b"text/event-stream")], b"c", False, None)
    assert b"content-length" not in names(plain)


def test_no_length_on_204_and_304_and_close_when_asked():
    for status in (204, 304):
        assert b"content-length" not in names(response_headers(status, HANDLER, b"c", True, 0))
    assert response_headers(200, [], b"c", True, 0)[-1] == (b"connection", b"close")


def test_date_is_an_http_date():
    value = DateHeader.now().decode()
    assert value.endswith(" GMT") and len(value) == 29


def test_encode_head_writes_the_status_line_and_headers():
    assert encode_head(200, [(b"content-type", b"application/json")]) == (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n")
    assert encode_head(599, []) == b"HTTP/1.1 599 \r\n\r\n"  # unknown status: no reason


@pytest.mark.parametrize(("status", "headers"), [
    (99, []), (100, []), (1000, []),
    (200, [(b"x-bad", b"line\r\nbreak")]), (200, [(b"x-bad", b"line\nbreak")]),
    (200, [(b"x-bad", b"cr\ronly")]), (200, [(b"x-bad", b"nul\x00")]),
    (200, [(b"bad name", b"x")]), (200, [(b"x:y", b"x")]), (200, [(b"", b"x")]),
])
def test_encode_head_refuses_what_could_not_be_sent_or_could_split_a_response(status, headers):
    with pytest.raises(UnsendableResponse):
        encode_head(status, headers)
