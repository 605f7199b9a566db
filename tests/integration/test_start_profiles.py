"""A model whose profile cannot be loaded: the start stops with the reason, unless the model is
marked ``required = false`` — then Cortex starts, routes it by load only, and says so loudly
(issue 22 §10: it used to start silently and report ready)."""

from __future__ import annotations

import logging

import pytest
import trio

from cortex.app import run_gateway
from cortex.config import ControlConfig, CortexConfig, ModelConfig, ServerConfig
from cortex.errors import ConfigError


def config(tmp_path, required: bool) -> CortexConfig:
    model = ModelConfig(name="m", tokenizer=str(tmp_path / "gone.json"), block_size=16,
                        required=required)
    return CortexConfig(server=ServerConfig(host="127.0.0.1", port=0),
                        control=ControlConfig(host="127.0.0.1", port=0), models=(model,))


async def test_a_required_profile_that_cannot_load_stops_the_start(tmp_path):
    with pytest.RaisesGroup(ConfigError, flatten_subgroups=True) as raised:
        async with trio.open_nursery() as nursery:
            await nursery.start(run_gateway, config(tmp_path, required=True))
    assert "gone.json" in str(raised.value.exceptions[0])


async def test_an_optional_one_starts_degraded_and_says_so(tmp_path, caplog):
    caplog.set_level(logging.ERROR, logger="cortex")
    async with trio.open_nursery() as nursery:
        running = await nursery.start(run_gateway, config(tmp_path, required=False))
        assert running.pools["m"].exact_off is not None
        nursery.cancel_scope.cancel()
    assert "model m: profile not loaded, routed by load only" in caplog.text


async def test_a_prompt_too_long_to_tokenize_cheaply_is_routed_by_load_and_counted():
    """Issue 22 §6: one 10 MB chat cost 10.6 s of CPU; past ``max_prompt_chars`` the prompt is
    not tokenized: routed by load (a miss at worst, never a guessed hit), counted."""
    from tests.gateway_cluster import gateway_cluster

    async with gateway_cluster(("vllm-0.33",)) as cluster:
        cluster.running.pools["deepseek"].max_prompt_chars = 2000
        short = await cluster.chat([{"role": "user", "content": "short"}])
        assert short.status == 200
        long = await cluster.chat([{"role": "user", "content": "word " * 1000}])
        assert long.status == 200
        assert long.header(b"x-cortex-cache-hit-tokens") == b"0"
        text = cluster.running.metrics.render().decode()
        assert 'cortex_unpredicted_total{model="deepseek",reason="prompt_too_long"} 1' in text
