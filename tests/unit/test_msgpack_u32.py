"""``unpack_u32_array`` reads exactly what msgspec reads as a list of u32 ints, or refuses."""

from __future__ import annotations

import msgspec
import pytest
from cortex._fast.msgpack_u32 import unpack_u32_array
from hypothesis import given
from hypothesis import strategies as st


def reference(raw: bytes) -> list[int] | None:
    try:
        value = msgspec.msgpack.decode(raw)
    except msgspec.DecodeError:
        return None
    if type(value) is not list:
        return None
    if not all(type(v) is int and 0 <= v < 2**32 for v in value):
        return None
    return value


def assert_agrees_with_msgspec(raw: bytes) -> None:
    expected = reference(raw)
    if expected is None:
        with pytest.raises(ValueError):
            unpack_u32_array(raw)
    else:
        assert list(unpack_u32_array(raw)) == expected


@given(st.lists(st.integers(0, 2**32 - 1), max_size=600))
def test_valid_arrays_unpack_exactly(values):
    assert list(unpack_u32_array(msgspec.msgpack.encode(values))) == values


@pytest.mark.parametrize(
    "raw",
    [
        b"\xcd\x00\x01\x00",  # a signed encoding of a non-negative int (int16)
        b"\x92\xd1\x00\x01\xd3" + (5).to_bytes(8, "big"),
        b"\x91\xcf" + (2**32 - 1).to_bytes(8, "big"),  # uint64 holding a u32 value
    ],
)
def test_every_integer_encoding_of_a_u32_is_accepted(raw):
    assert_agrees_with_msgspec(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x80",  # a map
        b"\x91",  # truncated
        b"\x92\x01",
        b"\x91\xce\x00\x00",  # truncated uint32
        b"\x91\xff",  # negative fixint
        b"\x91\xd0\xff",  # int8 -1
        b"\x91\xcf" + (2**32).to_bytes(8, "big"),  # too big
        b"\x91\xa1a",  # a string
        b"\x91\xc0",  # nil
        b"\x91\xca\x00\x00\x00\x00",  # float32
        b"\x91\x01\x01",  # trailing bytes
        b"\xdc\xff\xff",  # claims 65535 elements
        b"\xdd\xff\xff\xff\xff\x01",
    ],
)
def test_anything_else_is_refused(raw):
    with pytest.raises(ValueError):
        unpack_u32_array(raw)


@given(st.binary(max_size=64))
def test_random_bytes_agree_with_msgspec(raw):
    assert_agrees_with_msgspec(raw)
