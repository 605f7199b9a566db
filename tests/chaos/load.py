"""Client load for chaos and soak runs: chat requests over raw HTTP, each classified.

Every request runs under its own deadline (``trio.fail_after``) and ends as exactly one
``Outcome.kind``:

* ``ok`` — 200 and a complete body: JSON with ``choices``, or an SSE stream ending in
  ``data: [DONE]`` and the terminating chunk;
* ``error`` — a clear error: an HTTP 4xx/5xx head whose body is JSON with an ``error`` object;
* ``cut`` — a 200 head, then the connection ended before the body was complete (the contract
  for a failure after the first byte: never a truncated body that looks complete);
* ``dropped`` — the client itself left (mid-stream or while waiting for the head), on purpose;
  a client that only half-closes after sending (``half_close``) is not leaving: it must get
  its whole answer;
* ``no_answer`` — the connection was refused or closed before any response head;
* ``bad`` — anything else (a 200 with a malformed body, an error without a JSON body, ...);
* ``hung`` — the deadline passed.

``Availability`` is the ground truth of which workers could serve a request throughout its
life (set by the chaos script); a request that got 502/503/504 while some worker stayed
available from its start to its end is *lost*.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field

import trio

from tests.front_http_client import RawClient, build_request
from tests.gateway_cluster import MODEL, SYSTEM_TEXT

TENANTS = 6  # distinct system prompts: requests of one tenant share a cached prefix
JSON_HEADERS = [(b"content-type", b"application/json")]


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: str
    status: int | None
    stream: bool
    worker: str | None = None
    detail: str = ""


class Availability:
    """Which workers can serve right now, and since when (epochs bump on every outage)."""

    def __init__(self, names: list[str]) -> None:
        self.down_count = {name: 0 for name in names}
        self.epoch = {name: 0 for name in names}

    def down(self, name: str) -> None:
        self.down_count[name] += 1
        self.epoch[name] += 1

    def up(self, name: str) -> None:
        assert self.down_count[name] > 0
        self.down_count[name] -= 1

    def is_down(self, name: str) -> bool:
        return self.down_count[name] > 0

    def down_now(self) -> int:
        return sum(1 for count in self.down_count.values() if count)

    def snapshot(self) -> dict[str, int]:
        return {name: self.epoch[name] for name, count in self.down_count.items() if not count}

    def stayed_up(self, snapshot: dict[str, int]) -> list[str]:
        return [name for name, epoch in snapshot.items()
                if not self.down_count[name] and self.epoch[name] == epoch]


@dataclass
class Tally:
    outcomes: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)
    bad: list[str] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    half_closed: Counter[str] = field(default_factory=Counter)  # their outcomes, by kind

    @property
    def sent(self) -> int:
        return sum(self.outcomes.values())

    def add(self, outcome: Outcome, elapsed_s: float, available: list[str] | None) -> None:
        self.outcomes[outcome.kind] += 1
        if outcome.status is not None:
            self.statuses[outcome.status] += 1
        if outcome.kind == "ok":
            self.latencies_s.append(elapsed_s)
        if outcome.kind in ("bad", "no_answer", "hung"):
            self.bad.append(f"{outcome.kind} {outcome.status} {outcome.detail}"[:300])
        if (outcome.kind == "error" and outcome.status in (502, 503, 504) and available):
            self.lost.append(f"{outcome.status} while {available} stayed up: "
                             f"{outcome.detail}"[:300])

    def figures(self) -> dict[str, object]:
        o = self.outcomes
        return {
            "sent": self.sent,
            "succeeded": o["ok"],
            "failed_with_clear_error": o["error"] + o["cut"],
            "errors_by_status": {str(k): v for k, v in sorted(self.statuses.items())
                                 if k != 200},
            "cut_after_head": o["cut"],
            "dropped_by_client": o["dropped"],
            "hung": o["hung"],
            "lost": len(self.lost),
            "no_answer": o["no_answer"],
            "bad": o["bad"],
        }


def chat_body(rng: random.Random, serial: int, *, stream: bool) -> bytes:
    tenant = rng.randrange(TENANTS)
    messages = [
        {"role": "system", "content": f"Tenant {tenant}. {SYSTEM_TEXT}"},
        {"role": "user",
         "content": f"Question {serial}: " + "tell me more " * rng.randrange(1, 12)},
    ]
    body: dict[str, object] = {"model": MODEL, "messages": messages,
                               "max_tokens": rng.randrange(2, 12)}
    if stream:
        body["stream"] = True
        if rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


async def one_request(port: int, body: bytes, *, stream: bool, deadline_s: float,
                      drop: str | None = None) -> Outcome:
    """Send one chat request and classify what came back (``drop``: ``"head"`` leaves while
    waiting for the head, ``"stream"`` after the first body chunk, ``"half_close"`` only
    shuts its sending side after the request and reads the answer)."""
    try:
        with trio.fail_after(deadline_s):
            try:
                client = await RawClient.connect(port)
            except OSError as error:
                return Outcome("no_answer", None, stream, detail=f"connect: {error}")
            try:
                return await _exchange(client, body, stream, drop)
            finally:
                await client.aclose()
    except trio.TooSlowError:
        return Outcome("hung", None, stream, detail=f"no end after {deadline_s} s")


async def _exchange(client: RawClient, body: bytes, stream: bool, drop: str | None) -> Outcome:
    try:
        await client.send(build_request(b"POST", b"/v1/chat/completions", body, JSON_HEADERS))
    except (trio.BrokenResourceError, OSError) as error:
        return Outcome("no_answer", None, stream, detail=f"send: {error!r}")
    if drop == "head":
        return Outcome("dropped", None, stream)
    if drop == "half_close":
        await client.half_close()
    try:
        status, headers, _ = await client.read_head()
    except (EOFError, OSError, trio.BrokenResourceError) as error:
        return Outcome("no_answer", None, stream, detail=f"head: {error!r}")
    head = dict(headers)
    worker = head.get(b"x-cortex-assigned-worker", b"").decode() or None
    chunked = head.get(b"transfer-encoding") == b"chunked"
    try:
        if chunked:
            parts = []
            while chunk := await client.read_chunk():
                parts.append(chunk)
                if drop == "stream" and status == 200:
                    return Outcome("dropped", status, stream, worker)
            data = b"".join(parts)
        elif b"content-length" in head:
            data = await client.read_exactly(int(head[b"content-length"]))
        else:
            data = await client.read_until_eof()
    except (EOFError, ValueError, AssertionError, OSError, trio.BrokenResourceError) as error:
        # AssertionError: RawClient.read_chunk found no CRLF after a chunk (garbage framing).
        if status == 200:
            return Outcome("cut", status, stream, worker, repr(error))
        return Outcome("bad", status, stream, worker, f"error body cut: {error!r}")
    if status != 200:
        try:
            error_object = json.loads(data)["error"]
            clear = isinstance(error_object, dict) and "message" in error_object
        except (ValueError, KeyError, TypeError):
            clear = False
        kind = "error" if clear and 400 <= status <= 599 else "bad"
        return Outcome(kind, status, stream, worker, data[:200].decode(errors="replace"))
    if stream:
        ok = data.endswith(b"data: [DONE]\n\n") and data.startswith(b"data: ")
    else:
        try:
            ok = bool(json.loads(data)["choices"])
        except (ValueError, KeyError, TypeError):
            ok = False
    if ok:
        return Outcome("ok", status, stream, worker)
    return Outcome("bad", status, stream, worker, f"malformed 200 body {data[:200]!r}")


async def client_loop(port: int, rng: random.Random, tally: Tally, stop: trio.Event,
                      availability: Availability | None, *, deadline_s: float,
                      stream_share: float = 0.5, drop_share: float = 0.0,
                      half_close_share: float = 0.0, serials: list[int] | None = None) -> None:
    """Requests back to back until ``stop`` is set; every outcome goes into ``tally``."""
    serials = serials if serials is not None else [0]
    while not stop.is_set():
        serials[0] += 1
        stream = rng.random() < stream_share
        drop = None
        if rng.random() < drop_share:
            drop = "stream" if stream and rng.random() < 0.8 else "head"
        elif rng.random() < half_close_share:
            drop = "half_close"
        body = chat_body(rng, serials[0], stream=stream)
        snapshot = availability.snapshot() if availability is not None else None
        began = trio.current_time()
        outcome = await one_request(port, body, stream=stream, deadline_s=deadline_s, drop=drop)
        available = (availability.stayed_up(snapshot)
                     if availability is not None and snapshot is not None else None)
        tally.add(outcome, trio.current_time() - began, available)
        if drop == "half_close":
            tally.half_closed[outcome.kind] += 1
