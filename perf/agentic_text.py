"""Text of agentic traffic for the tokenization benchmarks: English prose, Chinese (with the
English terms, numbers and punctuation Chinese technical text carries), source code (slices of
this repository's own Python files: real code, not a template of it), JSON tool output, tool
definitions, and chats built from them in the OpenAI message shape.

Deterministic per ``random.Random`` seed. Every generated text is unique with overwhelming
probability (random word sequences), so a benchmark's "new" text is really new to a cache.
"""

from __future__ import annotations

import json
import os
import random

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_EN = (
    "the of and to in a is that for it as was with be by on not this are or from at which but "
    "have an they you were all there would their we been has when who will more no if out so "
    "what up its about into than them can only other new some could time these two may then do "
    "first any my now such like our over even most cache token router engine prefix latency "
    "worker block request model prompt kernel memory function return value error config server "
    "client stream batch queue schedule throughput session context agent tool result file path "
    "test build commit branch merge review change line module import class method argument"
)
EN_WORDS = _EN.split()
EN_PUNCT = (".", ",", "?", ":", ";", "\n", "\n\n", " (", ")", " 42", " 2025", " `x`", " - ")

_ZH = (
    "我们 需要 这个 项目 实现 一个 新的 缓存 策略 以便 在 长 上下文 情况 下 减少 重复 计算 请 检查 "
    "路由器 配置 文件 并 确认 每个 工作 节点 都 报告 了 正确 的 页面 大小 模型 推理 服务 请求 延迟 "
    "吞吐量 用户 会话 工具 调用 结果 返回 错误 日志 函数 参数 测试 代码 修改 提交 分支 合并 审查 "
    "问题 原因 解决 方案 性能 内存 数据 结构 算法 网络 连接 超时 重试 队列 调度 负载 均衡 前缀 "
    "命中率 分词 编码 解码 中文 英文 混合 文本 输出 输入 格式 字段 类型 数组 对象 字符串 数字 "
    "如果 那么 因为 所以 但是 而且 或者 已经 正在 可以 应该 必须 不能 没有 仍然 只是 还是 然后 "
    "首先 其次 最后 总之 例如 比如 关于 对于 通过 根据 按照 由于 为了 除了 之后 之前 同时 目前"
)
ZH_WORDS = _ZH.split()
ZH_PUNCT = ("，", "。", "！", "？", "：", "；", "、", "“", "”", "（", "）", "\n", "\n\n")
ZH_LATIN = ("vLLM", "SGLang", "KV cache", "GPU", "API", "JSON", "Python", "token", "p99", "HTTP",
            "32k", "2048", "3.5", "100ms", "ZeroMQ", "Cortex")


def english(rng: random.Random, words: int) -> str:
    out = []
    for _ in range(words):
        out.append(rng.choice(EN_WORDS))
        if rng.random() < 0.12:
            out[-1] += rng.choice(EN_PUNCT)
    return " ".join(out).capitalize() + "."


def chinese(rng: random.Random, words: int) -> str:
    """Chinese prose with a few English terms and numbers, as Chinese technical text has."""
    out: list[str] = []
    for _ in range(words):
        if rng.random() < 0.04:
            out.append(" " + rng.choice(ZH_LATIN) + " ")
        else:
            out.append(rng.choice(ZH_WORDS))
        if rng.random() < 0.12:
            out.append(rng.choice(ZH_PUNCT))
    return "".join(out) + "。"


_SOURCES: list[str] = []


def _sources() -> list[str]:
    if not _SOURCES:
        for base in ("cortex", "perf", "tests"):
            for dirpath, _, names in sorted(os.walk(os.path.join(ROOT, base))):
                for name in sorted(names):
                    if name.endswith(".py"):
                        with open(os.path.join(dirpath, name), encoding="utf-8") as f:
                            text = f.read()
                        if len(text) > 2000:
                            _SOURCES.append(text)
    return _SOURCES


def code(rng: random.Random, chars: int) -> str:
    """About ``chars`` characters of real Python source: whole lines from random places of this
    repository's files (a fenced block, as an assistant writes code)."""
    parts: list[str] = []
    total = 0
    sources = _sources()
    while total < chars:
        text = rng.choice(sources)
        start = text.find("\n", rng.randrange(len(text) - 1000)) + 1
        end = text.find("\n", start + min(chars - total, 1500))
        piece = text[start:end if end > 0 else len(text)]
        parts.append(piece)
        total += len(piece)
    return "```python\n" + "\n".join(parts) + "\n```"


def json_output(rng: random.Random, entries: int) -> str:
    """A tool's JSON result: a search over files, with paths, line numbers and snippets."""
    rows = []
    for _ in range(entries):
        rows.append({
            "path": "/".join(rng.choice(EN_WORDS) for _ in range(rng.randint(2, 4))) + ".py",
            "line": rng.randint(1, 4000),
            "score": round(rng.random(), 4),
            "snippet": english(rng, rng.randint(6, 16)),
        })
    return json.dumps({"matches": rows, "truncated": False, "took_ms": rng.randint(1, 900)},
                      indent=2)


def tools(rng: random.Random, count: int) -> list[dict[str, object]]:
    """OpenAI-shaped tool definitions with long descriptions (what coding agents send)."""
    out = []
    for i in range(count):
        props = {
            f"{rng.choice(EN_WORDS)}_{j}": {"type": rng.choice(["string", "integer", "boolean"]),
                                           "description": english(rng, rng.randint(10, 30))}
            for j in range(rng.randint(2, 6))
        }
        out.append({"type": "function", "function": {
            "name": f"{rng.choice(EN_WORDS)}_{rng.choice(EN_WORDS)}_{i}",
            "description": english(rng, rng.randint(60, 160)),
            "parameters": {"type": "object", "properties": props, "required": list(props)[:1]},
        }})
    return out


KINDS = ("english", "chinese", "code")


def message_of(kind: str, rng: random.Random, tokens: int) -> str:
    """About ``tokens`` tokens of ``kind`` (calibrated for DeepSeek/Qwen-sized vocabularies)."""
    if kind == "english":
        return english(rng, int(tokens * 0.86))
    if kind == "chinese":
        return chinese(rng, int(tokens * 0.75))
    if kind == "code":
        return code(rng, int(tokens * 3.9))
    if kind == "json":
        return json_output(rng, max(1, tokens // 40))
    raise ValueError(kind)


def agentic_chat(rng: random.Random, target_chars: int, system_words: int = 1500,
                 tool_count: int = 24) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """``(messages, tools)``: a long system prompt, then turns of a coding agent — a user ask
    (English or Chinese), an assistant answer with code, a tool result (JSON) — until the
    messages hold ``target_chars`` characters. Tool results are ``user`` messages (every chat
    template takes them)."""
    messages: list[dict[str, object]] = [{"role": "system", "content": english(rng, system_words)}]
    total = len(messages[0]["content"])  # type: ignore[arg-type]
    turn = 0
    while total < target_chars:
        ask = english(rng, 120) if turn % 2 == 0 else chinese(rng, 90)
        answer = english(rng, 60) + "\n\n" + code(rng, 1800)
        result = "Tool result:\n" + json_output(rng, 12)
        for role, content in (("user", ask), ("assistant", answer), ("user", result)):
            messages.append({"role": role, "content": content})
            total += len(content)
        turn += 1
    return messages, tools(rng, tool_count)
