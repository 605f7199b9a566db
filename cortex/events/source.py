"""Where KV events come from: one ``EventSource`` per (worker, DP rank), and ingestion settings.

Pure data and endpoint arithmetic, no I/O. Wire facts (kv-events.md §1): every DP rank has its
own publisher, sequence counter and replay buffer; the engine binds and Cortex connects; a rank's
endpoint is the base endpoint offset by the rank (tcp: ``port + rank``; inproc: suffix
``_dp<rank>``; rank 0 unchanged), for the PUB and the replay ROUTER alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from cortex.errors import ConfigError
from cortex.host_literal import host_port
from cortex.ledger.kv_events import EngineFamily

_WILDCARD_HOSTS = frozenset({"*", "0.0.0.0", "::", "[::]", ""})


@dataclass(frozen=True, slots=True)
class EventSource:
    """One publisher: a worker's DP rank. Endpoints are already rank-offset."""

    worker: str
    rank: int
    family: EngineFamily
    model: str
    endpoint: str
    replay_endpoint: str | None = None
    topic: bytes = b""  # SUB prefix filter; b"" = everything


@dataclass(frozen=True, slots=True)
class IngestSettings:
    # Live messages processed per turn before yielding to the event loop.
    max_messages_per_turn: int = 256
    # Deadline of one replay request, from sending it to the last reply read.
    replay_timeout_s: float = 3.0
    # Cap on the batches read by a history replay (engines buffer 10 000 by default).
    replay_max_items: int = 100_000
    # SUB receive high-water mark (ZeroMQ's default of 1000 drops bursts; engines use 100 000).
    rcvhwm: int = 200_000
    # Recently accepted batches remembered per publisher to tell duplicates from restarts.
    dedupe_window: int = 4096
    # Wait before asking again for a history replay that got no reply; doubles up to 60 s.
    history_retry_s: float = 2.0

    def __post_init__(self) -> None:
        problems = []
        if self.max_messages_per_turn < 1:
            problems.append("max_messages_per_turn must be >= 1")
        if not self.replay_timeout_s > 0:
            problems.append("replay_timeout_s must be > 0")
        if self.replay_max_items < 1:
            problems.append("replay_max_items must be >= 1")
        if self.rcvhwm < 0:
            problems.append("rcvhwm must be >= 0 (0 = unlimited)")
        if self.dedupe_window < 1:
            problems.append("dedupe_window must be >= 1")
        if not self.history_retry_s > 0:
            problems.append("history_retry_s must be > 0")
        if problems:
            raise ConfigError(problems)


def rank_endpoint(endpoint: str, rank: int) -> str:
    """The endpoint of DP rank ``rank`` given the rank-0 endpoint (kv-events.md §1.2)."""
    if rank < 0:
        raise ConfigError([f"DP rank must be >= 0, got {rank}"])
    if rank == 0:
        return endpoint
    if endpoint.startswith("inproc://"):
        return f"{endpoint}_dp{rank}"
    if endpoint.startswith("tcp://"):
        head, sep, port = endpoint.rpartition(":")
        if sep and port.isdigit() and head != "tcp":
            shifted = int(port) + rank
            if shifted > 65535:
                raise ConfigError([f"{endpoint}: rank {rank} gives port {shifted} > 65535"])
            return f"{head}:{shifted}"
    raise ConfigError([f"cannot offset endpoint {endpoint!r} by DP rank {rank}"])


def tcp_endpoint(host: str, port: int) -> str:
    """``tcp://host:port``; IPv6 literals get brackets."""
    return f"tcp://{host_port(host, port)}"


def worker_sources(
    worker: str,
    *,
    host: str,
    port: int,
    dp_size: int,
    family: EngineFamily,
    model: str,
    replay_port: int | None = None,
    topic: bytes = b"",
) -> list[EventSource]:
    """The sources of one worker: rank r publishes on ``port + r`` and replays on
    ``replay_port + r``. Every configuration problem is reported at once (``ConfigError``)."""
    problems = []
    if host in _WILDCARD_HOSTS:
        problems.append(f"{worker}: event host {host!r} is a bind wildcard; give the worker's host")
    if dp_size < 1:
        problems.append(f"{worker}: dp_size must be >= 1, got {dp_size}")
    span = max(dp_size, 1)
    if not 1 <= port <= 65536 - span:
        problems.append(f"{worker}: event ports {port}..{port + span - 1} out of range")
    if replay_port is not None:
        if not 1 <= replay_port <= 65536 - span:
            problems.append(
                f"{worker}: replay ports {replay_port}..{replay_port + span - 1} out of range"
            )
        if replay_port < port + span and port < replay_port + span:
            problems.append(
                f"{worker}: replay ports {replay_port}..{replay_port + span - 1} overlap event "
                f"ports {port}..{port + span - 1} (choose replay base >= base + dp_size)"
            )
    if problems:
        raise ConfigError(problems)
    return [
        EventSource(
            worker=worker,
            rank=rank,
            family=family,
            model=model,
            endpoint=tcp_endpoint(host, port + rank),
            replay_endpoint=None if replay_port is None else tcp_endpoint(host, replay_port + rank),
            topic=topic,
        )
        for rank in range(dp_size)
    ]
