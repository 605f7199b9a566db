"""Cortex's own pending work per worker, counted from the moment of decision.

Rules:

* ``hold(worker, prefill_tokens)`` is a context manager: entering adds one request in flight
  and its uncached prefill tokens to the worker; leaving removes exactly what was added, however
  the block ends (return, exception, cancellation — trio's ``Cancelled`` is a
  ``BaseException`` and is never caught, only passed through). A hold that was never entered
  adds nothing, so nothing can leak.
* A hold may carry its request's prompt blocks (``prefix=(target, keys, start)``: ``start``
  of them the ledger already credits): entering records them in ``prefixes``
  (``inflight_prefixes.InflightPrefixes``), leaving forgets them — the blocks a later request
  can count on while this one is in flight on that target (routing). ``prefill_done()`` also
  records them in ``certain``: what a later request's *prediction* may count on. Before its
  first token a request's blocks are likely, not certain: it may not have reached the engine
  yet (two requests decided microseconds apart can arrive in the other order over their own
  connections), its attempt may fail, and SGLang shares nothing within a prefill batch.
* ``Hold.prefill_done()`` drops the request's queued prefill tokens once its first byte came
  back (prefill is over), keeping it in flight; calling it twice, or after exit, does nothing.
* Counts never go below zero; a worker whose counts return to zero is forgotten.
* ``view(base)`` returns the worker's frozen view with these counts in it: the scheduler's cost
  sees every earlier decision at once, before any KV event or metric reports it. This is the
  herding guard for bursts.
* ``announce``: when set, ``announce(event, hold)`` hears every hold made by ``hold(...)``
  (not those made with ``announce=False``: other replicas' requests, ``peer_inflight``) as it
  is entered (``"routed"``), as its prefill ends (``"prefill_done"``, once) and as it is left
  (``"finished"``); each such hold has a ``number`` unique in this process, from 1. Replica
  sync tells the other replicas from it.
* ``on_release(callback)``: ``callback(worker)`` runs after pending work left a worker
  (a request ended, or its prefill finished) — capacity may have opened (admission waits on it).
* Tracked workers (``track(base)``: health, ledger state and engine figures changed) have their
  current view kept up to date incrementally: a count change marks only that worker's view
  stale, and ``views()`` rebuilds the stale ones when it is next asked (one rebuild per request
  for the three count changes of a hold, not three); while nothing changed it returns the same
  tuple object. Order is the order of first ``track``.
* ``healthy_roles``: the roles of the tracked workers that are healthy (a frozenset attribute),
  and ``prefill_and_decode``: whether they include both PD roles (a bool, read per request: an
  enum's hash is a Python call), kept with ``track`` and ``untrack`` (counts do not change
  them).

Single owner (the trio thread), no locks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Self

import msgspec

from cortex.scheduling.inflight_prefixes import InflightPrefixes
from cortex.scheduling.view import Role, WorkerView


class PendingWork:
    def __init__(self) -> None:
        self._in_flight: dict[str, int] = {}
        self._queued_tokens: dict[str, int] = {}
        self._bases: dict[str, WorkerView] = {}
        self._current: dict[str, WorkerView] = {}
        self._views: tuple[WorkerView, ...] | None = ()
        self._stale: set[str] = set()  # tracked workers whose counts changed since their view
        self.healthy_roles: frozenset[Role] = frozenset()
        self.prefill_and_decode = False
        self._release_listeners: list[Callable[[str], None]] = []
        self.announce: Callable[[str, Hold], None] | None = None
        self._numbers = 0
        self.prefixes = InflightPrefixes()
        self.certain = InflightPrefixes()

    def on_release(self, callback: Callable[[str], None]) -> None:
        self._release_listeners.append(callback)

    def track(self, base: WorkerView) -> None:
        """Start or update tracking a worker; its own counts in ``base`` are ignored."""
        self._bases[base.worker] = base
        self._stale.discard(base.worker)
        self._refresh(base.worker)
        self._roles_changed()

    def untrack(self, worker: str) -> None:
        self._bases.pop(worker, None)
        self._stale.discard(worker)
        if self._current.pop(worker, None) is not None:
            self._views = None
        self._roles_changed()

    def views(self) -> tuple[WorkerView, ...]:
        """Current views of every tracked worker, pending counts included."""
        if self._views is None:
            stale = self._stale
            while stale:
                self._refresh(stale.pop())
            self._views = tuple(self._current.values())
        return self._views

    def _roles_changed(self) -> None:
        roles = frozenset(base.role for base in self._bases.values() if base.healthy)
        self.healthy_roles = roles
        self.prefill_and_decode = Role.PREFILL in roles and Role.DECODE in roles

    def _refresh(self, worker: str) -> None:
        base = self._bases.get(worker)
        if base is None:
            return
        self._current[worker] = WorkerView(
            base.worker, base.targets, base.healthy, base.ledger_state, base.role,
            self._in_flight.get(worker, 0), self._queued_tokens.get(worker, 0),
            base.engine_queue, base.kv_usage, base.prefill_tokens_per_s, base.kv_tokens)
        self._views = None

    def _counts_changed(self, worker: str) -> None:
        if worker in self._bases:
            self._stale.add(worker)
            self._views = None

    def in_flight(self, worker: str) -> int:
        return self._in_flight.get(worker, 0)

    def queued_prefill_tokens(self, worker: str) -> int:
        return self._queued_tokens.get(worker, 0)

    def total_in_flight(self) -> int:
        return sum(self._in_flight.values())

    def hold(self, worker: str, prefill_tokens: int,
             prefix: tuple[int, Sequence[int], int] | None = None, *,
             announce: bool = True) -> Hold:
        if prefill_tokens < 0:
            raise ValueError("prefill_tokens must be >= 0")
        number = 0
        if announce:
            self._numbers += 1
            number = self._numbers
        return Hold(self, worker, prefill_tokens, prefix, number)

    def view(self, base: WorkerView) -> WorkerView:
        return msgspec.structs.replace(
            base,
            in_flight=self._in_flight.get(base.worker, 0),
            queued_prefill_tokens=self._queued_tokens.get(base.worker, 0),
        )

    def _add(self, worker: str, requests: int, tokens: int) -> None:
        self._in_flight[worker] = self._in_flight.get(worker, 0) + requests
        self._queued_tokens[worker] = self._queued_tokens.get(worker, 0) + tokens
        self._counts_changed(worker)

    def _remove(self, worker: str, requests: int, tokens: int) -> None:
        left = self._in_flight.get(worker, 0) - requests
        if left > 0:
            self._in_flight[worker] = left
        else:
            self._in_flight.pop(worker, None)
        left = self._queued_tokens.get(worker, 0) - tokens
        if left > 0:
            self._queued_tokens[worker] = left
        else:
            self._queued_tokens.pop(worker, None)
        self._counts_changed(worker)
        for listener in self._release_listeners:
            listener(worker)


class Hold:
    """One request's share of a worker's pending work (see ``PendingWork.hold``)."""

    __slots__ = ("_certain", "_entered", "_pending", "_prefix", "_requests", "_ticket",
                 "_tokens", "number", "prefill_tokens", "worker")

    def __init__(self, pending: PendingWork, worker: str, prefill_tokens: int,
                 prefix: tuple[int, Sequence[int], int] | None = None, number: int = 0) -> None:
        self._pending = pending
        self.worker = worker
        self.number = number  # 0: not announced (``PendingWork.announce``)
        self.prefill_tokens = prefill_tokens  # as routed (what replica sync tells)
        self._tokens = prefill_tokens
        self._prefix = prefix if prefix is not None and len(prefix[1]) > prefix[2] else None
        self._ticket = 0  # its prompt blocks' entry in ``pending.prefixes`` (0: none)
        self._certain = 0  # their entry in ``pending.certain`` (0: none)
        self._requests = 0  # what this hold has added and not yet removed
        self._entered = False

    def __enter__(self) -> Self:
        return self.open()

    def open(self) -> Self:
        """Count the request (what ``with hold:`` does on entry; for a hold whose end is not
        in one block: a peer's request, ``close`` when it ends)."""
        if self._entered:
            raise RuntimeError("a hold can be entered only once")
        self._entered = True
        self._pending._add(self.worker, 1, self._tokens)
        self._requests = 1
        if self._prefix is not None:
            self._ticket = self._pending.prefixes.add(*self._prefix)
        self._tell("routed")
        return self

    @property
    def prefix(self) -> tuple[int, Sequence[int], int] | None:
        """``(target, keys, start)``: the prompt blocks this request leaves on its target."""
        return self._prefix

    def _tell(self, event: str) -> None:
        announce = self._pending.announce
        if self.number and announce is not None:
            announce(event, self)

    def prefill_done(self) -> None:
        if self._requests and self._prefix is not None and not self._certain:
            self._certain = self._pending.certain.add(*self._prefix)
        if self._requests and self._tokens:
            self._pending._remove(self.worker, 0, self._tokens)
            self._tokens = 0
            self._tell("prefill_done")

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """The request ended: everything it added is removed (twice: nothing more)."""
        if self._ticket:
            self._pending.prefixes.remove(self._ticket)
            self._ticket = 0
        if self._certain:
            self._pending.certain.remove(self._certain)
            self._certain = 0
        if self._requests:
            self._pending._remove(self.worker, self._requests, self._tokens)
            self._requests = 0
            self._tokens = 0
            self._tell("finished")
