"""Prompt blocks on their way into a worker's cache: routed there, not yet in the ledger.

A request's prompt blocks enter an engine's cache when its prefill steps run, and the ledger
hears of them only when the engine publishes those steps' events. Until then a second request
with the same prefix, decided in that window (a burst, a herd, an agent's fan-out, a session's
next turn sent before its last answer ended), would be told nothing is cached anywhere: it is
spread away from the worker that is computing its prefix, and its prediction is short by the
whole prefix. A continuous-batching engine serves that second request from the first one's
blocks as soon as they are scheduled (vLLM caches a block when the step that computes it is
scheduled; SGLang once the chunk that computes it has run), and it keeps a running request's
blocks until it ends — they cannot be evicted while a request in flight uses them.

Rules:

* ``add(target, keys, start)`` records the block keys ``keys[start:]`` of one request routed
  to ``target`` (a ledger target: worker and DP rank) and returns a ticket — ``start`` is what
  the ledger already credited the target with when the request was routed: those blocks are
  the ledger's to report, and a running request's blocks cannot be evicted, so only the new
  ones need recording (a warm turn records a few keys, not its whole context).
  ``remove(ticket)`` forgets exactly what that ``add`` recorded (a second ``remove`` of the
  same ticket does nothing). The owner removes a request's entry when the request ends,
  whatever its end; by then the ledger holds what the engine kept.
* ``extend(keys, matched)`` raises ``matched`` (target → leading blocks of ``keys``, from the
  ledger) in place: from each target's ledger depth on, the keys some request in flight there
  carries; it returns the targets it raised with their depths before (so no copy of
  ``matched`` is needed to tell the credit from the ledger). Keys are prefix-chained (a key
  names its whole prefix), so those are exactly the blocks the engine will hold for this
  request once the requests ahead of it are scheduled.
  Cost: one lookup per target with requests in flight when nothing extends, one per block
  gained otherwise.
* Reference counts per (key, target): two requests carrying the same block on one target
  leave it credited until both have ended.

Pure and single-owner (the trio thread); no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType


class InflightPrefixes:
    __slots__ = ("_index", "_next", "_targets", "_tickets")

    def __init__(self) -> None:
        self._index: dict[int, dict[int, int]] = {}  # key -> target -> requests carrying it
        self._tickets: dict[int, tuple[int, Sequence[int]]] = {}
        self._targets: dict[int, int] = {}  # target -> its tickets
        self._next = 0

    def __len__(self) -> int:
        """Requests recorded."""
        return len(self._tickets)

    def add(self, target: int, keys: Sequence[int], start: int = 0) -> int:
        keys = keys[start:]
        index = self._index
        for key in keys:
            holders = index.get(key)
            if holders is None:
                index[key] = {target: 1}
            else:
                holders[target] = holders.get(target, 0) + 1
        self._next += 1
        self._tickets[self._next] = (target, keys)
        self._targets[target] = self._targets.get(target, 0) + 1
        return self._next

    def remove(self, ticket: int) -> None:
        entry = self._tickets.pop(ticket, None)
        if entry is None:
            return
        target, keys = entry
        left = self._targets[target] - 1
        if left:
            self._targets[target] = left
        else:
            del self._targets[target]
        index = self._index
        for key in keys:
            holders = index[key]
            left = holders[target] - 1
            if left:
                holders[target] = left
            else:
                del holders[target]
                if not holders:
                    del index[key]

    def extend(self, keys: Sequence[int], matched: dict[int, int]) -> Mapping[int, int]:
        """Raise ``matched[target]`` to the leading ``keys`` in flight on each target; returns
        the targets raised, each with its depth before (an empty mapping when none was)."""
        index = self._index
        count = len(keys)
        raised: dict[int, int] | None = None
        for target in self._targets:
            depth = start = matched.get(target, 0)
            while depth < count:
                holders = index.get(keys[depth])
                if holders is None or target not in holders:
                    break
                depth += 1
            if depth > start:
                matched[target] = depth
                if raised is None:
                    raised = {}
                raised[target] = start
        return _NONE_RAISED if raised is None else raised


_NONE_RAISED: Mapping[int, int] = MappingProxyType({})

