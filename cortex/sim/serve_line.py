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

from cortex.config.tree import ModelConfig


def model_flag(model: ModelConfig) -> str:
    """``--model``'s value for ``model`` (the fields the engines were given, paths absolute)."""
    fields = [model.name]
    if model.builtin is not None:
        fields.append(f"builtin={model.builtin}")
    if model.tokenizer is not None:
        fields.append(f"tokenizer={os.path.abspath(model.tokenizer)}")
    fields.append(f"block_size={model.block_size}")
    if model.chat_template is not None:
        fields.append(f"chat_template={os.path.abspath(model.chat_template)}")
    if model.add_bos is not None:
        fields.append(f"add_bos={'true' if model.add_bos else 'false'}")
    if model.bos_token is not None:
        fields.append(f"bos_token={model.bos_token}")
    if model.eos_token is not None:
        fields.append(f"eos_token={model.eos_token}")
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


def serve_line(model: ModelConfig, engines: Iterable) -> str:  # Iterable[SimEngine], running
    """``cortex serve --model ... --worker ... --worker ...``, shell-quoted, on one line."""
    argv = ["cortex", "serve", "--model", model_flag(model)]
    for engine in engines:
        argv += ["--worker", worker_spec(engine)]
    return shlex.join(argv)
