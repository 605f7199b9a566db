"""The tokenize pool (``cortex.profile.tokenize_pool``) with real spawned processes: the ids
equal one plain encode (code, Chinese, English), the segment cache is fed as with a thread,
a model the processes did not load (or loaded with another fingerprint) and a process that
died fall back (counted), and the pool recovers with a new process. (A process that dies
between jobs, or while a job is being written to it, is replaced by ``trio_parallel``
without the caller noticing.)"""

from __future__ import annotations

import multiprocessing

import pytest
import trio
import trio.testing

from cortex.errors import ConfigError
from cortex.profile import trio_tokenize
from cortex.profile.model_profile import ProfileSpec, load_profile
from cortex.profile.segment_cache import SegmentCachedTokenizer
from cortex.profile.segments import Segmenter
from cortex.profile.tokenize_pool import TokenizePool
from tests import deepseek_profile as ds

TOK = ds.tokenizer()
SEG = Segmenter.from_tokenizer_json(ds.tokenizer_json_bytes())
SPEC = ProfileSpec("m", None, 16, builtin="deepseek")
FINGERPRINT = {"m": load_profile(SPEC).fingerprint}
PIECES = [
    "def encode(self, text: str) -> list[int]:\n    return self._ids[text]  # 缓存\n" * 40,
    "分词器把文本切成词元，前缀缓存按块保存。" * 60,
    "Plain English words, the ASCII fast path's kind of text. " * 50,
]


def plain(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False).ids


def pool_processes() -> list[multiprocessing.Process]:
    return [p for p in multiprocessing.active_children() if "trio-parallel" in p.name]


async def test_pool_ids_equal_one_plain_encode_and_feed_the_segment_cache():
    async with trio.open_nursery() as nursery:
        pool: TokenizePool = await nursery.start(TokenizePool([SPEC], FINGERPRINT, 1).run)
        assert pool.models == {"m"} and len(pool_processes()) == 1
        ids = await pool.encode("m", PIECES)
        assert ids is not None and [list(piece) for piece in ids] == [plain(p) for p in PIECES]

        cache = SegmentCachedTokenizer(TOK, SEG, bos_id=0)
        text = f"{ds.BOS}{PIECES[0]}<｜User｜>{PIECES[1]}<｜Assistant｜>"
        got = await trio_tokenize.encode_array(cache, text, True, offload_min_chars=0,
                                               pool=pool, model="m")
        assert got.tolist() == [0, *plain(text)] and pool.jobs == 2 and cache.misses == 2
        again = cache.encode_now(text, False, 0)  # every piece cached: no job
        assert again.tolist() == plain(text) and pool.jobs == 2
        nursery.cancel_scope.cancel()
    assert not pool_processes()  # stopped with the gateway


async def test_unknown_model_and_dead_process_fall_back_to_a_thread():
    async with trio.open_nursery() as nursery:
        pool: TokenizePool = await nursery.start(TokenizePool([SPEC], FINGERPRINT, 1).run)
        assert await pool.encode("other", PIECES[:1]) is None and pool.fallbacks == 0
        cache = SegmentCachedTokenizer(TOK, SEG)
        ids = await trio_tokenize.encode_array(cache, PIECES[1], offload_min_chars=0,
                                               pool=pool, model="other")
        assert ids.tolist() == plain(PIECES[1]) and pool.jobs == 0  # a thread did it

        (idle,) = pool_processes()
        idle.kill()  # died between jobs: replaced by a new process, loaded again
        idle.join()
        ids = await pool.encode("m", PIECES[2:])
        assert ids is not None and list(ids[0]) == plain(PIECES[2]) and pool.fallbacks == 0

        answers: list[object] = []

        async def encode_long() -> None:
            # ~54 KB (the whole job fits in the pipe's buffer), ~40 ms of work
            answers.append(await pool.encode("m", [PIECES[1] * 15]))

        nursery.start_soon(encode_long)
        await trio.testing.wait_all_tasks_blocked()  # the job is sent: the answer awaited
        (busy,) = pool_processes()
        assert busy is not idle
        busy.kill()  # died in a job: that request falls back, counted
        with trio.fail_after(30):
            while not answers:
                await trio.testing.wait_all_tasks_blocked()
        assert answers == [None] and pool.fallbacks == 1
        ids = await pool.encode("m", PIECES[1:2])
        assert ids is not None and list(ids[0]) == plain(PIECES[1])

        pool.fingerprints["m"] = "another profile"  # as a process loading changed files sees
        assert await pool.encode("m", PIECES[1:2]) is None and pool.fallbacks == 2
        nursery.cancel_scope.cancel()


async def test_a_model_whose_processes_load_another_profile_is_not_pooled():
    async with trio.open_nursery() as nursery:
        pool: TokenizePool = await nursery.start(
            TokenizePool([SPEC], {"m": "the gateway's profile is another"}, 1).run)
        assert pool.models == frozenset()
        assert await pool.encode("m", PIECES[:1]) is None and pool.jobs == 0
        nursery.cancel_scope.cancel()


async def test_a_process_that_cannot_start_stops_the_start_with_the_reason():
    broken = ProfileSpec("m", 123, 16)  # type: ignore[arg-type]  # load_profile: TypeError
    with pytest.raises(BaseExceptionGroup) as raised:
        async with trio.open_nursery() as nursery:
            await nursery.start(TokenizePool([broken], {"m": "x"}, 1).run)
    ours, rest = raised.value.split(ConfigError)
    assert rest is None and ours is not None
    while isinstance(ours, BaseExceptionGroup):
        (ours,) = ours.exceptions
    assert ours.problems == ["server.tokenize_processes: a tokenizer process did not start "
                             "(exit code 1; its error is on stderr)"]
    assert not pool_processes()
