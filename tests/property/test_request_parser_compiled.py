"""The compiled pass for whole plain requests (``cortex._fast.http_request``) reads exactly what
the llhttp path reads: for any bytes it accepts, ``RequestParser(compiled=False)`` fed the same
request yields the same request and no error; and a connection's reads give the same requests,
errors and counters with the pass as without it, whatever the read boundaries. Requests are
built to sit near every rule: methods, targets and versions llhttp refuses or reads apart,
header names that are not tokens, values with control or non-ASCII bytes, obs-fold, bare CR or
LF, the framing and upgrade headers, repeated or malformed ``content-length``, bodies cut short,
tight limits."""

from __future__ import annotations

import dataclasses
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from cortex._fast.http_request import parse_request
from cortex.front.limits import ServerLimits
from cortex.front.request_parser import RequestParser
from cortex.front.shared import ServerCounters

_METHODS = [b"GET", b"POST", b"HEAD", b"PUT", b"DELETE", b"OPTIONS", b"PATCH", b"CONNECT",
            b"TRACE", b"get", b"POSTX", b"PO ST", b""]
_VERSIONS = [b"HTTP/1.1", b"HTTP/1.0", b"HTTP/1.2", b"HTTP/2.0", b"http/1.1", b"HTTP/1.1 "]
_NAMES = [b"Host", b"host", b"HOST", b"Content-Length", b"content-length", b"Connection",
          b"Transfer-Encoding", b"Expect", b"Upgrade", b"Proxy-Connection", b"Content-Type",
          b"X-A", b"x_b", b"Bad Name", b"", b"X:Y", b"X-\xc3\xa9", b"Keep-Alive"]
_VALUES = [b"t", b"127.0.0.1:8000", b"close", b"keep-alive", b"Upgrade", b"keep-alive, close",
           b"chunked", b"100-continue", b"websocket", b"application/json", b"0", b"5", b"05",
           b"+5", b"5 5", b"-1", b"99999999999999999999", b"", b" a ", b"\ta\t"]
_ASCII = st.binary(min_size=0, max_size=8).map(lambda b: bytes(x % 128 for x in b))
_TARGET = st.one_of(
    st.builds(lambda tail: b"/" + tail,
              st.text(alphabet=[chr(c) for c in range(0x21, 0x7F)], max_size=12).map(str.encode)),
    st.sampled_from([b"*", b"http://h/x", b"/a b", b"/\x7f", b"/\xc3\xa9", b"/a\tb", b""]),
)
_VALUE = st.one_of(st.sampled_from(_VALUES), _ASCII, st.binary(max_size=6))
_EOL = st.sampled_from([b"\r\n"] * 12 + [b"\n", b"\r", b"\r\n "])


_GOOD_NAMES = [b"Host", b"Content-Type", b"Accept", b"X-Request-Id", b"Authorization",
               b"user-agent", b"Connection"]
_GOOD_VALUES = [b"t", b"application/json", b"*/*", b"keep-alive", b"close", b"a b\tc", b""]


@st.composite
def _request(draw: st.DrawFn) -> bytes:
    """Mostly a valid request (one the pass should take), each part replaced now and then by
    one that sits near a rule."""
    def pick(good: st.SearchStrategy, odd: st.SearchStrategy) -> bytes:
        return draw(odd) if draw(st.integers(0, 9)) == 0 else draw(good)

    method = pick(st.sampled_from(_METHODS[:7]), st.sampled_from(_METHODS))
    target = pick(st.builds(lambda t: b"/" + t, st.text(
        alphabet=[chr(c) for c in range(0x21, 0x7F)], max_size=12).map(str.encode)), _TARGET)
    version = pick(st.sampled_from(_VERSIONS[:2]), st.sampled_from(_VERSIONS))
    body = draw(st.binary(max_size=12))
    def eol() -> bytes:
        return pick(st.just(b"\r\n"), _EOL)

    head = method + b" " + target + b" " + version + eol()
    lines = [(b"Host", b"t")] if pick(st.just(True), st.booleans()) else []
    lines += draw(st.lists(st.tuples(st.sampled_from(_GOOD_NAMES + _NAMES),
                                     st.one_of(st.sampled_from(_GOOD_VALUES), _VALUE)),
                           max_size=4))
    if body or draw(st.booleans()):
        length = len(body) - pick(st.just(0), st.integers(-2, 2))
        lines.append((b"Content-Length", pick(st.just(str(length).encode()), _VALUE)))
    for name, value in draw(st.permutations(lines)):
        colon = pick(st.sampled_from([b":", b": ", b":\t", b":  "]), st.just(b" :"))
        head += name + colon + value + pick(st.sampled_from([b"", b" ", b"\t"]),
                                            st.just(b"")) + eol()
    return head + eol() + body


def _limits(count: int, head_bytes: int, body_bytes: int) -> ServerLimits:
    return ServerLimits(max_header_count=count, max_header_bytes=head_bytes,
                        max_body_bytes=body_bytes)


_LIMITS = st.one_of(st.just(ServerLimits()), st.builds(
    _limits, st.integers(1, 6), st.integers(20, 200), st.integers(1, 14)))


def _reads(parser: RequestParser, reads: list[bytes]) -> tuple:
    for data in reads:
        parser.feed(data)
    return ([(r.method, r.target, r.headers, r.body, r.http_version, r.client, keep)
             for r, keep in parser.requests], type(parser.error), parser.error and
            str(parser.error), parser.stopped, dataclasses.astuple(parser._counters))


@settings(max_examples=1000, deadline=None)
@given(_request(), st.binary(max_size=8), _LIMITS)
def test_what_the_pass_accepts_llhttp_reads_the_same(request: bytes, after: bytes,
                                                     limits: ServerLimits) -> None:
    data = request + after
    whole = parse_request(data, limits.max_header_count, limits.max_header_bytes,
                          limits.max_body_bytes)
    if whole is None:
        return
    method, target, headers, body, version, keep_alive, consumed = whole
    reference = RequestParser(limits, ServerCounters(), ("c", 1), compiled=False)
    reference.feed(data[:consumed])
    assert reference.error is None
    assert not reference.in_message
    [(parsed, keep)] = reference.requests
    assert (parsed.method, parsed.target, parsed.headers, parsed.body, parsed.http_version,
            keep) == (method, target, headers, body, version, keep_alive)


@settings(max_examples=500, deadline=None)
@given(st.lists(_request(), min_size=1, max_size=3), st.lists(st.integers(0, 200), max_size=3),
       _LIMITS)
def test_a_connection_reads_the_same_with_and_without_the_pass(
        requests: list[bytes], cuts: list[int], limits: ServerLimits) -> None:
    data = b"".join(requests)
    edges = sorted({min(cut, len(data)) for cut in cuts} | {0, len(data)})
    reads = [data[a:b] for a, b in itertools.pairwise(edges)]
    compiled = RequestParser(limits, ServerCounters(), ("c", 1))
    reference = RequestParser(limits, ServerCounters(), ("c", 1), compiled=False)
    assert _reads(compiled, reads) == _reads(reference, reads)


def test_the_requests_a_gateway_sees_take_the_pass() -> None:
    limits = ServerLimits()
    bodies = [
        (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:8000\r\n"
         b"content-type: application/json\r\ncontent-length: 2\r\n\r\n{}"),
        (b"POST /v1/chat/completions HTTP/1.1\r\nHost: api\r\nAccept-Encoding: gzip, deflate"
         b"\r\nConnection: keep-alive\r\nAccept: application/json\r\n"
         b"Content-Type: application/json\r\nUser-Agent: OpenAI/Python 1.0\r\n"
         b"Authorization: Bearer x\r\nContent-Length: 2\r\n\r\n{}"),
        (b"GET /health/ready HTTP/1.1\r\nHost: localhost:8000\r\nUser-Agent: curl/8.0\r\n"
         b"Accept: */*\r\n\r\n"),
        b"GET /v1/models HTTP/1.0\r\n\r\n",
    ]
    for data in bodies:
        whole = parse_request(data, limits.max_header_count, limits.max_header_bytes,
                              limits.max_body_bytes)
        assert whole is not None and whole[-1] == len(data), data
