"""Per-worker keep-alive pool of upstream connections, and one request/response exchange on it.

``ConnectionPool.request(origin, ...)`` is an async context manager: entering it takes a
connection (an idle one, else a new one, else waits), sends the request and returns once the
response head arrived; the body is then read through the ``UpstreamResponse``.

Rules and invariants (per origin):

* ``open`` counts every connection of the origin: idle + busy + being opened. It never exceeds
  ``limits.max_connections_per_worker``. At the cap a request waits, first come first served,
  for a connection or a freed slot handed over directly by the one releasing it; after
  ``acquire_timeout_s`` it fails with ``UpstreamTimeout`` (phase ``acquire``).
* Idle connections are reused most-recent first; one that turned readable while idle (the
  worker closed it) is dropped before use. At most ``max_idle_per_worker`` stay idle (the
  oldest goes first); ``run()`` closes those idle longer than ``idle_timeout_s``.
* A connection goes back to the pool only after a complete exchange: request sent, the whole
  response received (read by the caller, or already buffered when the caller exits), both
  sides ``DONE`` and keep-alive allowed. An error, a timeout, an early exit or a cancellation
  closes it at once — the worker sees EOF, which is how an engine learns its client left.
* The keep-alive race: if an exchange on a REUSED connection fails with ``UpstreamBroken``
  before any response byte, it is retried once on a fresh connection. A fresh connection's
  failure, a timeout, or a failure after a response byte is never retried here.
* Failures are the leaves of ``cortex.upstream.errors`` (with phase and whether a response
  byte arrived); a head that is not valid HTTP (e.g. a header value with a newline) is
  ``BadRequest`` before anything is sent; cancellation passes through untouched.
* Head and body timeouts are enforced by one ``WaitDeadlines`` task that ``run()`` starts
  (no cancel scope per socket wait); while it is not running, each wait has its own scope.
* ``close_origin`` closes the idle connections of a worker and retires its busy ones: they are
  closed when their exchange ends instead of returning to the pool.
* After ``run()`` is cancelled the pool is closed: idle connections are closed and any
  connection returned later is closed too (requests still work, unpooled).

All bookkeeping is synchronous on the trio thread; no locks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

import trio

from cortex.upstream.connection import UpstreamConnection, open_connection
from cortex.upstream.errors import UpstreamBroken, UpstreamTimeout
from cortex.upstream.limits import PoolLimits
from cortex.upstream.request_head import Headers, Origin, parse_origin, upstream_headers
from cortex.upstream.response import UpstreamResponse
from cortex.wait_deadlines import WaitDeadlines

__all__ = ["ConnectionPool", "PoolStats", "UpstreamResponse"]


@dataclass(frozen=True, slots=True)
class PoolStats:
    open: int  # idle + busy (busy includes connections being opened)
    idle: int
    busy: int
    created: int  # connections opened so far
    reused: int  # exchanges that ran on a connection used before
    discarded: int  # connections closed by the pool (broken, incomplete, reaped, over cap)


class _Waiter:
    __slots__ = ("conn", "event", "slot")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.conn: UpstreamConnection | None = None  # an idle connection handed over
        self.slot = False  # or the right to open a new one


class _OriginPool:
    __slots__ = (
        "address",
        "created",
        "discarded",
        "generation",
        "idle",
        "open",
        "origin",
        "reused",
        "waiters",
    )

    def __init__(self, origin: str, address: Origin) -> None:
        self.origin = origin
        self.address = address
        self.idle: deque[UpstreamConnection] = deque()  # left = oldest, right = newest
        self.open = 0
        self.waiters: deque[_Waiter] = deque()
        self.generation = 0
        self.created = 0
        self.reused = 0
        self.discarded = 0


class ConnectionPool:
    """Keep-alive connections to every worker origin; one instance per Cortex process."""

    def __init__(self, limits: PoolLimits = PoolLimits(), *,
                 clock: Callable[[], float] | None = None) -> None:
        self.limits = limits
        self._origins: dict[str, _OriginPool] = {}
        self._closed = False
        self._idle_appeared: trio.Event | None = None
        self._deadlines = WaitDeadlines()
        self._clock = clock  # None: trio's clock (``WaitDeadlines.now``)

    # -- public API ------------------------------------------------------------------------

    def request(self, origin: str, method: bytes, target: bytes, headers: Headers,
                body: bytes = b"", *, head_timeout_s: float | None = None) -> _Exchange:
        """``async with pool.request(...) as response:`` — see the module rules."""
        return _Exchange(self, origin, method, target, headers, body,
                         self.limits.head_timeout_s if head_timeout_s is None
                         else head_timeout_s)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Reap idle connections and keep the wait deadlines until cancelled; then close the
        pool."""
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self._deadlines.run)
                task_status.started()
                while True:
                    now = (self._clock or self._deadlines.now)()
                    due = self.reap_idle(now)
                    if due is None:
                        self._idle_appeared = trio.Event()
                        await self._idle_appeared.wait()
                    else:
                        await trio.sleep(max(due - now, 0.0))
        finally:
            self._close_all()

    def reap_idle(self, now: float) -> float | None:
        """Close connections idle since before ``now - idle_timeout_s``; next expiry or None."""
        timeout = self.limits.idle_timeout_s
        due: float | None = None
        for pool in self._origins.values():
            idle = pool.idle
            while idle and idle[0].idle_since + timeout <= now:
                self._discard(pool, idle.popleft())
            if idle:
                expiry = idle[0].idle_since + timeout
                due = expiry if due is None else min(due, expiry)
        return due

    async def close_origin(self, origin: str) -> None:
        """Close the idle connections of ``origin``; its busy ones close when they finish."""
        pool = self._origins.get(origin)
        if pool is not None:
            pool.generation += 1
            while pool.idle:
                self._discard(pool, pool.idle.popleft())
        await trio.lowlevel.checkpoint()

    def stats(self, origin: str) -> PoolStats:
        pool = self._origins.get(origin)
        if pool is None:
            return PoolStats(0, 0, 0, 0, 0, 0)
        idle = len(pool.idle)
        return PoolStats(pool.open, idle, pool.open - idle, pool.created, pool.reused,
                         pool.discarded)

    # -- connection bookkeeping (synchronous) ----------------------------------------------

    def _pool_for(self, origin: str) -> _OriginPool:
        pool = self._origins.get(origin)
        if pool is None:
            pool = self._origins[origin] = _OriginPool(origin, parse_origin(origin))
        return pool

    async def _acquire(self, pool: _OriginPool, fresh: bool) -> UpstreamConnection:
        """An idle connection (unless ``fresh``), else a new one within the cap, else wait.

        The caller owns the result at once: no checkpoint may lie between taking a connection
        and the caller's ``try`` that discards it on any exception.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        if pool.idle and not fresh:
            conn = pool.idle.pop()
            if not conn.looks_closed():
                pool.reused += 1
                return conn  # no checkpoint here: the caller's send is the next one
            conn.close()  # the worker closed it while idle: take over its slot
            pool.discarded += 1
            return await self._connect(pool)
        # (a fresh connection is only wanted right after discarding one, which freed a slot
        # or handed it to a waiter — and while anyone waits, nothing is idle)
        if pool.open < self.limits.max_connections_per_worker and not pool.waiters:
            pool.open += 1
            return await self._connect(pool)
        return await self._wait(pool, fresh)

    async def _wait(self, pool: _OriginPool, fresh: bool) -> UpstreamConnection:
        waiter = _Waiter()
        pool.waiters.append(waiter)
        try:
            with trio.move_on_after(self.limits.acquire_timeout_s):
                await waiter.event.wait()
        except BaseException:  # cancelled from outside: give back whatever was handed over
            self._abandon(pool, waiter)
            raise
        conn = waiter.conn
        if conn is not None:
            if not fresh:
                pool.reused += 1
                return conn
            conn.close()
            pool.discarded += 1
            return await self._connect(pool)
        if waiter.slot:
            return await self._connect(pool)
        pool.waiters.remove(waiter)
        raise UpstreamTimeout(
            f"no connection within {self.limits.acquire_timeout_s:g} s "
            f"({pool.open} open, limit {self.limits.max_connections_per_worker})",
            origin=pool.origin, phase="acquire")

    def _abandon(self, pool: _OriginPool, waiter: _Waiter) -> None:
        if waiter.conn is not None:
            self._check_in(pool, waiter.conn)
        elif waiter.slot:
            self._release_slot(pool)
        else:
            pool.waiters.remove(waiter)

    async def _connect(self, pool: _OriginPool) -> UpstreamConnection:
        """Open a connection in a slot already counted in ``pool.open``."""
        address = pool.address
        try:
            conn = await open_connection(pool.origin, address.host, address.port,
                                         self.limits.connect_timeout_s, pool.generation,
                                         self._deadlines)
        except BaseException:
            self._release_slot(pool)
            raise
        pool.created += 1
        return conn

    def _check_in(self, pool: _OriginPool, conn: UpstreamConnection) -> None:
        """A connection after a complete exchange: to a waiter, to the idle set, or closed."""
        if self._closed or conn.generation != pool.generation:
            self._discard(pool, conn)
            return
        if pool.waiters:
            waiter = pool.waiters.popleft()
            waiter.conn = conn
            waiter.event.set()
            return
        if len(pool.idle) >= self.limits.max_idle_per_worker:
            self._discard(pool, pool.idle.popleft())
        conn.idle_since = (self._clock or self._deadlines.now)()
        pool.idle.append(conn)
        if self._idle_appeared is not None:
            self._idle_appeared.set()
            self._idle_appeared = None

    def _discard(self, pool: _OriginPool, conn: UpstreamConnection) -> None:
        conn.close()
        pool.discarded += 1
        self._release_slot(pool)

    def _release_slot(self, pool: _OriginPool) -> None:
        if pool.waiters:
            waiter = pool.waiters.popleft()
            waiter.slot = True
            waiter.event.set()
        else:
            pool.open -= 1

    def _close_all(self) -> None:
        self._closed = True
        for pool in self._origins.values():
            while pool.idle:
                self._discard(pool, pool.idle.popleft())


class _Exchange:
    """``async with``: one request on a pooled connection; see ``ConnectionPool.request``."""

    __slots__ = (
        "_body",
        "_conn",
        "_head_timeout_s",
        "_headers",
        "_method",
        "_origin",
        "_origin_pool",
        "_pool",
        "_response",
        "_target",
    )

    def __init__(self, pool: ConnectionPool, origin: str, method: bytes, target: bytes,
                 headers: Headers, body: bytes, head_timeout_s: float) -> None:
        self._pool = pool
        self._origin = origin
        self._method = method
        self._target = target
        self._headers = headers
        self._body = body
        self._head_timeout_s = head_timeout_s
        self._origin_pool: _OriginPool | None = None
        self._conn: UpstreamConnection | None = None
        self._response: UpstreamResponse | None = None

    async def __aenter__(self) -> UpstreamResponse:
        if self._conn is not None:
            raise RuntimeError("an upstream exchange can be entered once")
        pool = self._pool
        origin_pool = self._origin_pool = pool._pool_for(self._origin)
        headers = upstream_headers(origin_pool.address, self._method, self._headers,
                                   len(self._body))
        fresh = False
        while True:
            conn = await pool._acquire(origin_pool, fresh)
            try:
                await conn.send_request(self._method, self._target, headers, self._body)
                head = await conn.receive_head(self._head_timeout_s)
            except UpstreamBroken as exc:
                pool._discard(origin_pool, conn)
                if conn.exchanges > 0 and not exc.response_started and not fresh:
                    fresh = True  # the keep-alive race: the worker closed it while idle
                    continue
                raise
            except BaseException:
                pool._discard(origin_pool, conn)
                raise
            break
        self._conn = conn
        self._response = UpstreamResponse(conn, head.status_code, list(head.headers),
                                          head.http_version, head.reason,
                                          pool.limits.read_timeout_s)
        return self._response

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        conn, origin_pool, response = self._conn, self._origin_pool, self._response
        if conn is None or origin_pool is None or response is None:
            return
        self._conn = None
        # A body the caller did not read may already be fully received (a small JSON, a
        # bodiless 204): then the exchange is complete without any further I/O.
        if (response.complete or conn.drain_buffered()) and conn.finish_exchange():
            self._pool._check_in(origin_pool, conn)
        else:
            self._pool._discard(origin_pool, conn)

