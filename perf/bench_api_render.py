"""What rendering an agent's turn costs per API: chat vs Anthropic Messages vs OpenAI Responses.

One coding-agent conversation (20 tool definitions, 80 tool-call rounds with code and JSON
outputs, ~100k characters: ~30k tokens) sent three ways — as an OpenAI chat body, as the
Anthropic Messages body and as the OpenAI Responses body that say the same — and rendered
with Qwen2.5's chat template (``engines/templates/qwen2.5.jinja``) by
``request_text.chat_prompt`` / ``messages_prompt`` / ``responses_prompt``. Measured: the whole
prompt build (conversion to vLLM's chat + template render), p50/p99 over ``--iterations``;
tokenization is not included (``bench_tokenize.py``). Checks that the three texts are equal.

    .venv/bin/python perf/bench_api_render.py [--iterations 300] [--rounds 80] [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cortex.profile.chat_template import ChatTemplate, ChatTemplates
from cortex.profile.request_text import (
    chat_prompt,
    messages_prompt,
    responses_prompt,
)
from perf.benchkit import machine_info, percentiles_us

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
    report = {"machine": machine_info(), "chars": len(texts["chat"]),
              "iterations": args.iterations}
    for name, (build, body) in cases.items():
        samples = []
        for _ in range(args.iterations):
            start = time.perf_counter_ns()
            build(body, templates)
            samples.append(time.perf_counter_ns() - start)
        report[name] = percentiles_us(samples)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
