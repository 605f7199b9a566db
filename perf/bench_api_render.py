"""What rendering an agent's turn costs per API: chat vs Anthropic Messages vs OpenAI Responses.

One coding-agent conversation (20 tool definitions, 80 tool-call rounds with code and JSON
outputs, ~100k characters: ~30k tokens) sent three ways — as an OpenAI chat body, as the
Anthropic Messages body and as the OpenAI Responses body that say the same — and rendered
with Qwen2.5's chat template (``engines/templates/qwen2.5.jinja``) by
``request_text.chat_prompt`` / ``messages_prompt`` / ``responses_prompt``. Measured: the whole
prompt build (conversion to vLLM's chat + template render), p50/p99 over ``--iterations``,
each a freshly parsed body rendered whole (the template's render cache off); ``growing``: each
API's conversation grown one round at a time from half its rounds (an agent's turns), rendered
with the template's render cache (``cached``: only what is new) and without (``whole``),
interleaved, the texts checked equal. Tokenization is not included (``bench_tokenize.py``).
Checks that the three texts are equal.

    .venv/bin/python -m perf.bench_api_render [--iterations 300] [--rounds 80] [--quick]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from cortex.prompt.chat_template import ChatTemplate, ChatTemplates
from cortex.prompt.request_text import (
    chat_prompt,
    messages_prompt,
    responses_prompt,
)
from perf.benchkit import machine_info, percentiles_us

ROOT = Path(__file__).resolve().parent.parent

SYSTEM = "You are a coding agent working in a large repository. Follow the house rules. " * 40


def tool(i: int) -> dict:
    return {"name": f"tool_{i}", "description": f"Tool number {i}: does thing {i}. " * 8,
            "parameters": {"type": "object", "properties": {
                "path": {"type": "string", "description": "A file path in the repository"},
                "pattern": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["path"]}}


def conversation(rounds: int) -> tuple[dict, dict, dict]:
    tools = [tool(i) for i in range(20)]
    chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Fix the bug."}]
    responses = [{"role": "user", "content": "Fix the bug."}]
    turns = [{"role": "user", "content": "Fix the bug."}]
    for r in range(rounds):
        args = {"path": f"src/module_{r}.py", "pattern": "def handle", "limit": 40}
        output = f"def handle_{r}(request):\n    return {{'ok': True, 'n': {r}}}  # 处理\n" * 12
        call_id = f"call_{r}"
        chat += [{"role": "assistant", "content": f"Reading module {r}.", "tool_calls": [
                     {"id": call_id, "type": "function", "function": {
                         "name": f"tool_{r % 20}", "arguments": json.dumps(args)}}]},
                 {"role": "tool", "tool_call_id": call_id, "content": output}]
        turns += [{"role": "assistant", "content": [
                      {"type": "text", "text": f"Reading module {r}."},
                      {"type": "tool_use", "id": call_id, "name": f"tool_{r % 20}",
                       "input": args}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id,
                                                "content": output}]}]
        responses += [{"type": "message", "role": "assistant", "id": f"msg_{r}",
                       "status": "completed", "content": [
                           {"type": "output_text", "text": f"Reading module {r}.",
                            "annotations": []}]},
                      {"type": "function_call", "call_id": call_id, "name": f"tool_{r % 20}",
                       "arguments": json.dumps(args)},
                      {"type": "function_call_output", "call_id": call_id, "output": output}]
    chat_body = {"messages": chat, "tools": [{"type": "function", "function": t}
                                             for t in tools]}
    messages_body = {"system": SYSTEM, "messages": turns, "max_tokens": 64, "tools": [
        {"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
        for t in tools]}
    responses_body = {"instructions": SYSTEM, "input": responses,
                      "tools": [{"type": "function", **t} for t in tools]}
    return chat_body, messages_body, responses_body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=80)
    parser.add_argument("--quick", action="store_true", help="a smoke run (5 x 5)")
    args = parser.parse_args()
    if args.quick:
        args.iterations, args.rounds = 5, 5
    source = (ROOT / "engines" / "templates" / "qwen2.5.jinja").read_text()
    template = ChatTemplate(source, {"eos_token": "<|im_end|>"})
    templates = ChatTemplates(template, template)
    bodies = conversation(args.rounds)
    cases = {"chat": (chat_prompt, bodies[0]), "messages": (messages_prompt, bodies[1]),
             "responses": (responses_prompt, bodies[2])}
    texts = {name: build(body, templates).text for name, (build, body) in cases.items()}
    assert texts["chat"] == texts["messages"] == texts["responses"], "renderings differ"
    whole = ChatTemplate(source, {"eos_token": "<|im_end|>"})
    whole.cache = None  # rendered whole every time, as a template not shown local is
    wholes = ChatTemplates(whole, whole)
    report = {"machine": machine_info(), "chars": len(texts["chat"]),
              "iterations": args.iterations}
    for name, (build, body) in cases.items():
        samples = []
        for _ in range(args.iterations):
            start = time.perf_counter_ns()
            build(json.loads(json.dumps(body)), wholes)  # a parsed body's fresh objects
            samples.append(time.perf_counter_ns() - start)
        report[name] = percentiles_us(samples)
    report["growing"] = growing(args.rounds, cases, source, wholes)
    print(json.dumps(report, indent=2))


def growing(rounds: int, cases: dict, source: str, wholes: ChatTemplates) -> dict:
    """Each API's conversation grown one round at a time from half its rounds, every body
    built through the template with its render cache (a fresh one per API) and without one,
    interleaved."""
    out: dict[str, object] = {}
    for index, name in enumerate(cases):
        build = cases[name][0]
        template = ChatTemplate(source, {"eos_token": "<|im_end|>"})
        cached = ChatTemplates(template, template)
        samples: dict[str, list[int]] = {"whole": [], "cached": []}
        for grown in range(max(1, rounds // 2), rounds + 1):
            body = json.loads(json.dumps(conversation(grown)[index]))
            for mode, templates in (("whole", wholes), ("cached", cached)):
                start = time.perf_counter_ns()
                text = build(body, templates).text
                samples[mode].append(time.perf_counter_ns() - start)
            assert text == build(body, wholes).text
        out[name] = {**{mode: percentiles_us(values) for mode, values in samples.items()},
                     "renders": dict(template.cache.renders) if template.cache else None}
    return out


if __name__ == "__main__":
    main()
