"""Run the control plane's ASGI app under hypercorn's trio worker.

Rules:

* ``serve_control`` binds ``host:port`` (loopback by default; port 0 picks a free port) and
  reports the bound port through ``task_status`` once hypercorn listens, so callers use
  ``port = await nursery.start(serve_control, app, ...)`` and never sleep for readiness. The
  port comes from hypercorn's own ``task_status`` report of the bound socket's address.
* Graceful shutdown: setting ``shutdown`` stops accepting; requests in progress get
  ``graceful_timeout_s`` to finish, then the function returns. Cancelling the caller's scope
  stops it at once.
* Slow clients: a connection without a complete request head within ``idle_timeout_s`` (also
  the keep-alive idle limit) is closed, however slowly it drips bytes; a read that brings
  nothing for ``read_timeout_s`` ends the connection. Header blocks are capped by hypercorn
  (16 KiB); admin bodies by the app (64 KiB). There is no connection cap: the control plane
  listens on loopback unless configured otherwise.
* Hypercorn logs through the ``cortex.control.hypercorn`` logger; no access log (it would
  hold request lines of every scrape; nothing here ever logs a header).
* Status lines carry the standard reason phrase (``HTTP/1.1 200 OK``; ``status_line``).
"""

from __future__ import annotations

import logging
from functools import partial

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from cortex.control import status_line
from cortex.control.app import ControlApp
from cortex.host_literal import host_port

LOGGER = "cortex.control.hypercorn"


def hypercorn_config(host: str, port: int, graceful_timeout_s: float = 5.0,
                     idle_timeout_s: float = 10.0, read_timeout_s: float = 30.0) -> Config:
    config = Config()
    config.bind = [host_port(host, port)]
    config.accesslog = None
    config.errorlog = logging.getLogger(LOGGER)
    config.graceful_timeout = graceful_timeout_s
    config.include_server_header = False
    config.keep_alive_timeout = idle_timeout_s  # hypercorn runs it until a head is complete
    config.read_timeout = read_timeout_s
    return config


def port_of(bind: str) -> int:
    """The port of a hypercorn bind report such as ``http://127.0.0.1:8081``."""
    return int(bind.rsplit(":", 1)[1])


async def serve_control(
    app: ControlApp,
    host: str = "127.0.0.1",
    port: int = 8081,
    *,
    shutdown: trio.Event | None = None,
    graceful_timeout_s: float = 5.0,
    idle_timeout_s: float = 10.0,
    read_timeout_s: float = 30.0,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    status_line.install()
    config = hypercorn_config(host, port, graceful_timeout_s, idle_timeout_s, read_timeout_s)
    trigger = shutdown.wait if shutdown is not None else None
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(serve, app, config, shutdown_trigger=trigger,
                                            mode="asgi"))
        task_status.started(port_of(binds[0]))
