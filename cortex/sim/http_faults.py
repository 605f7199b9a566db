"""Fault switches of a simulated engine's HTTP side, changed at runtime (``engine.faults.update``
or ``POST /sim/faults``), and the error a streamed answer breaks with.

``cortex.sim.http_engine`` reads the switches at the start of every generation request (its
docstring gives the order); ``SimEngine`` (``cortex.sim.engine``) owns them.

Rules:

* ``update`` checks every change before applying any: one bad value refuses them all
  (``BadRequest`` listing every problem), so the switches are never half-changed.
* ``EngineCrashed`` (the ``die_after_chunks`` fault) is a 502: the engine dropped a streamed
  response mid-way.
* ``poison_marker`` is matched against the request's raw body bytes (its UTF-8 encoding): an
  ASCII marker is found however the client escapes JSON strings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

from cortex.errors import BadRequest, CortexError

__all__ = ["EngineCrashed", "SimFaults"]


class EngineCrashed(CortexError):
    """The ``die_after_chunks`` fault: the engine drops a streamed response mid-way."""

    http_status = 502


@dataclass(slots=True)
class SimFaults:
    """Fault switches of the HTTP side (generation routes unless noted)."""

    slow_s: float = 0.0  # extra delay before the response head
    fail_status: int | None = None  # answer every generation request with this status
    hang: bool = False  # never answer a generation request
    die_after_chunks: int | None = None  # streaming: break the connection after N events
    unhealthy: bool = False  # /health answers 503
    # answer 500 (the engine's internal-error body) to every generation request whose raw body
    # contains this string: a "poison" request that fails wherever it is sent
    poison_marker: str | None = None

    def update(self, changes: Mapping[str, object]) -> None:
        """Apply ``changes`` (JSON-like) after checking all of them; BadRequest lists problems."""
        problems = []
        for name, value in changes.items():
            if name not in self.__dataclass_fields__:
                problems.append(f"unknown fault {name!r}")
            elif name in ("hang", "unhealthy") and not isinstance(value, bool):
                problems.append(f"{name} must be a boolean")
            elif name == "slow_s" and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0
            ):
                problems.append("slow_s must be a number >= 0")
            elif name == "fail_status" and value is not None and (
                type(value) is not int or not 400 <= value <= 599
            ):
                problems.append("fail_status must be null or an HTTP status in [400, 599]")
            elif name == "die_after_chunks" and value is not None and (
                type(value) is not int or value < 0
            ):
                problems.append("die_after_chunks must be null or an integer >= 0")
            elif name == "poison_marker" and value is not None and (
                not isinstance(value, str) or not value
            ):
                problems.append("poison_marker must be null or a non-empty string")
        if problems:
            raise BadRequest("; ".join(problems))
        for name, value in changes.items():
            setattr(self, name, float(value) if name == "slow_s" else value)  # type: ignore

    def as_dict(self) -> dict[str, object]:
        return asdict(self)
