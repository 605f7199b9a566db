"""An engine never serves the block holding a prompt's last token from its cache, so Cortex
never predicts it: for prompts of ``k·B - 1``, ``k·B`` and ``k·B + 1`` tokens sent twice, the
predicted ``x-cortex-cache-hit-tokens`` equals the ``cached_tokens`` each engine flavour reports
(the simulated engines model vLLM's and SGLang's rule; ``tests/real_engine`` checks vLLM's)."""

from __future__ import annotations

import json

import pytest

from tests.gateway_cluster import BLOCK, MODEL, gateway_cluster


@pytest.mark.parametrize("flavor", ["vllm-0.33", "sglang-0.5.23"])
async def test_a_block_aligned_prompt_is_predicted_one_block_short(flavor):
    async with gateway_cluster((flavor,)) as cluster:
        seen = []
        for index, length in enumerate((4 * BLOCK - 1, 4 * BLOCK, 4 * BLOCK + 1)):
            prompt = [1000 + 97 * index + i for i in range(length)]
            for _ in range(2):
                body = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
                response = await cluster.request("/v1/completions", body)
                assert response.status == 200
                reported = json.loads(response.body)["usage"]["prompt_tokens_details"][
                    "cached_tokens"]
                predicted = int(response.header(b"x-cortex-cache-hit-tokens"))
                seen.append((length, predicted, reported))
                # the engine's BlockStored applied before the prompt is sent again
                await cluster.until(lambda p=prompt: cluster.held(p).get("e0", 0)
                                    == (len(p) - 1) // BLOCK)
        assert [(n, p) for n, p, _ in seen[1::2]] == [
            (4 * BLOCK - 1, 3 * BLOCK), (4 * BLOCK, 3 * BLOCK), (4 * BLOCK + 1, 4 * BLOCK)]
        assert all(p == r for _, p, r in seen), seen


@pytest.mark.parametrize(("flavor", "path", "extra", "limit"), [
    ("vllm-0.33", "/v1/completions", {"prompt_logprobs": 1}, 0),
    ("vllm-0.33", "/v1/completions", {"echo": True, "logprobs": 0}, 0),
    ("sglang-0.5.23", "/v1/completions", {"echo": True, "logprobs": 1}, 0),
    ("sglang-0.5.23", "/generate", {"return_logprob": True, "logprob_start_len": 37}, 37),
])
async def test_prompt_logprobs_limit_what_is_read_from_the_cache(flavor, path, extra, limit):
    """vLLM reads nothing from its cache for a request with prompt logprobs; SGLang reads at
    most ``logprob_start_len`` tokens: the prediction follows, and the engine agrees."""
    async with gateway_cluster((flavor,)) as cluster:
        prompt = [3000 + i for i in range(5 * BLOCK)]
        field = "input_ids" if path == "/generate" else "prompt"
        plain = {"model": MODEL, field: prompt, "max_tokens": 1}
        assert (await cluster.request(path, plain)).status == 200
        await cluster.until(lambda: cluster.held(prompt).get("e0", 0) == 4)
        response = await cluster.request(path, {**plain, **extra})
        assert response.status == 200, response.body
        answer = json.loads(response.body)
        reported = (answer["meta_info"]["cached_tokens"] if path == "/generate"
                    else answer["usage"]["prompt_tokens_details"]["cached_tokens"])
        predicted = int(response.header(b"x-cortex-cache-hit-tokens"))
        assert predicted == reported == limit // BLOCK * BLOCK


@pytest.mark.parametrize("flavor", ["sglang-0.5.23", "sglang-0.5.15"])
async def test_sglang_at_page_size_one_is_predicted_to_the_block_below_its_report(flavor):
    """SGLang's default page size of 1 behind Cortex at 16: its per-token events are folded, the
    worker is not held to disagree with the profile, and every prediction is the engine's
    report rounded down to Cortex's block (conversations that extend and diverge from each
    other, on two engines, with a cache small enough to evict)."""
    async with gateway_cluster((flavor, flavor), engine_block_size=1,
                               capacity_blocks=40 * BLOCK) as cluster:
        assert cluster.running.pools[MODEL].exact_off is None
        base = [5000 + i for i in range(3 * BLOCK + 5)]
        prompts = [base, base + [7] * 9, base + [7] * 9 + [8] * 20, base[:20] + [9] * 30,
                   [6000 + i for i in range(30 * BLOCK)], base + [7] * 9 + [8] * 20]
        seen = []
        for prompt in prompts * 2:
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
            response = await cluster.request("/v1/completions", body)
            assert response.status == 200
            reported = json.loads(response.body)["usage"]["prompt_tokens_details"]["cached_tokens"]
            predicted = int(response.header(b"x-cortex-cache-hit-tokens"))
            seen.append((len(prompt), predicted, reported))
            worker = response.header(b"x-cortex-assigned-worker").decode()
            engine = next(e for e in cluster.engines if e.name == worker)
            # the answer's stores applied before the next prompt: Cortex credits the worker
            # with the whole blocks of what the engine holds of it, short of the last token's
            await cluster.until(lambda p=prompt, w=worker, e=engine: cluster.held(p).get(w, 0)
                                == min((len(p) - 1) // BLOCK, _held_tokens(e, p) // BLOCK))
        assert all(p == r // BLOCK * BLOCK for _, p, r in seen), seen
        assert sum(p for _, p, _ in seen) > 0


def _held_tokens(engine, prompt) -> int:
    """Leading tokens of ``prompt`` a page-size-1 simulated engine holds now."""
    truth = engine.kv.truth(0)
    held = 0
    while held < len(prompt) and (None, None, tuple(prompt[: held + 1])) in truth:
        held += 1
    return held
