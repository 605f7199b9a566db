"""``dump_toml`` writes valid TOML that loads back to the same tree, whatever the strings hold."""

from __future__ import annotations

import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cortex.config import (
    ControlConfig,
    CortexConfig,
    ModelConfig,
    SchedulerConfig,
    dump_toml,
    load_config,
)
from cortex.scheduling.cost import BoundedLoad, CostConfig
from cortex.scheduling.view import Role
from cortex.workers.spec import WorkerSpec

# any text TOML can hold (lone surrogates cannot be written in UTF-8 at all)
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
SOME_TEXT = TEXT.filter(bool)  # "" spells None for an optional string
NAME_TEXT = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=12)
SECONDS = st.floats(min_value=0.0, allow_nan=False, allow_infinity=True)

models = st.builds(
    ModelConfig, name=SOME_TEXT, tokenizer=SOME_TEXT, block_size=st.integers(1, 1 << 16),
    chat_template=st.none() | SOME_TEXT, bos_token=st.none() | SOME_TEXT,
    eos_token=st.none() | SOME_TEXT, version=TEXT, passthrough=st.booleans(),
    segment_cache_bytes=st.integers(0, 1 << 40))


@st.composite
def workers(draw, index: int) -> WorkerSpec:
    port = draw(st.integers(1, 60000))  # room for a DP rank offset on the event ports
    events = draw(st.none() | st.just(f"tcp://10.0.0.{index}:{port}"))
    return WorkerSpec(
        name=f"w{index}-{draw(NAME_TEXT)}", url=f"http://10.0.0.{index}:{port}",
        engine=draw(st.sampled_from(["vllm", "sglang"])), role=draw(st.sampled_from(Role)),
        dp_size=draw(st.integers(1, 64)), events=events,
        replay=None if events is None else draw(st.none() | st.just(f"tcp://10.1.0.{index}:{port}")),
        topic=draw(TEXT), bootstrap_port=draw(st.none() | st.integers(1, 65535)),
        weight=draw(st.floats(min_value=1e-9, max_value=1e6)))


@st.composite
def configs(draw) -> CortexConfig:
    token = draw(st.none() | SOME_TEXT.filter(lambda t: t == t.strip()))
    count = draw(st.integers(0, 3))
    return CortexConfig(
        control=ControlConfig(admin_token=token),
        models=tuple(draw(st.lists(models, max_size=3, unique_by=lambda m: m.name))),
        workers=tuple(draw(workers(index)) for index in range(count)),
        scheduler=draw(st.builds(
            lambda cost, factor, seed: SchedulerConfig(
                cost=cost, bounds=BoundedLoad(factor=factor), seed=seed),
            st.builds(CostConfig, form=st.sampled_from(["ttft", "linear"]),
                      affinity_tolerance_s=SECONDS, decode_s_per_in_flight=SECONDS),
            st.none() | st.floats(min_value=1e-6, max_value=1e6),
            st.none() | st.integers(-(1 << 63), 1 << 63))))


@pytest.fixture(scope="module")
def config_file(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("emit") / "config.toml")


@settings(max_examples=60, deadline=None)
@given(config=configs())
def test_dump_toml_loads_back_equal(config_file, config):
    with open(config_file, "w", encoding="utf-8") as handle:
        handle.write(dump_toml(config, mask_secrets=False))
    assert load_config(env={}, path=config_file) == config
    commented = dump_toml(config, mask_secrets=False, comments=True)
    assert tomllib.loads(commented) == tomllib.loads(dump_toml(config, mask_secrets=False))
