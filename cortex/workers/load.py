"""Load reports of the engines, parsed into one figure per DP rank. Pure: text/bytes in.

Sources (``protocols/engine-endpoints.md`` §3):

* vLLM ``GET /metrics`` (Prometheus text): gauges ``vllm:num_requests_running``,
  ``vllm:num_requests_waiting`` and the KV-cache usage ``vllm:kv_cache_usage_perc`` (0..1) —
  called ``vllm:gpu_cache_usage_perc`` up to vLLM 0.11; when both are present the new name
  wins. The DP rank is the ``engine`` label (absent: rank 0). Samples of one metric and rank
  that differ in other labels (``model_name``) are summed (counts) or maxed (usage).
  Only the lines of these metrics are parsed; ``str.find`` jumps from one to the next and
  every other line is skipped unread (a 60 kB exposition of two engines: ~0.2 ms here,
  against ~1.5 ms for a line-by-line scan). Labels may come in
  any order, values may use the escapes ``\\\\``, ``\\"``, ``\\n``, and a sample may carry a
  timestamp.
* SGLang ``GET /v1/loads`` (>= 0.5.8): ``{"loads": [{"dp_rank", "num_running_reqs",
  "num_waiting_reqs", "num_waiting_uncached_tokens", "token_usage", ...}, ...]}``.
* SGLang ``GET /get_load`` (0.4.7 – 0.5.20): ``[{"dp_rank", "num_reqs" (running + waiting),
  "num_waiting_reqs", ...}, ...]``; it reports neither KV usage nor uncached tokens.

Identity: vLLM's exposition carries the API server's ``process_start_time_seconds``
(prometheus_client's process collector); ``vllm_process_start`` reads it, so a poll also tells
whether the process behind the URL is still the one seen before (a restart the health probe
did not see).

Rules: a figure the engine did not report is ``None``, never 0. A report that yields no rank,
a rank without its running/waiting counts, a negative or non-finite figure, a duplicate rank
or bytes that are not the expected format raise ``LoadParseError`` (a ``ValueError``) and
nothing else. KV usage above 1 is clamped to 1.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass


class LoadParseError(ValueError):
    """A load report could not be used; the monitor counts it and marks the load unknown."""


@dataclass(frozen=True, slots=True)
class RankLoad:
    running: int  # requests in the running batch
    waiting: int  # requests queued in the engine
    kv_usage: float | None = None  # fraction of the KV cache in use, 0..1
    waiting_uncached_tokens: int | None = None  # prefill tokens of the queue not yet cached


# ---------------------------------------------------------------------------------------------
# vLLM: Prometheus text exposition

_RUNNING = "vllm:num_requests_running"
_WAITING = "vllm:num_requests_waiting"
_KV_NEW = "vllm:kv_cache_usage_perc"
_KV_OLD = "vllm:gpu_cache_usage_perc"
_WANTED = (_RUNNING, _WAITING, _KV_NEW, _KV_OLD)

_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\\n]|\\.)*)"\s*(,?)')
_ESCAPE = re.compile(r"\\(.)")
_UNESCAPED = {"\\": "\\", '"': '"', "n": "\n"}


def _unescape(match: re.Match[str]) -> str:
    char = match.group(1)
    return _UNESCAPED.get(char, "\\" + char)


def _parse_labels(line: str) -> tuple[dict[str, str], int]:
    """Labels from ``line[0]`` == '{' up to the closing brace; returns (labels, end)."""
    labels: dict[str, str] = {}
    pos = 1
    while True:
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if pos < len(line) and line[pos] == "}":
            return labels, pos + 1
        match = _LABEL.match(line, pos)
        if match is None:
            raise LoadParseError("malformed labels")
        name, raw, comma = match.groups()
        labels[name] = _ESCAPE.sub(_unescape, raw) if "\\" in raw else raw
        pos = match.end()
        if not comma and not line.startswith("}", pos):
            raise LoadParseError("malformed labels")


def _parse_sample(rest: str) -> tuple[dict[str, str], float]:
    """Labels and value of a sample line, given what follows its metric name."""
    rest = rest.lstrip(" \t")
    labels: dict[str, str] = {}
    if rest.startswith("{"):
        labels, end = _parse_labels(rest)
        rest = rest[end:]
    fields = rest.split()
    if not 1 <= len(fields) <= 2:
        raise LoadParseError("expected a value and an optional timestamp")
    try:
        value = float(fields[0])
    except ValueError:
        raise LoadParseError(f"bad value {fields[0]!r}") from None
    return labels, value


def _rank_of(labels: dict[str, str]) -> int:
    raw = labels.get("engine")
    if raw is None:
        return 0
    if not (raw.isascii() and raw.isdigit()):
        raise LoadParseError(f"engine label {raw!r} is not a DP rank")
    return int(raw)


def _samples(text: str) -> Iterator[tuple[str, str, int]]:
    """``(name, rest of the line, offset)`` of every sample line of the wanted gauges.

    ``str.find`` jumps from one occurrence of a name to the next (HELP/TYPE comments and
    longer names sharing the prefix are occurrences too, and are passed over)."""
    for name in _WANTED:
        pos = text.find(name)
        while pos != -1:
            after = pos + len(name)
            line_start = text.rfind("\n", 0, pos) + 1
            if text[after:after + 1] in ("{", " ", "\t") and not text[line_start:pos].strip(" \t"):
                end = text.find("\n", after)
                yield name, text[after:] if end == -1 else text[after:end], pos
            pos = text.find(name, after)


_PROCESS_START = "\nprocess_start_time_seconds "


def vllm_process_start(text: str) -> float | None:
    """The exposition's ``process_start_time_seconds`` (``None`` when absent or garbled)."""
    at = text.find(_PROCESS_START)
    if at < 0:
        return None
    start = at + len(_PROCESS_START)
    end = text.find("\n", start)
    try:
        value = float(text[start:] if end < 0 else text[start:end])
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def parse_vllm_metrics(text: str) -> dict[int, RankLoad]:
    """Per DP rank, the load figures of a vLLM ``/metrics`` exposition."""
    counts: dict[tuple[int, str], float] = {}
    usage: dict[tuple[int, str], float] = {}
    for name, rest, offset in _samples(text):
        try:
            labels, value = _parse_sample(rest)
            if not math.isfinite(value) or value < 0:
                raise LoadParseError(f"{name} = {value} is not a load figure")
            key = (_rank_of(labels), name)
        except LoadParseError as error:
            line = text.count("\n", 0, offset) + 1
            raise LoadParseError(f"line {line}: {error}") from None
        if name == _RUNNING or name == _WAITING:
            counts[key] = counts.get(key, 0.0) + value
        else:
            usage[key] = max(usage.get(key, 0.0), value)
    ranks = sorted({rank for rank, _ in counts} | {rank for rank, _ in usage})
    if not ranks:
        raise LoadParseError(f"no {_RUNNING} / {_WAITING} gauges in the exposition")
    loads: dict[int, RankLoad] = {}
    for rank in ranks:
        running = counts.get((rank, _RUNNING))
        waiting = counts.get((rank, _WAITING))
        if running is None or waiting is None:
            missing = _RUNNING if running is None else _WAITING
            raise LoadParseError(f"engine {rank}: {missing} missing")
        kv = usage.get((rank, _KV_NEW), usage.get((rank, _KV_OLD)))
        loads[rank] = RankLoad(round(running), round(waiting),
                               None if kv is None else min(kv, 1.0))
    return loads


# ---------------------------------------------------------------------------------------------
# SGLang: JSON load endpoints


def _count(entry: dict, key: str, where: str, *, required: bool = True) -> int | None:
    value = entry.get(key)
    if value is None:
        if required:
            raise LoadParseError(f"{where}: {key} missing")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LoadParseError(f"{where}: {key} is not a number")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise LoadParseError(f"{where}: {key} = {value} is not a count")
    if value < 0:
        raise LoadParseError(f"{where}: {key} = {value} is negative")
    return int(value)


def _usage(entry: dict, key: str, where: str) -> float | None:
    value = entry.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LoadParseError(f"{where}: {key} is not a number")
    if not math.isfinite(value) or value < 0:
        raise LoadParseError(f"{where}: {key} = {value} is not a usage fraction")
    return min(float(value), 1.0)


def _rank_entry(entry: object, index: int, old: bool) -> tuple[int, RankLoad]:
    where = f"loads[{index}]"
    if not isinstance(entry, dict):
        raise LoadParseError(f"{where} is not an object")
    rank = _count(entry, "dp_rank", where)
    assert rank is not None
    where = f"dp_rank {rank}"
    if old:
        total = _count(entry, "num_reqs", where)
        waiting = _count(entry, "num_waiting_reqs", where)
        assert total is not None and waiting is not None
        if waiting > total:
            raise LoadParseError(f"{where}: num_waiting_reqs > num_reqs")
        return rank, RankLoad(total - waiting, waiting)
    running = _count(entry, "num_running_reqs", where)
    waiting = _count(entry, "num_waiting_reqs", where)
    assert running is not None and waiting is not None
    return rank, RankLoad(running, waiting, _usage(entry, "token_usage", where),
                          _count(entry, "num_waiting_uncached_tokens", where, required=False))


def parse_sglang_loads(body: bytes) -> dict[int, RankLoad]:
    """Per DP rank, the load figures of SGLang ``/v1/loads`` or the older ``/get_load``."""
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise LoadParseError(f"load report is not JSON: {error}") from None
    if isinstance(document, dict):
        entries, old = document.get("loads"), False
        if not isinstance(entries, list):
            raise LoadParseError("load report has no 'loads' list")
    elif isinstance(document, list):
        entries, old = document, True
    else:
        raise LoadParseError("load report is neither a /v1/loads object nor a /get_load list")
    if not entries:
        raise LoadParseError("load report lists no DP rank")
    loads: dict[int, RankLoad] = {}
    for index, entry in enumerate(entries):
        rank, load = _rank_entry(entry, index, old)
        if rank in loads:
            raise LoadParseError(f"dp_rank {rank} reported twice")
        loads[rank] = load
    return loads
