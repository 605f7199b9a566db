"""perf/agentic_trace.py: sessions whose every turn is the previous turn plus new blocks."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perf import agentic_trace as at
from perf import trace_text as tt


def _chains(follows: list[tuple[int, float]]) -> list[list[int]]:
    """Sessions as lists of record indices, first turn first."""
    chains: dict[int, list[int]] = {}
    head_of: dict[int, int] = {}
    for i, (previous, _) in enumerate(follows):
        head = i if previous < 0 else head_of[previous]
        head_of[i] = head
        chains.setdefault(head, []).append(i)
    return list(chains.values())


@settings(max_examples=40, deadline=None)
@given(kinds=st.integers(1, 4), count=st.integers(1, 12), seed=st.integers(0, 10_000),
       turns=st.tuples(st.integers(1, 4), st.integers(0, 4)))
def test_each_turn_extends_the_previous_one(kinds: int, count: int, seed: int,
                                            turns: tuple[int, int]) -> None:
    shape = at.AgenticShape(kinds=kinds, sessions=count, system_tokens=2048, task_tokens=600,
                            turns=(turns[0], turns[0] + turns[1]), new_tokens=(1, 2000),
                            think_s=1.0, session_rate=2.0)
    records, follows = at.sessions(shape, seed)
    assert len(records) == len(follows)
    assert [r.timestamp_ms for r in records] == sorted(r.timestamp_ms for r in records)
    chains = _chains(follows)
    assert len(chains) == count
    for chain in chains:
        assert shape.turns[0] <= len(chain) <= shape.turns[1]
        assert follows[chain[0]] == (-1, 0.0)
        for before, after in itertools.pairwise(chain):
            assert follows[after][0] == before < after  # sent after its previous turn
            assert follows[after][1] >= 0.0
            old, new = records[before].hash_ids, records[after].hash_ids
            assert new[:len(old)] == old and 1 <= len(new) - len(old) <= 4  # 2000 tokens
    for r in records:  # whole blocks only: a turn's messages are the next turn's first ones
        assert r.input_length == len(r.hash_ids) * tt.TRACE_BLOCK
        assert shape.output_tokens[0] <= r.output_length <= shape.output_tokens[1]


def test_sessions_of_one_kind_share_the_system_prompt_and_nothing_else() -> None:
    shape = at.AgenticShape(kinds=3, sessions=9, system_tokens=4096, turns=(2, 3))
    records, follows = at.sessions(shape, seed=7)
    firsts = [records[chain[0]] for chain in _chains(follows)]
    systems = [r.hash_ids[:8] for r in firsts]  # 4,096 tokens: 8 blocks
    assert len(set(systems)) == 3
    tasks = [r.hash_ids[8:] for r in firsts]
    assert len(set(tasks)) == 9 and all(len(t) == 2 for t in tasks)  # 1,024 tokens each
    assert not {h for t in tasks for h in t} & {h for s in systems for h in s}


def test_ranges_are_checked() -> None:
    assert at.parse_range("512,4096") == (512, 4096)
    for bad in ("0,3", "5,4", "1"):
        with pytest.raises(ValueError):
            at.parse_range(bad)
