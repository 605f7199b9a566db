"""``cortex._fast.word_ids.WordIds``: the fast encoder's word cache as a C table."""

from __future__ import annotations

import pytest

from cortex._fast.word_ids import WordIds


def test_put_then_get_gives_the_ids_back():
    table = WordIds(8, 16)
    assert table.get("hello") is None
    assert table.put("hello", [15043])
    assert table.put(" world", (1917, 2, 2**32 - 1))
    assert table.get("hello") == (15043,)
    assert table.get(" world") == (1917, 2, 2**32 - 1)
    assert table.get("hell") is None and table.get("hello!") is None
    assert len(table) == 2


def test_a_word_keeps_its_first_ids():
    table = WordIds(8, 16)
    assert table.put("a", [1])
    assert table.put("a", [2])  # already held: values are deterministic per word
    assert table.get("a") == (1,) and len(table) == 1


def test_what_it_does_not_keep():
    table = WordIds(8, 4)
    assert not table.put("", [1])
    assert not table.put("toolong", [1])  # more than max_word_chars characters
    assert not table.put("ab", [1, 2, 3, 4, 5])  # more ids than max_word_chars
    assert not table.put("café", [1])  # not ASCII
    assert table.get("café") is None
    assert len(table) == 0
    with pytest.raises(OverflowError):
        table.put("x", [-1])
    with pytest.raises(OverflowError):
        table.put("x", [2**32])
    assert table.get("x") is None and len(table) == 0


def test_full_means_cleared_then_kept():
    table = WordIds(3, 8)
    for index, word in enumerate(["a", "b", "c"]):
        assert table.put(word, [index])
    assert len(table) == 3
    assert table.put("d", [9])
    assert len(table) == 1 and table.get("d") == (9,) and table.get("a") is None


def test_many_words_near_and_far_through_growth():
    # words of 2..48 bytes with 1..5 ids: held in their slot (<= 12 bytes, <= 3 ids) or in the
    # arenas, through every doubling of the slots and of both arenas
    table = WordIds(50_000, 64)
    words = [f"w{i}" * (1 + i % 7) for i in range(40_000)]
    for index, word in enumerate(words):
        assert table.put(word, list(range(index % 5, index % 5 + 1 + index % 5)))
    assert len(table) == 40_000
    for index, word in enumerate(words):
        assert table.get(word) == tuple(range(index % 5, index % 5 + 1 + index % 5))
    assert table.memory_bytes > 0
    table.clear()
    assert len(table) == 0 and table.get(words[0]) is None


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError):
        WordIds(0, 8)
    with pytest.raises(ValueError):
        WordIds(8, 0)
    with pytest.raises(ValueError):
        WordIds(8, 70_000)
    with pytest.raises(ValueError):
        WordIds(1 << 20, 4096)
