"""An agentic multi-turn workload in Mooncake form: sessions that resend a growing context.

Coding agents and tool-using assistants send, every turn, their whole conversation so far: a
long system prompt with tool definitions shared by every session of the same agent, the task,
then each earlier turn's answer and tool output, then the new part. Between turns the agent
thinks (runs the tool, reads the answer): the next turn leaves only after the previous one's
answer has arrived, plus a think time.

``sessions(shape, seed)`` -> ``(records, follows)``:

* ``records``: one ``TraceRecord`` per turn (``trace_text`` turns its hash ids into one chat
  message per id). Session ``s`` of agent kind ``k`` (``s % kinds``) starts with kind ``k``'s
  ``system_tokens`` (whole 512-token blocks, the same ids for every session of that kind), then
  its own task; every later turn is the previous turn's ids plus new ones (``new_tokens``, drawn
  per turn from its range, in whole blocks). Every block is whole, so turn ``t``'s messages are
  exactly the first messages of turn ``t + 1``: a turn's prefix is the previous turn.
* ``follows[i]``: ``(previous, think_s)``: turn ``i`` is sent ``think_s`` after turn
  ``previous`` has been answered (``previous = -1``: a session's first turn, sent at its
  record's ``timestamp_ms``). ``timestamp_ms`` of a later turn is an estimate (the previous
  one's plus its think time, as if answers took no time): open-loop figures (the slice's span)
  read it, the replay's driver does not.

Records are ordered by their timestamps. Sessions arrive as a Poisson process
(``session_rate`` per second); think times are exponential with mean ``think_s``. Pure.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from perf.trace_text import TRACE_BLOCK, TraceRecord


@dataclass(frozen=True, slots=True)
class AgenticShape:
    kinds: int = 4  # agents whose sessions share a system prompt and tools
    sessions: int = 48
    system_tokens: int = 8192  # system prompt + tool definitions, per kind
    task_tokens: int = 1024  # a session's first user message
    turns: tuple[int, int] = (4, 12)  # turns per session, inclusive range
    new_tokens: tuple[int, int] = (512, 4096)  # added per later turn, inclusive range
    output_tokens: tuple[int, int] = (64, 512)
    think_s: float = 3.0  # mean think time between an answer and the next turn
    session_rate: float = 0.5  # sessions starting per second


def parse_range(text: str) -> tuple[int, int]:
    low, high = (int(v) for v in text.split(","))
    if not 0 < low <= high:
        raise ValueError(f"a range is 'low,high' with 0 < low <= high, not {text!r}")
    return low, high


def _blocks(tokens: int) -> int:
    return max(1, -(-tokens // TRACE_BLOCK))


def sessions(shape: AgenticShape, seed: int = 0) -> tuple[list[TraceRecord],
                                                         list[tuple[int, float]]]:
    rng = random.Random(seed)
    system_blocks = _blocks(shape.system_tokens)
    next_id = shape.kinds * system_blocks
    turns: list[tuple[float, int, int, TraceRecord, float]] = []  # time, session, turn, ...
    start = 0.0
    for session in range(shape.sessions):
        kind = session % shape.kinds
        ids = tuple(range(kind * system_blocks, (kind + 1) * system_blocks))
        grow = _blocks(shape.task_tokens)
        t = start
        think = 0.0
        for turn in range(rng.randint(*shape.turns)):
            if turn:
                grow = _blocks(rng.randint(*shape.new_tokens))
                think = rng.expovariate(1 / shape.think_s) if shape.think_s > 0 else 0.0
                t += think
            ids += tuple(range(next_id, next_id + grow))
            next_id += grow
            record = TraceRecord(int(t * 1000), len(ids) * TRACE_BLOCK,
                                 rng.randint(*shape.output_tokens), ids)
            turns.append((t, session, turn, record, think))
        start += rng.expovariate(shape.session_rate)
    turns.sort(key=lambda item: (item[0], item[1], item[2]))
    index = {(session, turn): i for i, (_, session, turn, _, _) in enumerate(turns)}
    follows = [(index[(session, turn - 1)] if turn else -1, think)
               for _, session, turn, _, think in turns]
    return [record for _, _, _, record, _ in turns], follows
