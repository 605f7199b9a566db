"""Bearer-token check of the control plane's admin and debug endpoints.

Rules:

* No token configured: the admin API is off — every protected call is refused with
  ``AdminDisabled`` (403), whatever the request carries.
* Token configured: the request must carry ``Authorization: Bearer <token>`` (scheme
  case-insensitive, one space); a missing, malformed or different token is ``Unauthorized``
  (401). The comparison is constant-time over the token bytes (``hmac.compare_digest``), so the
  answer's timing does not reveal how much of a guess was right.
* The token is a secret: it never appears in ``repr``, error messages or logs.

Pure: no I/O.
"""

from __future__ import annotations

import hmac

from cortex.errors import CortexError, Unauthorized


class AdminDisabled(CortexError):
    """A protected endpoint was called but no admin token is configured."""

    http_status = 403


class BearerAuth:
    __slots__ = ("_token",)

    def __init__(self, token: str | None) -> None:
        if token is not None and (not token or token != token.strip()):
            raise ValueError("admin token must be non-empty, without surrounding whitespace")
        self._token = None if token is None else token.encode()

    @property
    def enabled(self) -> bool:
        return self._token is not None

    def check(self, authorization: bytes | None) -> None:
        """Raise ``AdminDisabled`` or ``Unauthorized`` unless ``authorization`` is right."""
        if self._token is None:
            raise AdminDisabled("admin API disabled")
        if authorization is None:
            raise Unauthorized("missing bearer token")
        scheme, _, presented = authorization.partition(b" ")
        if scheme.lower() != b"bearer" or not presented:
            raise Unauthorized("expected 'Authorization: Bearer <token>'")
        if not hmac.compare_digest(presented, self._token):
            raise Unauthorized("invalid bearer token")

    def __repr__(self) -> str:
        return f"BearerAuth({'***' if self._token is not None else None})"
