"""Structured logs: one JSON object per line, a request id per request, secrets never written.

Rules:

* ``configure(log_config, secrets)`` installs one stderr handler on the root logger (replacing
  any handler a previous ``configure`` installed), at ``log_config.level``. With
  ``log_config.json`` each record is one line ``{"ts", "level", "logger", "message",
  "request_id"?, "exc"?, ...extra}``; otherwise a plain ``ts level logger [request id] message``
  line. systemd's journal takes either from stderr. A process of ``server.processes`` > 1 other
  than the first adds its index (``"process": 1``; ``ts level p1 logger ...``).
* The request id lives in a context variable (``REQUEST_ID``). The gateway's handler entry
  calls ``request_started(request)`` first thing: the client's ``x-request-id`` (trimmed to
  ``MAX_REQUEST_ID`` printable characters) or a process-unique ``<pid hex>-<sequence hex>``.
  trio gives each task its own context, and a request's handler and body streaming run in the
  connection's task, so every record of a request carries its id; the next request on the same
  connection sets a new one. Cost on the request path: one header scan and one ``set``.
* Secrets (the admin token, from inline config or its file) are replaced by ``***`` in the
  whole formatted line, message and traceback alike, and any ``Bearer <credential>`` is masked
  whatever its value, so a logged header or exception text cannot leak a token.
* Access log (``log.access_log``): ``log_exchange`` is the data-plane server's exchange hook
  (``cortex.front.exchange``) and writes one ``cortex.access`` record per request when it is
  over — its last byte written, the client gone, the answer cut, or refused before it could
  be read: method and path (``-`` for a request that could not be read), status (``0`` when
  no head went out), ``outcome`` (complete, refused, upstream_broke, client_gone, cancelled,
  error), ``duration_ms`` to the end, ``head_ms`` to the head (``null`` without one),
  ``bytes`` of body written, the client, the chosen worker, match mode and predicted cache
  hit. No body and no header other than those is ever logged.

Imports no trio: the formatter and the hook are plain Python.
"""

from __future__ import annotations

import contextvars
import itertools
import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, TextIO

from cortex.front.exchange import Exchange
from cortex.front.messages import HttpRequest


@dataclass(frozen=True, slots=True)
class LogConfig:
    """The ``[log]`` section of the configuration (``cortex.config.tree``)."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    json: bool = True
    access_log: bool = False


REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "cortex_request_id", default=None)
MAX_REQUEST_ID = 128
MASK = "***"

_sequence = itertools.count(1)
_prefix = f"{os.getpid():x}-"
_UNPRINTABLE = re.compile(r"[^\x21-\x7e]")
_BEARER = re.compile(r"(?i)(bearer\s+)[^\s\"',;]+")
# Attributes every LogRecord has: anything else was passed through ``extra=`` and is written.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime", "taskName"}


def request_started(request: HttpRequest) -> str:
    """Set (and return) the id of the request now being handled in this context."""
    given = request.header(b"x-request-id")
    if given:
        value = _UNPRINTABLE.sub("", given[:MAX_REQUEST_ID].decode("ascii", "replace"))
        if value:
            REQUEST_ID.set(value)
            return value
    value = f"{_prefix}{next(_sequence):x}"
    REQUEST_ID.set(value)
    return value


class Redactor:
    """Masks known secrets and bearer credentials in text."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        # Longest first, so a secret containing another is masked whole.
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        if "earer" in text or "EARER" in text:
            text = _BEARER.sub(lambda m: m.group(1) + MASK, text)
        return text


def _timestamp(created: float) -> str:
    seconds = int(created)
    millis = int((created - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines inside values are escaped)."""

    def __init__(self, redact: Redactor | None = None, process: int | None = None) -> None:
        super().__init__()
        self.redact = redact or Redactor()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": _timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.process is not None:
            entry["process"] = self.process
        request_id = REQUEST_ID.get()
        if request_id is not None:
            entry["request_id"] = request_id
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return self.redact(json.dumps(entry, ensure_ascii=False, default=str))


class TextFormatter(logging.Formatter):
    """``ts level logger [request id] message`` (and the traceback), secrets masked."""

    def __init__(self, redact: Redactor | None = None, process: int | None = None) -> None:
        super().__init__()
        self.redact = redact or Redactor()
        self.tag = "" if process is None else f" p{process}"

    def format(self, record: logging.LogRecord) -> str:
        request_id = REQUEST_ID.get()
        head = f"{_timestamp(record.created)} {record.levelname.lower()}{self.tag} {record.name}"
        if request_id is not None:
            head += f" [{request_id}]"
        text = f"{head} {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return self.redact(text)


_installed: logging.Handler | None = None


def configure(config: LogConfig, secrets: Iterable[str | None] = (),
              stream: TextIO | None = None, process: int | None = None) -> logging.Handler:
    """Install the one handler of the process's logs (see the rules at the top); ``process``:
    this process's index among ``server.processes`` (written in every record), or ``None``."""
    global _installed
    redact = Redactor(secrets)
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter(redact, process) if config.json
                         else TextFormatter(redact, process))
    root = logging.getLogger()
    if _installed is not None:
        root.removeHandler(_installed)
    root.addHandler(handler)
    root.setLevel(config.level.upper())
    access = logging.getLogger(ACCESS_LOGGER)
    access.disabled = not config.access_log
    access.setLevel(logging.INFO if config.access_log else logging.NOTSET)  # whatever the level
    _installed = handler
    return handler


ACCESS_LOGGER = "cortex.access"
_access = logging.getLogger(ACCESS_LOGGER)


def log_exchange(exchange: Exchange) -> None:
    """Writes the access record of one request (rules at the top)."""
    if not _access.isEnabledFor(logging.INFO):
        return
    headers = dict(exchange.headers)

    def text(name: bytes) -> str | None:
        value = headers.get(name)
        return value.decode("latin-1") if value is not None else None

    request = exchange.request
    method = request.method.decode("latin-1") if request is not None else "-"
    path = request.path.decode("latin-1") if request is not None else "-"
    status = exchange.status or 0
    client = exchange.client
    head_at = exchange.head_at
    _access.info(
        "%s %s %d %s", method, path, status, exchange.outcome,
        extra={"method": method, "path": path, "status": status, "outcome": exchange.outcome,
               "duration_ms": round((exchange.ended - exchange.started) * 1000, 3),
               "head_ms": (round((head_at - exchange.started) * 1000, 3)
                           if head_at is not None else None),
               "bytes": exchange.body_bytes,
               "client": f"{client[0]}:{client[1]}" if client else None,
               "worker": text(b"x-cortex-assigned-worker"),
               "match_mode": text(b"x-cortex-match-mode"),
               "cache_hit_tokens": text(b"x-cortex-cache-hit-tokens")})
