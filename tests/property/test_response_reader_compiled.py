"""The compiled pass for whole plain worker responses (``cortex._fast.http_response``) reads
exactly what llhttp reads: a ``ResponseReader`` ends in the same state (head, body, completion,
reusability, error) with the pass as without it, for responses built near every rule (interim
and body-less statuses, chunked and unframed bodies, repeated or malformed lengths, bodies cut
short or followed by stray bytes, header bytes llhttp refuses, ``connection`` tokens), read in
one piece or several, with or without the worker closing after."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from cortex._fast.http_response import parse_response
from cortex.upstream.response_parser import ResponseReader

_STATUS = [b"200 OK", b"201 Created", b"404 Not Found", b"503 Busy", b"200 ", b"599 x",
           b"204 No Content", b"304 Not Modified", b"100 Continue", b"101 Switching",
           b"600 Odd", b"20 Short", b"200", b"2x0 Bad", b"200 \xc3\xa9"]
_VERSIONS = [b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"http/1.1"]
_NAMES = [b"Content-Type", b"X-A", b"Connection", b"Transfer-Encoding", b"Upgrade",
          b"Proxy-Connection", b"Keep-Alive", b"Bad Name", b"", b"X-\xc3\xa9", b"Date"]
_VALUES = [b"application/json", b"close", b"keep-alive", b"Upgrade", b"keep-alive, close",
           b"chunked", b"", b" a ", b"\ta\t", b"x\x01y", b"\xc3\xa9", b"a\x7f"]
_EOL = st.sampled_from([b"\r\n"] * 12 + [b"\n", b"\r"])


@st.composite
def _response(draw: st.DrawFn) -> bytes:
    """Mostly a plain JSON answer, each part now and then replaced by one near a rule."""
    def pick(good: st.SearchStrategy, odd: st.SearchStrategy) -> bytes:
        return draw(odd) if draw(st.integers(0, 9)) == 0 else draw(good)

    def eol() -> bytes:
        return pick(st.just(b"\r\n"), _EOL)

    body = draw(st.binary(max_size=12))
    head = (pick(st.just(b"HTTP/1.1"), st.sampled_from(_VERSIONS)) + b" "
            + pick(st.sampled_from(_STATUS[:6]), st.sampled_from(_STATUS)) + eol())
    lines = draw(st.lists(st.tuples(
        st.sampled_from(_NAMES[:3] + _NAMES),
        st.one_of(st.sampled_from(_VALUES[:5]), st.sampled_from(_VALUES),
                  st.binary(max_size=5))), max_size=3))
    if pick(st.just(True), st.booleans()):
        length = len(body) - pick(st.just(0), st.integers(-2, 2))
        lines.append((b"Content-Length", pick(st.just(str(length).encode()),
                                              st.sampled_from([b"+1", b"1 1", b"", b"-0"]))))
        if draw(st.integers(0, 19)) == 0:
            lines.append((b"Content-Length", str(len(body)).encode()))
    for name, value in draw(st.permutations(lines)):
        head += (name + pick(st.sampled_from([b":", b": ", b":\t"]), st.just(b" :")) + value
                 + pick(st.sampled_from([b"", b" "]), st.just(b"\t")) + eol())
    return head + eol() + body + pick(st.just(b""), st.binary(min_size=1, max_size=6))


def _state(reader: ResponseReader) -> tuple:
    return (reader.status, reader.headers, reader.http_version, reader.reason, reader.head_done,
            reader.complete, reader.error, reader.take_body(), reader.reusable)


@settings(max_examples=1500, deadline=None)
@given(_response(), st.lists(st.integers(0, 120), max_size=2), st.booleans(), st.booleans())
def test_a_reader_ends_in_the_same_state_with_and_without_the_pass(
        data: bytes, cuts: list[int], eof: bool, head_only: bool) -> None:
    edges = sorted({min(cut, len(data)) for cut in cuts} | {0, len(data)})
    reads = [data[a:b] for a, b in itertools.pairwise(edges)] + ([b""] if eof else [])
    compiled = ResponseReader(head_only=head_only)
    reference = ResponseReader(head_only=head_only, compiled=False)
    for chunk in reads:
        compiled.feed(chunk)
        reference.feed(chunk)
        assert _state(compiled) == _state(reference)


@settings(max_examples=800, deadline=None)
@given(_response())
def test_what_the_pass_accepts_is_a_whole_reusable_answer(data: bytes) -> None:
    whole = parse_response(data)
    if whole is None:
        return
    status, reason, headers, body, keep_alive = whole
    reference = ResponseReader(compiled=False)
    reference.feed(data)
    assert reference.complete and reference.error is None
    assert (reference.status, reference.reason, reference.headers, reference.take_body(),
            reference.reusable) == (status, reason, headers, body, keep_alive)


def test_a_mock_workers_json_answer_takes_the_pass() -> None:
    data = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n"
            b"x-request-id: 7\r\n\r\n{}")
    reader = ResponseReader()
    reader.feed(data)
    assert reader._parser is None and reader.complete and reader.reusable  # llhttp never made
    assert parse_response(data) is not None
