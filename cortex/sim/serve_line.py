"""The ``cortex serve`` command line that puts Cortex in front of running simulated engines.

``cortex sim`` prints it once every engine listens, ready to paste: one ``--model`` naming the
profile the engines serve and one ``--worker`` per engine. Rules:

* The model spec names the same profile files the engines loaded, so that Cortex renders and
  tokenizes every prompt as they do: ``builtin=NAME`` when the engines use a built-in profile
  (``cortex.profile.builtin``), else ``tokenizer=PATH``; then ``block_size``, and
  ``chat_template`` / ``add_bos`` / ``bos_token`` / ``eos_token`` when the engines were given
  them (otherwise both sides read the same defaults from the same files). Paths are absolute.
* A worker spec carries the engine's name, URL and engine family, its DP size when above 1,
  rank 0's event and replay endpoints (``events=tcp://...``, ``replay=tcp://...``: rank ``r``
  is port + r on both), its topic when set, and its PD role (``bootstrap_port`` for a
  prefill engine that listens for KV fetches).
* Every argument is shell-quoted (special tokens such as ``<｜begin▁of▁sentence｜>`` hold
  characters a shell reads); the line is one line.

Pure apart from making paths absolute (the current directory): it reads the engines' attributes.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ServedModel:
    """The profile the engines serve, as ``cortex serve --model`` names it."""

    name: str
    block_size: int
    builtin: str | None = None
    tokenizer: str | None = None
    chat_template: str | None = None
    add_bos: bool | None = None
    bos_token: str | None = None
    eos_token: str | None = None

    def spec(self) -> str:
        fields = [self.name]
        if self.builtin is not None:
            fields.append(f"builtin={self.builtin}")
        if self.tokenizer is not None:
            fields.append(f"tokenizer={os.path.abspath(self.tokenizer)}")
        fields.append(f"block_size={self.block_size}")
        if self.chat_template is not None:
            fields.append(f"chat_template={os.path.abspath(self.chat_template)}")
        if self.add_bos is not None:
            fields.append(f"add_bos={'true' if self.add_bos else 'false'}")
        if self.bos_token is not None:
            fields.append(f"bos_token={self.bos_token}")
        if self.eos_token is not None:
            fields.append(f"eos_token={self.eos_token}")
        return ",".join(fields)


def worker_spec(engine) -> str:
    """``URL,name=...,engine=...,events=...,replay=...`` for one running engine."""
    fields = [engine.url, f"name={engine.name}", f"engine={engine.wire.family.value}"]
    if engine.dp_size > 1:
        fields.append(f"dp_size={engine.dp_size}")
    endpoints = engine.kv.endpoints(0)
    fields.append(f"events={endpoints.pub}")
    if endpoints.replay is not None:
        fields.append(f"replay={endpoints.replay}")
    if engine.kv.topic:
        fields.append(f"topic={engine.kv.topic}")
    if engine.pd is not None:
        fields.append(f"role={engine.pd.role}")
        if engine.pd.listens:
            fields.append(f"bootstrap_port={engine.pd.bootstrap_port}")
    return ",".join(fields)


def serve_line(model: ServedModel, engines: Iterable) -> str:  # Iterable[SimEngine], running
    """``cortex serve --model ... --worker ... --worker ...``, shell-quoted, on one line."""
    argv = ["cortex", "serve", "--model", model.spec()]
    for engine in engines:
        argv += ["--worker", worker_spec(engine)]
    return shlex.join(argv)
