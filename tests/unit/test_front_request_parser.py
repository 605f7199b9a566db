"""The llhttp request parser of the lean server: requests whatever the read boundaries, h11's
rules kept where llhttp differs, malformed input (request smuggling included) a 400 and never
anything else, limits as 431/413, pipelined requests before a refused one kept."""

from __future__ import annotations

import pytest

from cortex.errors import BadRequest, PayloadTooLarge
from cortex.front.errors_http import HeaderFieldsTooLarge
from cortex.front.limits import ServerLimits
from cortex.front.request_parser import RequestParser
from cortex.front.shared import ServerCounters


def parse(*reads: bytes, **limits) -> RequestParser:
    parser = RequestParser(ServerLimits(**limits), ServerCounters(), ("10.0.0.1", 5))
    for data in reads:
        parser.feed(data)
    return parser


def requests(parser: RequestParser) -> list[tuple[bytes, bytes, bytes, bool]]:
    return [(r.method, r.target, r.body, keep) for r, keep in parser.requests]


PIPELINED = (b"POST /a?x=1 HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello"
             b"\r\nGET /b HTTP/1.1\r\nhost: t\r\n\r\n"
             b"POST /c HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n"
             b"3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nx-trailer: 1\r\n\r\n")
EXPECTED = [(b"POST", b"/a?x=1", b"hello", True), (b"GET", b"/b", b"", True),
            (b"POST", b"/c", b"abcde", True)]


def test_pipelined_requests_are_the_same_whatever_the_read_boundaries():
    assert requests(parse(PIPELINED)) == EXPECTED
    for cut in range(1, len(PIPELINED)):
        assert requests(parse(PIPELINED[:cut], PIPELINED[cut:])) == EXPECTED, cut
    byte_by_byte = parse(*(PIPELINED[i:i + 1] for i in range(len(PIPELINED))))
    assert requests(byte_by_byte) == EXPECTED
    assert not byte_by_byte.in_message and byte_by_byte.error is None


def test_headers_lower_case_names_trimmed_values_no_trailers_and_the_client():
    parser = parse(PIPELINED)
    first = parser.requests[0][0]
    assert first.headers == [(b"host", b"t"), (b"content-length", b"5")]
    assert first.client == ("10.0.0.1", 5) and first.http_version == b"1.1"
    assert parser.requests[2][0].header(b"x-trailer") is None
    padded = parse(b"GET / HTTP/1.1\r\nhost: t\r\nx:   a b \t \r\nempty:\r\n\r\n")
    assert padded.requests[0][0].headers == [(b"host", b"t"), (b"x", b"a b"), (b"empty", b"")]


def test_keep_alive_follows_h11_not_llhttp():
    assert requests(parse(b"GET / HTTP/1.1\r\nhost: t\r\nconnection: x, Close\r\n\r\n")) == [
        (b"GET", b"/", b"", False)]
    # HTTP/1.0 never keeps the connection, even when it asks; what follows is not parsed
    parser = parse(b"GET / HTTP/1.0\r\nconnection: keep-alive\r\n\r\nGET /2 HTTP/1.1\r\n\r\n")
    assert requests(parser) == [(b"GET", b"/", b"", False)]
    assert parser.error is None and parser.stopped
    assert parser.requests[0][0].http_version == b"1.0"


MALFORMED = [
    # request smuggling: both framings
    (b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n"
     b"0\r\n\r\n"),
    (b"POST / HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n"
     b"0\r\n\r\n"),
    b"POST / HTTP/1.1\r\nhost: t\r\ntransfer-encoding: gzip\r\n\r\n",
    b"POST / HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
    (b"POST / HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked"
     b"\r\n\r\n0\r\n\r\n"),
    b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 1, 2\r\n\r\nab",
    b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\nab",
    b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: -1\r\n\r\n",
    # line endings, folding, bytes
    b"GET / HTTP/1.1\nhost: t\n\n",
    b"GET / HTTP/1.1\r\nhost: t\nx: y\r\n\r\n",
    b"GET / HTTP/1.1\r\nhost: t\r\nx: a\rb\r\n\r\n",
    b"GET / HTTP/1.1\r\nhost: t\r\nx: a\r\n  folded\r\n\r\n",
    b"GET / HTTP/1.1\r\nhost: t\r\nx: a\x00b\r\n\r\n",
    b"GET / HTTP/1.1\r\nhost: t\r\nx : y\r\n\r\n",
    b"GET / HTTP/1.1\r\nhost: t\r\n: empty name\r\n\r\n",
    b"GET /\x00 HTTP/1.1\r\nhost: t\r\n\r\n",
    # request line, version, host
    b"GARBAGE\r\n\r\n",
    b"FOO / HTTP/1.1\r\nhost: t\r\n\r\n",
    b"post / HTTP/1.1\r\nhost: t\r\n\r\n",
    b"GET /\r\n\r\n",
    b"GET / HTTP/2.0\r\nhost: t\r\n\r\n",
    b"GET / HTTP/1.2\r\nhost: t\r\n\r\n",
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    b"GET / HTTP/1.1\r\n\r\n",
    b"GET / HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n",
    # chunk framing
    b"POST / HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nabc\r\n",
    b"POST / HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n3\nabc\n0\r\n\r\n",
    b"POST / HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n",
]


@pytest.mark.parametrize("raw", MALFORMED)
def test_malformed_input_is_a_bad_request_and_stops_parsing(raw):
    parser = parse(raw)
    assert type(parser.error) is BadRequest, raw
    assert parser.error.http_status == 400
    assert str(parser.error).startswith("malformed request: ")
    assert parser._counters.bad_requests == 1 and parser._counters.too_large == 0
    assert not parser.requests and parser.stopped
    parser.feed(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")  # nothing more is parsed
    assert not parser.requests and parser._counters.bad_requests == 1


def test_requests_pipelined_before_a_malformed_one_are_kept():
    good = b"GET /1 HTTP/1.1\r\nhost: t\r\n\r\n"
    for bad in MALFORMED:
        parser = parse(good + good + bad)
        assert [r.target for r, _ in parser.requests] == [b"/1", b"/1"], bad
        assert type(parser.error) is BadRequest, bad


def test_http_10_needs_no_host_and_gets_its_version():
    parser = parse(b"GET /old HTTP/1.0\r\n\r\n")
    assert requests(parser) == [(b"GET", b"/old", b"", False)]


def test_upgrade_requests_are_plain_requests_with_their_bodies():
    then = b"GET /next HTTP/1.1\r\nhost: t\r\n\r\n"
    with_length = (b"POST /up HTTP/1.1\r\nhost: t\r\nconnection: Upgrade, HTTP2-Settings\r\n"
                   b"upgrade: h2c\r\ncontent-length: 5\r\n\r\nhello")
    chunked = (b"POST /up HTTP/1.1\r\nhost: t\r\nconnection: upgrade\r\nupgrade: h2c\r\n"
               b"transfer-encoding: chunked\r\n\r\n2\r\nhe\r\n3\r\nllo\r\n0\r\n\r\n")
    no_body = b"GET /up HTTP/1.1\r\nhost: t\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n"
    connect = b"CONNECT example.com:443 HTTP/1.1\r\nhost: example.com\r\n\r\n"
    for upgrade, body in ((with_length, b"hello"), (chunked, b"hello"), (no_body, b""),
                          (connect, b"")):
        data = upgrade + then
        for cut in (len(data), len(upgrade) - 3, len(upgrade) + 2):
            parser = parse(data[:cut], data[cut:])
            assert [(r.body, r.target) for r, _ in parser.requests] == [
                (body, upgrade.split(b" ")[1]), (b"", b"/next")], (upgrade, cut)
            assert parser.error is None and not parser.in_message
        assert parser.requests[0][0].header(b"upgrade") is not None or connect == upgrade


def test_too_many_headers_or_too_large_a_head_is_431():
    many = b"GET / HTTP/1.1\r\nhost: t\r\n" + b"".join(b"x-%d: v\r\n" % i for i in range(10))
    parser = parse(many + b"\r\n", max_header_count=10)
    assert type(parser.error) is HeaderFieldsTooLarge and parser.error.http_status == 431
    assert parser._counters.too_large == 1 and parser._counters.bad_requests == 0
    big = b"GET / HTTP/1.1\r\nhost: t\r\nx-big: " + b"v" * 3000 + b"\r\n\r\n"
    assert type(parse(big, max_header_bytes=2048).error) is HeaderFieldsTooLarge
    assert parse(big, max_header_bytes=4096).requests


def test_an_unfinished_head_over_the_limit_is_431_before_it_ends():
    head = b"GET / HTTP/1.1\r\nhost: t\r\nx-long: "
    parser = parse(head + b"z" * 2100, max_header_bytes=2048)  # one read
    assert type(parser.error) is HeaderFieldsTooLarge
    parser = parse(head, *[b"z" * 100] * 30, max_header_bytes=2048)  # dribbled
    assert type(parser.error) is HeaderFieldsTooLarge
    parser = parse(head, *[b"z" * 100] * 15, max_header_bytes=2048)  # still within
    assert parser.error is None and parser.in_message and not parser.head_done


def test_a_head_behind_a_pipelined_request_is_measured_from_the_next_read():
    """(The read that ended the first request counts only the second head's parsed fields.)"""
    first = b"GET /1 HTTP/1.1\r\nhost: t\r\n\r\n"
    head = b"GET /2 HTTP/1.1\r\nhost: t\r\nx-long: " + b"z" * 1000
    parser = parse(first + head, max_header_bytes=2048)
    assert parser.error is None and len(parser.requests) == 1
    parser.feed(b"z" * 1100)
    assert parser.error is None
    parser.feed(b"z" * 1000)
    assert type(parser.error) is HeaderFieldsTooLarge


def test_a_declared_body_over_the_limit_is_413_before_any_byte_of_it():
    parser = parse(b"POST / HTTP/1.1\r\nhost: t\r\nexpect: 100-continue\r\n"
                   b"content-length: 101\r\n\r\n", max_body_bytes=100)
    assert type(parser.error) is PayloadTooLarge and parser.error.http_status == 413
    assert parser._counters.too_large == 1


def test_a_chunked_body_is_413_the_moment_it_passes_the_limit():
    head = b"POST / HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n"
    parser = parse(head, b"40\r\n" + b"y" * 64 + b"\r\n", max_body_bytes=100)
    assert parser.error is None and parser.head_done and parser.body_bytes == 64
    parser.feed(b"40\r\n" + b"y" * 64)
    assert type(parser.error) is PayloadTooLarge


@pytest.mark.parametrize("size_line", [b"ffffffffffffffff", b"65", b"0065;name=value", b"65;a;b=\"c\""])
def test_a_chunk_declared_past_the_limit_is_413_as_soon_as_its_size_line_is_in(size_line):
    """Not when the body deadline passes (408 after a minute): whatever the read boundaries,
    the read that completes the size line gets the 413."""
    head = b"POST / HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n"
    raw = head + b"a\r\n" + b"x" * 10 + b"\r\n" + size_line + b"\r\n" + b"y" * 5
    line_end = raw.index(size_line) + len(size_line) + 2
    for cut in range(1, len(raw)):
        for reads in ((raw[:cut], raw[cut:]),
                      tuple(raw[i:i + 7] for i in range(0, len(raw), 7))):
            parser = RequestParser(ServerLimits(max_body_bytes=100), ServerCounters(), None)
            fed = 0
            for data in reads:
                parser.feed(data)
                fed += len(data)
                refused = type(parser.error) is PayloadTooLarge
                assert refused == (fed >= line_end), (cut, fed)
                if refused:
                    break
            else:
                raise AssertionError(f"never refused ({cut})")


def test_chunks_within_the_limit_are_read_whatever_their_sizes_and_boundaries():
    head = b"POST / HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n"
    raw = (head + b"0000000032;ext=" + b"e" * 300 + b"\r\n" + b"y" * 50 + b"\r\n"
           + b"32\r\n" + b"z" * 50 + b"\r\n0\r\n\r\n")
    for cut in range(1, len(raw), 3):
        parser = parse(raw[:cut], raw[cut:], max_body_bytes=100)
        assert parser.error is None and requests(parser) == [
            (b"POST", b"/", b"y" * 50 + b"z" * 50, True)], cut

def test_expect_100_continue_only_on_http_11_and_body_state():
    head = b"POST / HTTP/1.1\r\nhost: t\r\nexpect: 100-Continue\r\ncontent-length: 4\r\n\r\n"
    parser = parse(head)
    assert parser.expects_continue and parser.head_done and parser.body_bytes == 0
    parser.feed(b"ab")
    assert parser.body_bytes == 2 and not parser.requests
    parser.feed(b"cd")
    assert requests(parser) == [(b"POST", b"/", b"abcd", True)] and not parser.head_done
    old = parse(b"POST / HTTP/1.0\r\nexpect: 100-continue\r\ncontent-length: 4\r\n\r\n")
    assert not old.expects_continue


def test_a_refusal_behind_an_upgrade_request_with_a_body_is_a_400_not_a_crash():
    """(The fresh parser's callback error was raised inside the upgrade's ``except`` block,
    which made the upgrade its context: the refusal was lost and the upgrade escaped.)"""
    parser = parse(b"CONNECT / HTTP/1.1\r\nhost: t\r\ncontent-length: 1\r\n\r\nx"
                   b"GET / HTTP/1.1\r\n\r\n")
    assert requests(parser) == [(b"CONNECT", b"/", b"x", True)]
    assert type(parser.error) is BadRequest and "Host" in str(parser.error)
