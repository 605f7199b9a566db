"""Await pyzmq sockets from trio without threads.

A ZeroMQ socket's ``FD`` is an edge-triggered notification descriptor, not a data socket:
it becomes readable when the socket's event state *may* have changed. So the rule is:
check ``EVENTS`` first, and only when the wanted event is absent wait on the FD, then check again.
Receives are always non-blocking; this module never blocks the trio loop.
"""

from __future__ import annotations

import trio
import zmq


async def wait_for(sock: zmq.Socket, event: int) -> None:
    """Return once ``sock`` reports ``event`` (``zmq.POLLIN`` / ``zmq.POLLOUT``)."""
    while not (sock.getsockopt(zmq.EVENTS) & event):
        await trio.lowlevel.wait_readable(sock.getsockopt(zmq.FD))


async def recv_multipart(sock: zmq.Socket) -> list[bytes]:
    """Receive one whole multipart message, waiting (cancellably) until one is there."""
    while True:
        try:
            return sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            await wait_for(sock, zmq.POLLIN)


def try_recv_multipart(sock: zmq.Socket) -> list[bytes] | None:
    """One message if one is queued, else None. Never waits."""
    try:
        return sock.recv_multipart(zmq.NOBLOCK)
    except zmq.Again:
        return None


async def send_multipart(sock: zmq.Socket, frames: list[bytes]) -> None:
    """Send one multipart message, waiting (cancellably) while the socket cannot take it."""
    while True:
        try:
            sock.send_multipart(frames, zmq.NOBLOCK)
            return
        except zmq.Again:
            await wait_for(sock, zmq.POLLOUT)


def bound_endpoint(sock: zmq.Socket) -> str:
    """The concrete endpoint a socket bound to (resolves ``tcp://127.0.0.1:*``)."""
    return sock.getsockopt(zmq.LAST_ENDPOINT).decode()
