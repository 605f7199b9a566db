"""How a client connection's bytes move: straight through the non-blocking socket, or through
any trio stream (memory streams in component tests). The I/O shell
``cortex.front.connection`` owns the parser and decides which task reads; a transport only
moves bytes.

Both transports have the same contract:

* ``read_now()`` — bytes that can be had without waiting, ``b""`` at end of stream or after a
  reset, ``None`` if nothing is there; ``reset`` then tells a reset (the client is gone for
  good) from an end of stream (it may have only half-closed, and still read). A socket read is one ``recv``
  (no checkpoint, no trip through trio's scheduler).
* ``await wait()`` — waits until there may be something; returns bytes it received itself
  (``b""`` at the end) or ``None`` (then ``read_now`` again). It is a checkpoint and can be
  cancelled. ``interrupt()`` ends a task's wait with ``trio.ClosedResourceError`` without a
  cancel scope (``notify_closing`` on a socket); so does closing the stream.
* ``unread(data)`` — bytes a wait received that its task no longer wants (a stream receive
  that ended just as it was interrupted): the next ``read_now`` returns them first. Only one
  task waits at a time: a stream's second waiter waits for the first to end.
* ``await send_all(data)`` — like ``trio.abc.SendStream.send_all`` (``BrokenResourceError``
  when the client is gone). On a socket, data the kernel takes at once costs one ``send``
  and no checkpoint beyond a pending cancellation; only the rest goes through trio.
"""

from __future__ import annotations

import socket

import trio

READ_SIZE = 65_536

_wait_readable = trio.lowlevel.wait_readable
_notify_closing = trio.lowlevel.notify_closing
_checkpoint_if_cancelled = trio.lowlevel.checkpoint_if_cancelled


class SocketTransport:
    """Reads and writes the stdlib socket of a trio ``SocketStream`` directly."""

    __slots__ = ("_sock", "_stream", "reset")

    def __init__(self, stream: trio.SocketStream, sock: socket.socket) -> None:
        self._stream = stream
        self._sock = sock
        self.reset = False

    def read_now(self) -> bytes | None:
        try:
            return self._sock.recv(READ_SIZE)
        except BlockingIOError:
            return None
        except OSError:
            self.reset = True
            return b""  # reset (or closed): the client is gone

    async def wait(self) -> bytes | None:
        await _wait_readable(self._sock)
        return None

    def interrupt(self) -> None:
        _notify_closing(self._sock)

    def unread(self, data: bytes) -> None:  # a socket wait never receives bytes itself
        raise AssertionError("SocketTransport.unread")

    async def send_all(self, data: bytes) -> None:
        await _checkpoint_if_cancelled()
        try:
            sent = self._sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            raise trio.BrokenResourceError(exc) from exc
        if sent < len(data):
            await self._stream.send_all(memoryview(data)[sent:])


class StreamTransport:
    """Reads any trio stream with ``receive_some``."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self._stream = stream
        self.send_all = stream.send_all
        self._pending: list[bytes] = []
        self._scope: trio.CancelScope | None = None
        self._busy = False  # a task is inside receive_some
        self._done = trio.lowlevel.ParkingLot()
        self.reset = False

    def read_now(self) -> bytes | None:
        return self._pending.pop(0) if self._pending else None

    async def wait(self) -> bytes | None:
        while self._busy:
            await self._done.park()
        if self._pending:
            return self._pending.pop(0)
        self._busy = True
        try:
            with trio.CancelScope() as scope:
                self._scope = scope
                try:
                    return await self._stream.receive_some(READ_SIZE)
                except trio.BrokenResourceError:
                    self.reset = True
                    return b""
        finally:
            self._scope = None
            self._busy = False
            self._done.unpark_all()
        raise trio.ClosedResourceError("the wait was interrupted")

    def interrupt(self) -> None:
        if self._scope is not None:
            self._scope.cancel()

    def unread(self, data: bytes) -> None:
        self._pending.insert(0, data)


def transport_for(stream: trio.abc.Stream) -> SocketTransport | StreamTransport:
    """A ``SocketTransport`` for a trio ``SocketStream`` (its stdlib socket, which trio keeps
    non-blocking), else a ``StreamTransport``."""
    if isinstance(stream, trio.SocketStream):
        sock = getattr(stream.socket, "_sock", None)  # trio's SocketType wraps a stdlib socket
        if isinstance(sock, socket.socket):
            return SocketTransport(stream, sock)
    return StreamTransport(stream)
