"""The session's vLLM servers, shared between tests by the set they form.

A test asks for a ``ServerSet`` (tokenizer family, count, cache size, prefix caching) and gets
it running: started side by side if needed (a vLLM start is ~40-120 s here), shared with every
later test asking for the same set, and stopped when sets beyond ``MAX_ALIVE`` servers are
needed (~3.5 GiB each), least recently used first. A test that kills a server restarts it
before it ends; the farm also restarts any server of a set it finds not running.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.real_engine.vllm_server import EngineEnv, VllmOptions, VllmServer, start_all

# what vLLM needs to take tool requests for a model (Qwen2.5 writes Hermes-style tool calls)
SERVE_ARGS = {"deepseek-tiny": (),
              "qwen-tiny": ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")}
MAX_ALIVE = 4


@dataclass(frozen=True)
class ServerSet:
    family: str  # deepseek-tiny | qwen-tiny
    count: int = 2
    num_blocks: int | None = None  # a cache small enough to evict
    prefix_caching: bool = True
    extra_args: tuple[str, ...] = ()  # more server arguments (scheduler caps, say)

    @property
    def label(self) -> str:
        size = "" if self.num_blocks is None else f"-{self.num_blocks}b"
        caching = "" if self.prefix_caching else "-nocache"
        extra = "-x" if self.extra_args else ""
        return f"{self.family}{size}{caching}{extra}"


class VllmFarm:
    def __init__(self, env: EngineEnv, logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.sets: dict[ServerSet, list[VllmServer]] = {}

    def servers(self, wanted: ServerSet) -> list[VllmServer]:
        servers = self.sets.pop(wanted, None)
        if servers is None:
            options = VllmOptions(self.env.model(wanted.family), wanted.family,
                                  num_blocks=wanted.num_blocks,
                                  prefix_caching=wanted.prefix_caching,
                                  extra_args=SERVE_ARGS[wanted.family] + wanted.extra_args)
            servers = [VllmServer(f"{wanted.label}-{i}", options, self.env, self.logs)
                       for i in range(wanted.count)]
        self._make_room(len(servers))
        self.sets[wanted] = servers  # most recently used last
        down = [server for server in servers if server.process is None]
        if down:
            start_all(down)
        return servers

    def _make_room(self, needed: int) -> None:
        """Stop the least recently used sets until ``needed`` more servers fit."""
        while self.sets and sum(map(len, self.sets.values())) + needed > MAX_ALIVE:
            for server in self.sets.pop(next(iter(self.sets))):
                server.stop()

    def stop_all(self) -> None:
        for servers in self.sets.values():
            for server in servers:
                server.stop()
        self.sets.clear()
