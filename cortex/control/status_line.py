"""Standard reason phrases on the control plane's HTTP/1.1 status lines.

hypercorn builds its h11 responses without a reason phrase, so every status line it writes
reads ``HTTP/1.1 200 `` (legal — the phrase may be empty — but it looks broken to a person
with curl, and some clients log it); ASGI has no field through which an app could give one.

Rules:

* ``install()`` gives hypercorn's HTTP/1.1 protocol module (``hypercorn.protocol.h11``, and
  only it: every other user of h11 in the process is untouched) a view of h11 whose
  ``Response`` and ``InformationalResponse`` fill an empty ``reason`` with the standard phrase
  of the status code. Events stay plain h11 events (h11 drives its state machine by their
  exact type). Idempotent; ``serve_control`` calls it before serving.
* The phrase is the data plane's (``cortex.front.response_head.REASONS``, from
  ``http.HTTPStatus``: 200 ``OK``, 503 ``Service Unavailable``); an unregistered code keeps
  the empty phrase.
* A hypercorn whose HTTP/1.1 module no longer builds events through its ``h11`` name is left
  alone (its status lines are whatever it writes); ``tests/integration/test_control_serve.py``
  reads a raw status line, so an upgrade that changes this shows there.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import h11
import hypercorn.protocol.h11 as hypercorn_h11

from cortex.front.response_head import REASONS


def _with_reason(event: Callable[..., Any]) -> Callable[..., Any]:
    def build(*, status_code: int, reason: bytes | str = b"", **fields: Any) -> Any:
        return event(status_code=status_code, reason=reason or REASONS.get(status_code, b""),
                     **fields)

    return build


class _H11WithReasons(types.ModuleType):
    """h11 as hypercorn's HTTP/1.1 module sees it once ``install``ed."""

    Response = staticmethod(_with_reason(h11.Response))
    InformationalResponse = staticmethod(_with_reason(h11.InformationalResponse))

    def __getattr__(self, name: str) -> Any:  # everything else: h11 itself
        return getattr(h11, name)


def install() -> None:
    if getattr(hypercorn_h11, "h11", None) is h11:
        hypercorn_h11.h11 = _H11WithReasons("h11")
