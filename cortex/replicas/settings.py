"""``[replicas]``: the other Cortex replicas of the cluster and how this one talks to them.

Empty ``listen`` and ``peers`` (the default): this replica tells nobody and hears nobody — it
counts only its own requests in flight, as a replica alone does. ``peers`` without ``listen``:
it hears the others and tells nothing (an observer, a canary).
"""

from __future__ import annotations

from dataclasses import dataclass

from cortex.errors import ConfigError


@dataclass(frozen=True, slots=True)
class ReplicaSettings:
    # ZeroMQ endpoint this replica publishes its requests on, e.g. "tcp://0.0.0.0:5610"
    listen: str = ""
    # the other replicas' publishing endpoints, comma-separated ("tcp://10.0.0.2:5610,...")
    peers: str = ""
    heartbeat_s: float = 1.0  # a heartbeat (the requests still in flight) this often
    peer_timeout_s: float = 5.0  # a peer not heard from this long leaves the view
    entry_ttl_s: float = 600.0  # a peer's request is forgotten after this long, whatever it says
    sndhwm: int = 100_000  # messages queued per peer connection before new ones are dropped
    # the processes of server.processes tell each other their requests in flight over IPC
    # (false: each counts only its own, as separate replicas without sync do)
    between_processes: bool = True

    def __post_init__(self) -> None:
        problems = []
        for endpoint in self.peer_endpoints():
            if "://" not in endpoint:
                problems.append(f"peer {endpoint!r} is not a ZeroMQ endpoint (tcp://host:port)")
        if self.listen and "://" not in self.listen:
            problems.append(f"listen {self.listen!r} is not a ZeroMQ endpoint (tcp://host:port)")
        if not self.heartbeat_s > 0:
            problems.append("heartbeat_s must be > 0")
        if not self.peer_timeout_s > self.heartbeat_s:
            problems.append("peer_timeout_s must be > heartbeat_s")
        if not self.entry_ttl_s > 0:
            problems.append("entry_ttl_s must be > 0")
        if self.sndhwm < 0:
            problems.append("sndhwm must be >= 0 (0 = unlimited)")
        if problems:
            raise ConfigError(problems)

    @property
    def enabled(self) -> bool:
        return bool(self.listen or self.peers)

    def peer_endpoints(self) -> list[str]:
        return [part.strip() for part in self.peers.split(",") if part.strip()]
