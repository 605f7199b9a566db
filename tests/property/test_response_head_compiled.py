"""The writer's compiled response head (``response_head``, ``cortex._fast.http_head``) equals
its Python reference — ``encode_head(response_headers(...))`` plus the streamed body's
``content-length`` and chunked rules — byte for byte, and refuses exactly what it refuses."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cortex.front import response_head as rh
from cortex.front.response_head import (
    NO_BODY_STATUS,
    UnsendableResponse,
    encode_head,
    response_head,
    response_headers,
)

_NAMES = [b"content-type", b"Content-Length", b"content-length", b"CONNECTION", b"keep-alive",
          b"Transfer-Encoding", b"te", b"trailer", b"upgrade", b"Date", b"server",
          b"proxy-authenticate", b"Proxy-Thing", b"x-cortex-match-mode", b"X-Custom",
          b"cache-control", b"c", b"p", b"proxy", b"content-lengths"]
_name = st.one_of(
    st.sampled_from(_NAMES),
    st.binary(min_size=0, max_size=8),  # anything: empty, spaces, colons, non-ASCII
    st.text(alphabet="abcXYZ-_!~:; ", min_size=1, max_size=8).map(str.encode),
)
_value = st.one_of(
    st.sampled_from([b"", b"0", b"12", b"007", b"1" * 25, b"text/event-stream", b"close"]),
    st.binary(max_size=10),  # CR, LF, NUL and the rest
    st.text(alphabet="0123456789 +-x\r\n\t", max_size=6).map(str.encode),
)
_headers = st.lists(st.tuples(_name, _value), max_size=8)


def _reference(status: int, headers, server: bytes, close: bool, length: int | None,
               chunked_ok: bool):
    try:
        kept = response_headers(status, headers, server, close, length)
        found, chunked = None, False
        if length is None and status not in NO_BODY_STATUS:
            for name, value in kept:
                if name == b"content-length":
                    if not value.isdigit():
                        raise UnsendableResponse(f"content-length {value!r}")
                    found = int(value)
            if found is None and chunked_ok:
                kept.append((b"transfer-encoding", b"chunked"))
                chunked = True
        head = encode_head(status, kept)
    except UnsendableResponse:
        return "unsendable"
    return head, (length if length is not None else found), chunked


def _compiled(status: int, headers, server: bytes, close: bool, length: int | None,
              chunked_ok: bool):
    try:
        return response_head(status, headers, server, close, length, chunked_ok)
    except UnsendableResponse:
        return "unsendable"


@settings(max_examples=3000, deadline=None)
@given(st.sampled_from([200, 201, 204, 304, 404, 500, 503, 599, 999, 100, 1000]), _headers,
       st.sampled_from([b"cortex", b"cortex/1.0", b"bad\r\nserver"]), st.booleans(),
       st.one_of(st.none(), st.integers(0, 10**6)), st.booleans())
def test_the_compiled_head_equals_the_reference(status, headers, server, close, length,
                                                chunked_ok):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rh.DateHeader, "now", classmethod(lambda cls: b"Wed, 02 Dec 2026 GMT"))
        assert _compiled(status, headers, server, close, length, chunked_ok) == _reference(
            status, headers, server, close, length, chunked_ok)


def test_names_and_values_of_another_type_are_type_errors():
    for headers in ([("content-type", b"x")], [(b"content-type", "x")]):
        with pytest.raises(TypeError):
            response_head(200, headers, b"cortex", False, 0)
