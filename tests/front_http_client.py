"""A raw HTTP/1.1 test client over a real trio stream: bytes out exactly as the test writes them,
responses parsed by a small independent reader (not h11, so the server's framing is checked by
different code than the one producing it)."""

from __future__ import annotations

import socket
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass

import trio


@dataclass
class RawResponse:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    raw_head: bytes

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def header_values(self, name: bytes) -> list[bytes]:
        return [value for key, value in self.headers if key == name]


class RawClient:
    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buffer = b""
        self.eof = False

    @classmethod
    async def connect(cls, port: int, host: str = "127.0.0.1") -> RawClient:
        return cls(await trio.open_tcp_stream(host, port))

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def abort(self) -> None:
        """Leave for good: close with a reset (SO_LINGER 0), as a crashed client's kernel or
        a client that cancels its request does — not a half-close the server must serve."""
        self.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                      struct.pack("ii", 1, 0))
        await self.stream.aclose()

    async def half_close(self) -> None:
        """``shutdown(SHUT_WR)``: nothing more to send, still reading (legal in HTTP/1.1)."""
        await self.stream.send_eof()

    async def _fill(self) -> bool:
        if self.eof:
            return False
        try:
            data = await self.stream.receive_some(65536)
        except trio.BrokenResourceError:
            data = b""
        if not data:
            self.eof = True
            return False
        self.buffer += data
        return True

    async def read_exactly(self, count: int) -> bytes:
        while len(self.buffer) < count:
            if not await self._fill():
                raise EOFError(f"EOF after {len(self.buffer)} of {count} bytes")
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data

    async def read_line(self) -> bytes:
        """Up to and including the next CRLF."""
        while b"\r\n" not in self.buffer:
            if not await self._fill():
                raise EOFError(f"EOF before end of line: {self.buffer!r}")
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line + b"\r\n"

    async def read_head(self) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            if not await self._fill():
                raise EOFError(f"EOF before end of head: {self.buffer!r}")
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        headers = []
        for line in lines[1:]:
            name, value = line.split(b":", 1)
            headers.append((name.strip().lower(), value.strip()))
        return status, headers, head

    async def read_chunk(self) -> bytes:
        """One chunk of a chunked body (``b""`` for the terminating chunk, trailers read)."""
        size = int((await self.read_line()).split(b";")[0], 16)
        if size == 0:
            while await self.read_line() != b"\r\n":
                pass
            return b""
        data = await self.read_exactly(size)
        assert await self.read_exactly(2) == b"\r\n"
        return data

    async def read_until_eof(self) -> bytes:
        while await self._fill():
            pass
        data, self.buffer = self.buffer, b""
        return data

    async def read_response(self, *, head_request: bool = False) -> RawResponse:
        status, headers, raw_head = await self.read_head()
        while 100 <= status < 200:
            status, headers, raw_head = await self.read_head()
        response = RawResponse(status, headers, b"", raw_head)
        if head_request or status in (204, 304):
            return response
        response.body = b"".join([part async for part in self.body_parts(headers)])
        return response

    async def body_parts(self, headers: list[tuple[bytes, bytes]]) -> AsyncIterator[bytes]:
        """The body after a head with ``headers``, as it arrives: each chunk of a chunked
        body, a ``content-length`` body in one piece (what Cortex sends for an answer, SSE
        included, that was whole at its first read), else everything up to end of stream."""
        fields = dict(headers)
        if fields.get(b"transfer-encoding") == b"chunked":
            while chunk := await self.read_chunk():
                yield chunk
        elif (length := fields.get(b"content-length")) is not None:
            yield await self.read_exactly(int(length))
        else:
            yield await self.read_until_eof()

    async def request(self, method: bytes, target: bytes, body: bytes = b"",
                      headers: list[tuple[bytes, bytes]] | None = None) -> RawResponse:
        await self.send(build_request(method, target, body, headers))
        return await self.read_response(head_request=method == b"HEAD")


def build_request(method: bytes, target: bytes, body: bytes = b"",
                  headers: list[tuple[bytes, bytes]] | None = None,
                  version: bytes = b"1.1") -> bytes:
    lines = [b"%s %s HTTP/%s" % (method, target, version), b"host: test"]
    lines += [b"%s: %s" % pair for pair in headers or []]
    if body or method in (b"POST", b"PUT"):
        lines.append(b"content-length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def chat_request(body: bytes) -> bytes:
    """A keep-alive ``POST /v1/chat/completions`` carrying ``body`` as JSON."""
    return build_request(b"POST", b"/v1/chat/completions", body,
                         [(b"content-type", b"application/json")])


async def read_broken_stream(client: RawClient) -> list[bytes]:
    """The chunks of a chunked body that must end broken (EOF or garbage before the final
    chunk); fails if it ends as if complete."""
    chunks = []
    try:
        while chunk := await client.read_chunk():
            chunks.append(chunk)
    except (EOFError, ValueError):
        return chunks
    raise AssertionError("the stream ended as if complete")
