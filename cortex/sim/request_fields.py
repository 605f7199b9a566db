"""How the simulated engine reads a request's fields: the JSON object, and each field checked as the
real engines check it (a wrong type or an out-of-range value is a 400 naming the field, never a 500).

Pure: takes the request's bytes or decoded body, returns the value or raises `BadRequest`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from cortex.errors import BadRequest
from cortex.front.messages import HttpRequest

DEFAULT_MAX_TOKENS = 16
MAX_OUTPUT_TOKENS = 1 << 20


def json_body(request: HttpRequest) -> dict[str, Any]:
    try:
        body = msgspec.json.decode(request.body) if request.body else {}
    except msgspec.DecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be a boolean")
    return value


def positive(body: dict[str, Any], name: str, default: int) -> int:
    value = body.get(name, default)
    if value is None:
        return default
    if type(value) is not int or value < 1:
        raise BadRequest(f"{name} must be a positive integer")
    return value


def max_tokens(value: object, name: str) -> int:
    if value is None:
        return DEFAULT_MAX_TOKENS
    if type(value) is not int or not 1 <= value <= MAX_OUTPUT_TOKENS:
        raise BadRequest(f"{name} must be an integer in [1, {MAX_OUTPUT_TOKENS}]")
    return value


def cache_salt(body: dict[str, Any]) -> str | None:
    salt = body.get("cache_salt")
    if salt is None or isinstance(salt, str):
        return salt or None
    raise BadRequest("cache_salt must be a string")


