"""BlockTree against the pure-Python reference ledger, on random event streams.

Streams mix chained stores of a few shared prompts (engine hashes as an engine would give them:
equal prefixes, equal hashes), stores under wrong or unknown parents, arbitrary hashes that
collide with held ones, removals of known and unknown hashes, clears and restarts, on several
targets and media. After every step every observable of the tree must equal the reference's.

``BudgetMachine`` runs such streams with a small entry budget on the tree only (the reference
keeps everything) and a clock ticking once per call: after every step the tree holds a subset
of the reference (same hash, same key, per medium), matches no more than it for any target (no
false hit), counts at least as many unknown parents and removals, and stays within its budget.
Its engine hashes name their content as a real engine's do (one hash, one key): a store under
an evicted parent is skipped like any unknown parent, so it cannot replace a held entry whose
hash now names other content — with such collisions the skipped store would leave the old
entry in place, exactly as without a budget.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from cortex._fast.ledger import ALL_MEDIA, GPU_ONLY, BlockTree
from tests.reference_ledger import ReferenceTree, block_keys, namespace_seed

BLOCK = 2
TARGETS = [0, 1, 2, 700, 65534]
MEDIA = st.integers(min_value=0, max_value=3)
SEEDS = [namespace_seed("m"), namespace_seed("m", "lora-a", "salt")]
# Tokens from a tiny alphabet, so prompts share prefixes and blocks repeat at other positions.
PROMPTS = st.lists(st.integers(min_value=0, max_value=2), min_size=BLOCK, max_size=24 * BLOCK)
# Arbitrary engine hashes: small ints (likely to collide with the chained ones) and huge ones.
HASHES = st.one_of(
    st.integers(min_value=0, max_value=12), st.integers(min_value=2**64 - 4, max_value=2**64 - 1)
)


class LedgerMachine(RuleBasedStateMachine):
    @initialize(prompts=st.lists(PROMPTS, min_size=1, max_size=4))
    def setup(self, prompts: list[list[int]]) -> None:
        self.tree = BlockTree(BLOCK)
        self.ref = ReferenceTree(BLOCK)
        self.prompts = [p[: len(p) // BLOCK * BLOCK] for p in prompts]
        self.engine_hashes: dict[tuple[int, tuple[int, ...]], int] = {}

    def engine_hash(self, seed_index: int, prefix: list[int]) -> int:
        """What an engine publishes for a prefix: equal prefixes get equal hashes."""
        number = self.engine_hashes.setdefault((seed_index, tuple(prefix)), len(self.engine_hashes))
        return number + 1 if number % 3 else 2**64 - 1 - number

    def both(self, method: str, *args: object) -> None:
        got = getattr(self.tree, method)(*args)
        want = getattr(self.ref, method)(*args)
        assert got == want, (method, args, got, want)

    @rule(
        who=st.sampled_from(TARGETS),
        prompt=st.integers(min_value=0, max_value=3),
        seed_index=st.integers(min_value=0, max_value=1),
        start=st.integers(min_value=0, max_value=23),
        count=st.integers(min_value=0, max_value=20),
        medium=MEDIA,
        reproducible=st.booleans(),
    )
    def store_chain(
        self, who, prompt, seed_index, start, count, medium, reproducible
    ) -> None:
        tokens = self.prompts[prompt % len(self.prompts)]
        n_blocks = len(tokens) // BLOCK
        start = min(start, n_blocks - 1)
        stop = min(n_blocks, start + count)
        hashes = [self.engine_hash(seed_index, tokens[: (i + 1) * BLOCK]) for i in range(start, stop)]
        parent = self.engine_hash(seed_index, tokens[: start * BLOCK]) if start else None
        chunk = tokens[start * BLOCK : stop * BLOCK]
        self.both("store", who, parent, hashes, chunk, SEEDS[seed_index], medium, reproducible)

    @rule(
        who=st.sampled_from(TARGETS),
        parent=st.none() | HASHES,
        hashes=st.lists(HASHES, max_size=3),
        data=st.data(),
        medium=MEDIA,
        reproducible=st.booleans(),
    )
    def store_arbitrary(self, who, parent, hashes, data, medium, reproducible) -> None:
        tokens = data.draw(
            st.lists(st.integers(0, 2), min_size=len(hashes) * BLOCK, max_size=len(hashes) * BLOCK)
        )
        self.both("store", who, parent, hashes, tokens, SEEDS[0], medium, reproducible)

    @rule(who=st.sampled_from(TARGETS), data=st.data(), medium=MEDIA)
    def remove_known(self, who, data, medium) -> None:
        known = sorted(set(self.engine_hashes.values()))
        if not known:
            return
        hashes = data.draw(st.lists(st.sampled_from(known), max_size=4))
        self.both("remove", who, hashes, medium)

    @rule(who=st.sampled_from(TARGETS), hashes=st.lists(HASHES, max_size=3), medium=MEDIA)
    def remove_arbitrary(self, who, hashes, medium) -> None:
        self.both("remove", who, hashes, medium)

    @rule(who=st.sampled_from(TARGETS))
    def clear_or_restart(self, who) -> None:
        self.both("clear_target", who)

    @rule(data=st.data(), media=st.sampled_from([GPU_ONLY, ALL_MEDIA, 0b0110]))
    def match_random_keys(self, data, media) -> None:
        pool = sorted(set().union(*(self.ref.target_keys(t) for t in TARGETS)) | {1, 2**64 - 1})
        keys = data.draw(st.lists(st.sampled_from(pool), max_size=6))
        self.both("match", keys, media)

    @invariant()
    def same_matches(self) -> None:
        for seed in SEEDS:
            for tokens in self.prompts:
                keys = block_keys(tokens, BLOCK, seed)
                for media in (GPU_ONLY, ALL_MEDIA):
                    for end in sorted({1, (len(keys) + 1) // 2, len(keys)}):
                        assert self.tree.match(keys[:end], media) == self.ref.match(keys[:end], media)

    @invariant()
    def same_contents(self) -> None:
        for target in TARGETS:
            assert self.tree.target_keys(target) == self.ref.target_keys(target)
            assert self.tree.target_keys(target, GPU_ONLY) == self.ref.target_keys(target, GPU_ONLY)
            assert self.tree.target_entries(target) == self.ref.target_entries(target)
        assert self.tree.targets() == self.ref.targets()
        assert self.tree.entries == self.ref.entries
        assert self.tree.nodes == self.ref.nodes
        for counter in ("unknown_parent", "unknown_removal", "duplicate_store", "hash_conflict"):
            assert getattr(self.tree, counter) == getattr(self.ref, counter), counter


BUDGET = 6


class BudgetMachine(LedgerMachine):
    @initialize(prompts=st.lists(PROMPTS, min_size=1, max_size=4))
    def setup(self, prompts: list[list[int]]) -> None:
        super().setup(prompts)
        self.tree = BlockTree(BLOCK, max_entries=BUDGET, low_water=0.5)
        self.now = 0

    store_arbitrary = None  # colliding hashes: see the module docstring
    store_chain = None

    @rule(
        who=st.sampled_from(TARGETS),
        prompt=st.integers(min_value=0, max_value=3),
        seed_index=st.integers(min_value=0, max_value=1),
        start=st.integers(min_value=0, max_value=23),
        count=st.integers(min_value=0, max_value=20),
        medium=MEDIA,
        reproducible=st.booleans(),
    )
    def store_prompt(self, who, prompt, seed_index, start, count, medium, reproducible) -> None:
        """store_chain with hashes that also name how the key is made (one hash, one key)."""
        tokens = self.prompts[prompt % len(self.prompts)]
        n_blocks = len(tokens) // BLOCK
        start = min(start, n_blocks - 1)
        stop = min(n_blocks, start + count)
        space = 2 * seed_index + reproducible
        hashes = [self.engine_hash(space, tokens[: (i + 1) * BLOCK]) for i in range(start, stop)]
        parent = self.engine_hash(space, tokens[: start * BLOCK]) if start else None
        chunk = tokens[start * BLOCK : stop * BLOCK]
        self.both("store", who, parent, hashes, chunk, SEEDS[seed_index], medium, reproducible)

    def both(self, method: str, *args: object) -> None:
        self.now += 1
        kwargs = {"now": self.now} if method == "store" else {}
        got = getattr(self.tree, method)(*args, **kwargs)
        want = getattr(self.ref, method)(*args)
        if method == "store":
            assert got in (want, -1), (args, got, want)
        elif method in ("remove", "clear_target"):
            pass  # the tree may have lost entries the reference still counts
        else:
            self.check_match(got, want)

    @staticmethod
    def check_match(got: dict[int, int], want: dict[int, int]) -> None:
        for target, blocks in got.items():
            assert blocks <= want.get(target, 0), (target, got, want)

    @invariant()
    def same_matches(self) -> None:
        for seed in SEEDS:
            for tokens in self.prompts:
                keys = block_keys(tokens, BLOCK, seed)
                for media in (GPU_ONLY, ALL_MEDIA):
                    self.check_match(self.tree.match(keys, media), self.ref.match(keys, media))

    @invariant()
    def same_contents(self) -> None:
        assert self.tree.entries <= BUDGET
        for target in TARGETS:
            for medium in range(4):
                mask = 1 << medium
                assert self.tree.target_keys(target, mask) <= self.ref.target_keys(target, mask)
            held = self.ref._maps.get(target, {})
            for engine_hash, entry in held.items():
                for medium in range(4):
                    if self.tree.holds(target, engine_hash, medium):
                        assert medium in entry.refs
            assert self.tree.target_entries(target) <= self.ref.target_entries(target)
        assert set(self.tree.targets()) <= set(self.ref.targets())
        assert self.tree.nodes <= self.ref.nodes
        assert self.tree.unknown_parent >= self.ref.unknown_parent
        assert self.tree.unknown_removal >= self.ref.unknown_removal
        assert self.tree.evicted_entries >= 0


TestLedgerStateMachine = LedgerMachine.TestCase
TestLedgerStateMachine.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None
)
TestLedgerBudgetStateMachine = BudgetMachine.TestCase
TestLedgerBudgetStateMachine.settings = settings(
    max_examples=100, stateful_step_count=60, deadline=None
)


class IncrementalBudgetMachine(BudgetMachine):
    """The budget kept by incremental eviction (ledger.pyx R9): a few visits per store, so
    episodes span many stores, removals and clears; the budget stays a hard bound."""

    @initialize(prompts=st.lists(PROMPTS, min_size=1, max_size=4),
                step=st.integers(min_value=1, max_value=12))
    def setup(self, prompts: list[list[int]], step: int) -> None:
        super().setup(prompts)
        self.tree.set_budget(BUDGET, 0.5, sync_work=0, step_work=step)


TestLedgerIncrementalBudgetStateMachine = IncrementalBudgetMachine.TestCase
TestLedgerIncrementalBudgetStateMachine.settings = settings(
    max_examples=100, stateful_step_count=60, deadline=None
)
