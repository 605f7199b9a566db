"""The one mapping from Cortex errors to HTTP responses."""

from __future__ import annotations

import json

import pytest

from cortex.errors import (
    BadRequest,
    ConfigError,
    CortexError,
    DecodeError,
    NoWorkerAvailable,
    NotFound,
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
