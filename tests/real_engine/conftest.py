"""Real vLLM and SGLang servers (CPU builds, tiny models with real tokenizers) behind Cortex.

Every test here is marked ``real_engine`` (``pytest -m "not real_engine"`` leaves them out;
``make test-real`` runs only them). Without the engine environment (``make engines``) they skip
with the reason — unless ``CORTEX_REAL_ENGINES_REQUIRED=1`` (``make test``, CI), where a missing
environment fails every one of them instead: CI never skips them silently.

vLLM servers come from one session-wide ``farm`` (``farm.VllmFarm``); SGLang's, one per
tokenizer family, are shared by the tests of ``test_sglang.py``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.real_engine.engine_server import FAMILIES
from tests.real_engine.farm import ServerSet, VllmFarm
from tests.real_engine.sglang_server import sglang_env
from tests.real_engine.vllm_server import EngineEnv, engine_env

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if Path(str(item.fspath)).resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.real_engine)
            item.add_marker(pytest.mark.slow)


def unusable(why: str) -> None:
    """A missing engine environment: skip, or fail where real engines are required."""
    if os.environ.get("CORTEX_REAL_ENGINES_REQUIRED") == "1":
        pytest.fail(f"real engines required but unusable: {why}")
    pytest.skip(why)


@pytest.fixture(scope="session")
def engines() -> EngineEnv:
    env, why = engine_env()
    if env is None:
        unusable(why)
    return env


@pytest.fixture(scope="session")
def sglang_engines() -> EngineEnv:
    env, why = sglang_env()
    if env is None:
        unusable(why)
    return env


@pytest.fixture(scope="session")
def engine_logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm-logs")


@pytest.fixture(scope="session")
def farm(engines: EngineEnv, engine_logs: Path) -> Iterator[VllmFarm]:
    farm = VllmFarm(engines, engine_logs)
    yield farm
    farm.stop_all()


@pytest.fixture(params=FAMILIES)
def fresh(request, farm, engines):
    """Two servers of the family, their prefix caches emptied (and the cleared event sent)."""
    name = request.param
    servers = farm.servers(ServerSet(name))
    for server in servers:
        server.reset_prefix_cache()
    return name, servers, str(engines.model(name))
