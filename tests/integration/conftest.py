"""Fixtures shared by the ingestion integration tests."""

from __future__ import annotations

import pytest
import zmq

from tests.kv_test_publisher import FixtureVersion

FIXTURE_VERSIONS = ["vllm-0.33.0", "vllm-0.23.0", "sglang-0.5.23", "sglang-0.5.19"]


@pytest.fixture
def ctx():
    """A private ZeroMQ context, destroyed (sockets closed at once) after the test."""
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture(params=FIXTURE_VERSIONS)
def fx(request, kv_fixtures_dir) -> FixtureVersion:
    """One captured fixture story (every version in turn)."""
    return FixtureVersion.load(kv_fixtures_dir, request.param)
