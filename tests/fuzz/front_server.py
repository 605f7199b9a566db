"""A running Cortex data plane (real gateway over one simulated vLLM engine) for fuzz tests
driven by hypothesis, and a small blocking HTTP exchange helper.

Hypothesis drives synchronous functions, so a fuzz test is an async test that starts the
gateway (``fuzz_front()``, in the main thread's trio loop) and runs the hypothesis function in
a worker thread (``trio.to_thread.run_sync``); each fuzz case is one blocking socket exchange
against the gateway. Read timeouts of the server are short (``LIMITS``), so an incomplete request costs a fraction
of a second, not ten.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from cortex.app import Running
from cortex.config.tree import UpstreamConfig
from cortex.front.limits import ServerLimits
from tests.chaos.cluster import chaos_cluster

LIMITS = ServerLimits(header_timeout_s=0.4, body_timeout_s=0.4, max_body_bytes=1 << 20,
                      max_header_bytes=16_384, max_header_count=50, keepalive_idle_s=5.0)
CLIENT_TIMEOUT_S = 10.0  # a case with no answer and no close by then counts as stuck


@dataclass
class Front:
    port: int
    running: Running


@asynccontextmanager
async def fuzz_front() -> AsyncIterator[Front]:
    # Default upstream deadlines: a valid 1 MiB prompt may take the engine seconds.
    async with chaos_cluster(("vllm-0.33",), server_limits=LIMITS,
                             upstream=UpstreamConfig()) as cluster:
        yield Front(cluster.port, cluster.running)


@dataclass(frozen=True)
class Answer:
    status: int | None  # None: the server closed without answering
    head: bytes
    body: bytes
    closed: bool  # the server closed the connection after (or instead of) answering


def exchange(port: int, data: bytes | list[bytes], *, half_close: bool = False,
             timeout_s: float = CLIENT_TIMEOUT_S) -> Answer:
    """Send ``data`` (pieces sent one by one), read one response (or the close)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        try:
            for piece in [data] if isinstance(data, bytes) else data:
                sock.sendall(piece)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server refused early and closed: its answer may still be readable
        first = data if isinstance(data, bytes) else b"".join(data)
        return read_answer(sock, head_request=first.startswith(b"HEAD "))


def read_answer(sock: socket.socket, *, head_request: bool = False) -> Answer:
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        chunk = _recv(sock)
        if not chunk:
            if buffer:
                raise AssertionError(f"connection closed inside a response head: {buffer!r}")
            return Answer(None, b"", b"", True)
        buffer += chunk
    head, body = buffer.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    version, status, _ = (lines[0] + b"  ").split(b" ", 2)
    assert version == b"HTTP/1.1", lines[0]
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    if status[:1] == b"1":  # 100 Continue: the real answer follows
        return read_answer_from(sock, body, head_request)
    closed = False
    if head_request or status in (b"204", b"304"):
        pass
    elif b"content-length" in headers:
        length = int(headers[b"content-length"])
        while len(body) < length:
            chunk = _recv(sock)
            if not chunk:
                raise AssertionError(f"body cut at {len(body)} of {length} bytes")
            body += chunk
        body = body[:length]  # (answers to pipelined requests may follow)
    elif headers.get(b"transfer-encoding") == b"chunked":
        while not body.endswith(b"0\r\n\r\n"):
            chunk = _recv(sock)
            if not chunk:
                closed = True
                break
            body += chunk
    else:
        while chunk := _recv(sock):
            body += chunk
        closed = True
    if headers.get(b"connection") == b"close" and not closed:
        closed = not _recv(sock)
    return Answer(int(status), head, body, closed)


def read_answer_from(sock: socket.socket, already: bytes, head_request: bool) -> Answer:
    class _Prefilled:
        def __init__(self) -> None:
            self.pending = already

        def recv(self, size: int) -> bytes:
            if self.pending:
                data, self.pending = self.pending, b""
                return data
            return sock.recv(size)

    return read_answer(_Prefilled(), head_request=head_request)  # type: ignore[arg-type]


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except ConnectionResetError:
        return b""
