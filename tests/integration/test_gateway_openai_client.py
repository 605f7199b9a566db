"""The official ``openai`` Python client against Cortex (over simulated engines): chat and
completions, streaming and not. The client is synchronous (httpx), so it runs in a thread."""

from __future__ import annotations

import openai
import trio

from tests.gateway_cluster import MODEL, SYSTEM_TEXT, gateway_cluster


def use_client(port: int) -> dict[str, object]:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                           max_retries=0, timeout=30)
    messages = [{"role": "system", "content": SYSTEM_TEXT},
                {"role": "user", "content": "Say something."}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5)
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages,
                                                           max_tokens=5)
    chat_stream = list(client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=5, stream=True,
        stream_options={"include_usage": True}))
    completion = client.completions.create(model=MODEL, prompt="Once upon a time",
                                           max_tokens=4)
    token_prompt = client.completions.create(model=MODEL, prompt=list(range(100, 180)),
                                             max_tokens=4)
    completion_stream = list(client.completions.create(model=MODEL, prompt="Hello there",
                                                       max_tokens=4, stream=True))
    return {"chat": chat, "raw_headers": dict(raw.headers), "chat_stream": chat_stream,
            "completion": completion, "token_prompt": token_prompt,
            "completion_stream": completion_stream}


async def test_openai_client_chat_and_completions_streaming_and_not():
    async with gateway_cluster(("vllm-0.33", "sglang-0.5.23")) as cluster:
        seen = await trio.to_thread.run_sync(use_client, cluster.port)
    chat = seen["chat"]
    assert chat.choices[0].message.content
    assert chat.usage.prompt_tokens > 200
    headers = seen["raw_headers"]
    assert headers["x-cortex-match-mode"] == "exact_kv_events"  # the first call cached it
    assert int(headers["x-cortex-cache-hit-tokens"]) > 0
    stream = seen["chat_stream"]
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert stream[-1].usage is not None and stream[-1].usage.completion_tokens == 5
    assert seen["completion"].choices[0].text
    assert seen["token_prompt"].usage.prompt_tokens == 80
    assert "".join(c.choices[0].text for c in seen["completion_stream"] if c.choices)
