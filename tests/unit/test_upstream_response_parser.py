"""ResponseReader: a worker's response from raw bytes, however the bytes are split."""

from __future__ import annotations

import gc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cortex.upstream.response_parser import MAX_HEAD_BYTES, ResponseReader

CHUNKED = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n"
           b"9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n0\r\n\r\n")
LENGTH = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Trail:  v \t\r\n\r\nhello"


def read(pieces: list[bytes], *, head_only: bool = False) -> tuple[ResponseReader, bytes]:
    reader = ResponseReader(head_only=head_only)
    body = b""
    for piece in pieces:
        reader.feed(piece)
        body += reader.take_body()
    return reader, body


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    return [piece for piece in pieces if piece]  # (an empty piece would be EOF)


@given(st.sampled_from([CHUNKED, LENGTH]), st.lists(st.integers(0, 500), max_size=8))
def test_the_same_response_however_the_bytes_are_split(data, cuts):
    whole, whole_body = read([data])
    reader, body = read(split(data, cuts))
    assert (reader.status, reader.headers, reader.reason, body) == (
        whole.status, whole.headers, whole.reason, whole_body)
    assert reader.complete and reader.reusable and reader.error is None


def test_head_fields_and_bodies():
    reader, body = read([CHUNKED])
    assert (reader.status, reader.http_version, reader.reason) == (200, b"1.1", b"OK")
    assert reader.headers == [(b"content-type", b"text/event-stream"),
                              (b"transfer-encoding", b"chunked")]
    assert body == b"data: 1\n\ndata: 2\n\n"
    reader, body = read([LENGTH])
    assert reader.headers == [(b"content-length", b"5"), (b"x-trail", b"v")]
    assert body == b"hello"


def test_body_bytes_are_handed_out_once_and_in_order():
    reader = ResponseReader()
    reader.feed(CHUNKED[:-20])
    first = reader.take_body()
    assert reader.take_body() == b"" and not reader.has_body and not reader.complete
    reader.feed(CHUNKED[-20:])
    assert first + reader.take_body() == b"data: 1\n\ndata: 2\n\n" and reader.complete


def test_interim_heads_are_skipped():
    reader, body = read([b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early\r\nlink: x\r\n\r\n",
                         b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok"])
    assert (reader.status, reader.reason, reader.headers, body) == (
        201, b"Created", [(b"content-length", b"2")], b"ok")
    assert reader.reusable


def test_no_body_for_head_204_and_304():
    reader, _ = read([b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n"], head_only=True)
    assert reader.complete and reader.reusable
    reader, _ = read([b"HTTP/1.1 200 OK\r\n\r\n"], head_only=True)  # no length, still done
    assert reader.complete and reader.reusable
    for status in (204, 304):
        reader, body = read([b"HTTP/1.1 %d X\r\ncontent-length: 3\r\n\r\n" % status])
        assert reader.complete and reader.reusable and body == b""
    # bytes after a HEAD response's head: not part of it, and the connection is unusable
    reader, body = read([b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nabc"], head_only=True)
    assert reader.complete and not reader.reusable and body == b""


def test_body_until_close():
    reader, body = read([b"HTTP/1.1 200 OK\r\n\r\nsome", b" bytes"])
    assert not reader.complete
    reader.feed(b"")
    assert reader.complete and not reader.reusable and reader.error is None
    assert body == b"some bytes"


def test_keep_alive_rules():
    assert not read([b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"]
                    )[0].reusable
    assert not read([b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n"])[0].reusable
    assert read([b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 0\r\n\r\n"]
                )[0].reusable


def test_bytes_or_eof_past_the_end_make_it_unusable_not_broken():
    for extra in (b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", b"garbage", b""):
        reader, body = read([LENGTH, extra])
        assert reader.complete and reader.error is None and body == b"hello"
        assert not reader.reusable
    reader, _ = read([LENGTH + b"HTTP/1.1 200 OK\r\n"])  # in the same read
    assert reader.complete and reader.error is None and not reader.reusable


def test_faults():
    cases = [
        [b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n"],
        [b"NOT HTTP\r\n\r\n"],
        [b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n"],
        [b"HTTP/1.1 101 Switching\r\nupgrade: h2c\r\nconnection: upgrade\r\n\r\n"],
        [b"HTTP/1.1 200 OK\r\n", b""],  # EOF inside the head
        [b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nabc", b""],  # EOF inside the body
        [b"HTTP/1.1 200 OK\r\nx: " + b"a" * MAX_HEAD_BYTES],  # a head without end
    ]
    for pieces in cases:
        reader, _ = read(pieces)
        assert reader.error is not None and not reader.reusable, pieces


def test_body_received_before_a_fault_is_still_handed_out():
    reader = ResponseReader()
    reader.feed(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\nzz\r\n")
    assert reader.error is not None and reader.take_body() == b"abc"
    reader.feed(b"3\r\ndef\r\n")  # nothing more is accepted
    assert reader.take_body() == b""


@pytest.mark.parametrize("pieces", [
    [LENGTH], [CHUNKED], [LENGTH + b"stray"],  # complete
    [b"NOT HTTP AT ALL\r\n\r\n"],  # refused by llhttp
    [LENGTH[:30], b""],  # EOF cut it short
    [b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (MAX_HEAD_BYTES + 10)],  # head over the limit
], ids=["length", "chunked", "stray", "invalid", "eof", "head-limit"])
def test_an_ended_response_leaves_nothing_to_the_cyclic_collector(pieces):
    # llhttp holds the reader's callbacks; a reader per exchange left in a cycle made the
    # collector run every ~70 requests
    gc.collect()
    gc.disable()
    try:
        reader, _ = read(pieces)
        assert reader.complete or reader.error is not None
        del reader
        assert gc.collect() == 0
    finally:
        gc.enable()
