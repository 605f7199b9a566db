"""Origins and the header hygiene of requests sent to workers."""

from __future__ import annotations

import pytest

from cortex.errors import ConfigError
from cortex.upstream.request_head import Origin, parse_origin, upstream_headers


def test_parse_origin():
    assert parse_origin("http://10.0.0.7:30000") == Origin("10.0.0.7", 30000, b"10.0.0.7:30000")
    assert parse_origin("http://worker-a/") == Origin("worker-a", 80, b"worker-a:80")
    assert parse_origin("http://[::1]:8000") == Origin("::1", 8000, b"[::1]:8000")


@pytest.mark.parametrize("bad", ["https://a:1", "a:1", "http://", "http://a:1/v1",
                                 "http://a:x", "http://a:0", "http://a:70000", "http://u@a:1",
                                 "http://::1:80", "http://[::1", "http://[::1]x"])
def test_parse_origin_rejects(bad):
    with pytest.raises(ConfigError):
        parse_origin(bad)


def test_headers_host_first_hop_by_hop_dropped_content_length_set():
    origin = parse_origin("http://w:9")
    headers = [(b"Host", b"client-facing"), (b"Content-Type", b"application/json"),
               (b"connection", b"keep-alive, X-Private"), (b"x-private", b"1"),
               (b"transfer-encoding", b"chunked"), (b"te", b"trailers"),
               (b"keep-alive", b"timeout=5"), (b"upgrade", b"h2c"),
               (b"content-length", b"999"), (b"authorization", b"Bearer k"),
               (b"proxy-authorization", b"p"), (b"accept", b"text/event-stream")]
    assert upstream_headers(origin, b"POST", headers, 12) == [
        (b"host", b"w:9"), (b"content-type", b"application/json"),
        (b"authorization", b"Bearer k"), (b"accept", b"text/event-stream"),
        (b"content-length", b"12")]


def test_content_length_on_empty_bodies():
    origin = parse_origin("http://w:9")
    assert upstream_headers(origin, b"GET", [], 0) == [(b"host", b"w:9")]
    assert upstream_headers(origin, b"POST", [], 0) == [(b"host", b"w:9"),
                                                         (b"content-length", b"0")]
