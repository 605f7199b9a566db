"""Pure parts of the control plane: bearer auth, worker bodies, host policy, readiness."""

from __future__ import annotations

import json

import pytest

from cortex.control.admin import WorkerHostPolicy, parse_worker_spec, spec_as_json
from cortex.control.auth import AdminDisabled, BearerAuth
from cortex.control.readiness import Readiness, assess
from cortex.errors import ConfigError, Unauthorized
from cortex.ledger.state import TargetState
from cortex.scheduling.view import Role, WorkerView
from cortex.workers.spec import WorkerSpec

TOKEN = "s3cret-token-value"


# ---------------------------------------------------------------------- auth


def test_no_token_configured_disables_admin_whatever_is_sent():
    auth = BearerAuth(None)
    assert not auth.enabled
    for header in (None, b"Bearer anything", b""):
        with pytest.raises(AdminDisabled) as caught:
            auth.check(header)
        assert caught.value.http_status == 403


@pytest.mark.parametrize("header", [
    None, b"", b"Bearer", b"Bearer ", b"Basic " + TOKEN.encode(), TOKEN.encode(),
    b"Bearer " + TOKEN.encode() + b"x", b"Bearer " + TOKEN[:-1].encode(), b"Bearer wrong",
])
def test_wrong_or_missing_token_is_401(header):
    with pytest.raises(Unauthorized):
        BearerAuth(TOKEN).check(header)


def test_right_token_passes_and_scheme_is_case_insensitive():
    auth = BearerAuth(TOKEN)
    auth.check(b"Bearer " + TOKEN.encode())
    auth.check(b"bearer " + TOKEN.encode())


def test_token_never_shown():
    auth = BearerAuth(TOKEN)
    assert TOKEN not in repr(auth)
    with pytest.raises(Unauthorized) as caught:
        auth.check(b"Bearer " + TOKEN.encode() + b"!")
    assert TOKEN not in str(caught.value)


@pytest.mark.parametrize("bad", ["", " padded "])
def test_unusable_tokens_refused(bad):
    with pytest.raises(ValueError):
        BearerAuth(bad)


# ---------------------------------------------------------------------- worker bodies


def body(**fields) -> bytes:
    return json.dumps(fields).encode()


def test_valid_body_becomes_a_spec_and_round_trips():
    spec, problems = parse_worker_spec(body(
        name="w1", url="http://10.0.0.5:30000", engine="vllm", role="prefill", dp_size=2,
        events="tcp://10.0.0.5:5557", replay="tcp://10.0.0.5:5558", weight=2))
    assert problems == []
    assert spec == WorkerSpec("w1", "http://10.0.0.5:30000", engine="vllm", role=Role.PREFILL,
                              dp_size=2, events="tcp://10.0.0.5:5557",
                              replay="tcp://10.0.0.5:5558", weight=2)
    again, problems = parse_worker_spec(json.dumps(spec_as_json(spec)).encode())
    assert again == spec and problems == []


def test_every_problem_is_reported_at_once():
    spec, problems = parse_worker_spec(body(
        url=5, role="leader", dp_size="2", colour="red", bootstrap_port=True, weight="1"))
    assert spec is None
    text = "\n".join(problems)
    for expected in ("unknown field 'colour'", "name: required", "url: must be a string",
                     "role: must be one of", "dp_size: must be an integer",
                     "bootstrap_port: must be an integer or null", "weight: must be a number"):
        assert expected in text, expected
    assert len(problems) == 7


def test_spec_validation_problems_all_reported():
    spec, problems = parse_worker_spec(body(
        name="w", url="ftp://x/y", dp_size=0, replay="tcp://h:1", weight=0))
    assert spec is None
    assert len(problems) == 4, problems  # url, dp_size, replay without events, weight


@pytest.mark.parametrize("raw", [b"", b"{", b"[1, 2]", b'"w"', b"\xff\xfe", b"[" * 100_000])
def test_not_a_json_object(raw):
    spec, problems = parse_worker_spec(raw)
    assert spec is None and len(problems) == 1


# ---------------------------------------------------------------------- host policy


def test_host_policy_networks_and_names():
    policy = WorkerHostPolicy.parse(["10.0.0.0/8", "127.0.0.1", "gpu-1.internal", "fd00::/8"])
    assert policy.allows("10.2.3.4") and policy.allows("127.0.0.1")
    assert policy.allows("GPU-1.internal.") and policy.allows("fd00::5")
    assert not policy.allows("169.254.169.254")  # cloud metadata
    assert not policy.allows("127.0.0.2") and not policy.allows("gpu-2.internal")


def test_host_policy_checks_every_endpoint():
    policy = WorkerHostPolicy.parse(["10.0.0.0/8"])
    spec, problems = parse_worker_spec(body(
        name="w", url="http://169.254.169.254:80", events="tcp://10.0.0.1:5557",
        replay="ipc:///tmp/replay"), policy)
    assert spec is None
    assert len(problems) == 2
    assert "169.254.169.254" in problems[0] and "ipc" in problems[1]


def test_host_policy_parse_reports_every_bad_entry():
    with pytest.raises(ConfigError) as caught:
        WorkerHostPolicy.parse(["10.0.0.0/33", "a b", "ok.host"])
    assert len(caught.value.problems) == 2


# ---------------------------------------------------------------------- readiness


def test_readiness():
    ready = TargetState.READY
    assert assess([]) == Readiness(False, reasons=("no workers registered",))
    assert not assess([WorkerView("a", healthy=False)]).ready
    assert assess([WorkerView("a", ledger_state=ready), WorkerView("b")]) == Readiness(True)
    degraded = assess([WorkerView("a", ledger_state=TargetState.SYNCING),
                       WorkerView("b", healthy=False, ledger_state=ready)])
    assert degraded.ready and degraded.degraded
    assert degraded.reasons == ("worker b: unhealthy", "worker a: ledger syncing")
    assert degraded.as_json()["status"] == "degraded" and degraded.http_status == 200
    extra = assess([WorkerView("a")], ["model m: exact routing off (profile missing)"])
    assert extra.degraded and extra.reasons == ("model m: exact routing off (profile missing)",)
    assert Readiness(False).http_status == 503
