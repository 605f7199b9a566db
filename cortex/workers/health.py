"""Health rules of the workers: the probe's settings, its verdict, and the counters kept per worker.

Rules (``protocols/engine-endpoints.md`` §1):

* Liveness is ``GET /health`` on the worker's HTTP base, every ``interval_s`` (start to start),
  each probe cut at ``timeout_s``. A ``200`` is healthy; any other status, a connection that
  cannot be opened or breaks, and a probe cut at its timeout are failures (``probe_verdict``).
  Both engines answer ``200`` with an empty body; the body is not read for meaning.
* ``failures_to_open`` consecutive failures (probes and upstream connections alike) open the
  worker's circuit breaker for ``open_s``; then one trial probe decides (``breaker.py``).
* Load is polled every ``load_interval_s`` (vLLM ``/metrics``, SGLang ``/v1/loads`` or the older
  ``/get_load``), with the same ``timeout_s``, only while the worker is healthy.

Pure: no I/O here. ``WorkerCounters`` are plain monotonic ints for the metrics layer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from cortex.errors import ConfigError


@dataclass(frozen=True, slots=True)
class HealthSettings:
    interval_s: float = 2.0  # between two health probes of one worker (start to start)
    timeout_s: float = 1.0  # one probe or load poll is cut after this
    failures_to_open: int = 3  # consecutive failures that open the circuit breaker
    open_s: float = 10.0  # an open breaker waits this long before its trial probe
    load_interval_s: float = 1.0  # between two load polls of one healthy worker

    def __post_init__(self) -> None:
        problems = [f"{name} must be > 0" for name in (
            "interval_s", "timeout_s", "open_s", "load_interval_s")
            if not getattr(self, name) > 0]
        if self.failures_to_open < 1:
            problems.append("failures_to_open must be >= 1")
        if problems:
            raise ConfigError(problems)


def probe_verdict(status: int) -> str | None:
    """``None`` when a ``/health`` answer with this status means healthy, else the reason."""
    if status == 200:
        return None
    return f"/health answered {status}"


@dataclass(slots=True)
class WorkerCounters:
    probes: int = 0  # health probes finished (either way)
    probe_failures: int = 0  # probes that failed (status, connection, timeout)
    upstream_failures: int = 0  # upstream connections that could not be opened (data plane)
    breaker_opens: int = 0  # times the breaker opened or re-opened
    load_polls: int = 0  # load polls finished (either way)
    load_failures: int = 0  # load polls whose request failed (status, connection, timeout)
    load_parse_errors: int = 0  # load reports that could not be parsed

    def add(self, other: WorkerCounters) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
