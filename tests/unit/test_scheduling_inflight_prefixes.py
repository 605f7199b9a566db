"""``InflightPrefixes``: the prompt blocks of requests in flight per target, and how far they
extend a ledger's match. Held against a brute-force model (every recorded request's keys,
looked up one by one) on random add/remove/extend sequences."""

from __future__ import annotations

from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from cortex.scheduling.inflight import PendingWork
from cortex.scheduling.inflight_prefixes import InflightPrefixes


def chain(prefix: int, length: int) -> array:
    """Prefix-chained keys: the key of block i names blocks 0..i of group ``prefix``."""
    return array("Q", [prefix * 1000 + i for i in range(length)])


def brute_extend(records: dict[int, tuple[int, array, int]], keys: array,
                 matched: dict[int, int]) -> dict[int, int]:
    out = dict(matched)
    for target in {t for t, _, _ in records.values()}:
        carried = {k for t, ks, start in records.values() if t == target for k in ks[start:]}
        depth = start = out.get(target, 0)
        while depth < len(keys) and keys[depth] in carried:
            depth += 1
        if depth > start:
            out[target] = depth
    return out


operations = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 3), st.integers(0, 4), st.integers(1, 12),
              st.integers(0, 6)),
    st.tuples(st.just("remove"), st.integers(0, 40)),
    st.tuples(st.just("extend"), st.integers(0, 4), st.integers(1, 14),
              st.dictionaries(st.integers(0, 3), st.integers(0, 5), max_size=3)),
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_extend_equals_the_brute_force_model(ops):
    prefixes = InflightPrefixes()
    records: dict[int, tuple[int, array, int]] = {}
    tickets: list[int] = []
    for op in ops:
        if op[0] == "add":
            _, target, group, length, start = op
            keys = chain(group, length)
            ticket = prefixes.add(target, keys, min(start, length))
            records[ticket] = (target, keys, min(start, length))
            tickets.append(ticket)
        elif op[0] == "remove" and tickets:
            ticket = tickets.pop(op[1] % len(tickets))
            prefixes.remove(ticket)
            prefixes.remove(ticket)  # a second remove does nothing
            records.pop(ticket)
        elif op[0] == "extend":
            _, group, length, matched = op
            keys = chain(group, length)
            matched = {t: min(d, length) for t, d in matched.items()}
            expected = brute_extend(records, keys, matched)
            before = dict(matched)
            raised = prefixes.extend(keys, matched)
            assert matched == expected
            assert dict(raised) == {t: before.get(t, 0) for t, depth in expected.items()
                                    if depth > before.get(t, 0)}
        assert len(prefixes) == len(records)
    for ticket in tickets:
        prefixes.remove(ticket)
    extended: dict[int, int] = {}
    assert not prefixes.extend(chain(0, 12), extended)
    assert extended == {} and len(prefixes) == 0


def test_a_hold_credits_its_blocks_while_in_flight_and_forgets_them_after():
    pending = PendingWork()
    keys = chain(1, 10)
    with pending.hold("w0", 160, (7, keys, 2)):
        matched: dict[int, int] = {}
        pending.prefixes.extend(chain(1, 12), matched)
        assert matched == {}  # the first two blocks are the ledger's to report
        matched = {7: 2}
        pending.prefixes.extend(chain(1, 12), matched)
        assert matched == {7: 10}
    matched = {7: 2}
    pending.prefixes.extend(chain(1, 12), matched)
    assert matched == {7: 2} and len(pending.prefixes) == 0


def test_a_hold_never_entered_records_nothing():
    pending = PendingWork()
    pending.hold("w0", 0, (7, chain(1, 4), 0))
    assert len(pending.prefixes) == 0


def test_a_hold_is_certain_once_its_prefill_is_done():
    pending = PendingWork()
    keys = chain(1, 10)
    hold = pending.hold("w0", 160, (7, keys, 2))
    with hold:
        routed: dict[int, int] = {7: 2}
        certain: dict[int, int] = {7: 2}
        pending.prefixes.extend(chain(1, 12), routed)
        pending.certain.extend(chain(1, 12), certain)
        assert routed == {7: 10} and certain == {7: 2}
        hold.prefill_done()
        hold.prefill_done()  # twice: recorded once
        assert len(pending.certain) == 1
        pending.certain.extend(chain(1, 12), certain)
        assert certain == {7: 10}
    assert len(pending.prefixes) == 0 and len(pending.certain) == 0
    hold.prefill_done()  # after exit: nothing
    assert len(pending.certain) == 0
