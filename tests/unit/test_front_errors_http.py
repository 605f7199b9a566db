"""The one mapping from Cortex errors to HTTP responses."""

from __future__ import annotations

import json

import pytest

from cortex.errors import (
    BadRequest,
    ConfigError,
    CortexError,
    DecodeError,
    NotFound,
    NoWorkerAvailable,
    PayloadTooLarge,
    Unauthorized,
    UpstreamError,
)
from cortex.front.errors_http import (
    HeaderFieldsTooLarge,
    InternalServerError,
    RequestTimeout,
    ServiceUnavailable,
    error_response,
    error_type_name,
)


@pytest.mark.parametrize(("exc", "status", "type_name"), [
    (BadRequest("bad"), 400, "bad_request"),
    (Unauthorized("who"), 401, "unauthorized"),
    (NotFound("where"), 404, "not_found"),
    (RequestTimeout("slow"), 408, "request_timeout"),
    (PayloadTooLarge("big"), 413, "payload_too_large"),
    (HeaderFieldsTooLarge("big head"), 431, "header_fields_too_large"),
    (InternalServerError(), 500, "internal_server_error"),
    (CortexError("root"), 500, "cortex_error"),
    (DecodeError("frame"), 502, "decode_error"),
    (UpstreamError("worker"), 502, "upstream_error"),
    (NoWorkerAvailable("none"), 503, "no_worker_available"),
    (ServiceUnavailable("draining"), 503, "service_unavailable"),
])
def test_status_and_openai_style_body(exc, status, type_name):
    response = error_response(exc)
    assert response.status == status
    assert response.headers == [(b"content-type", b"application/json")]
    assert json.loads(response.body) == {
        "error": {"message": str(exc), "type": type_name, "code": status}}


def test_config_error_lists_every_problem():
    response = error_response(ConfigError(["port must be > 0", "no workers"]))
    error = json.loads(response.body)["error"]
    assert error["type"] == "config_error" and error["code"] == 500
    assert error["message"] == "port must be > 0; no workers"
    assert error["problems"] == ["port must be > 0", "no workers"]


def test_type_names_split_acronyms_and_words():
    class HTTPThingFailed(CortexError):
        pass

    assert error_type_name(HTTPThingFailed) == "http_thing_failed"
    assert error_type_name(NoWorkerAvailable) == "no_worker_available"


def test_retry_after_is_sent_in_whole_seconds_when_known():
    from cortex.errors import NoWorkerAvailable, Overloaded
    from cortex.front.errors_http import error_response

    response = error_response(Overloaded("queue full", retry_after_s=0.2))
    assert response.status == 429 and (b"retry-after", b"1") in response.headers
    response = error_response(NoWorkerAvailable("busy", saturated=True, retry_after_s=2.5))
    assert response.status == 503 and (b"retry-after", b"3") in response.headers
    assert all(name != b"retry-after" for name, _ in error_response(
        NoWorkerAvailable("dead")).headers)
