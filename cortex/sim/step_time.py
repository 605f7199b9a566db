"""How long one engine step (one forward pass) takes: a timing profile over the step's work.

Pure. A continuous-batching engine (``cortex.sim.batching``) describes each step it runs as a
``StepWork`` — the prefill chunks it computes (new tokens, and the context already in KV that
their attention reads) and the sequences it decodes (one token each, and the KV tokens they
read) — and a ``StepProfile`` turns that into seconds:

    seconds = step_s
            + prefill_step_s    x  (1 if the step computes any prefill chunk, else 0)
            + prefill_token_s   x  sum of chunk tokens
            + attention_pair_s  x  sum of chunk.tokens x (chunk.context + chunk.tokens / 2)
            + decode_seq_s      x  decodes
            + decode_kv_token_s x  decode_context

(a chunk's attention is causal: its i-th new token reads the context and the i new tokens
before it, hence the half). ``prefill_step_s`` is what a step with prompt tokens costs beyond
its tokens (the prefill attention path, new requests' set-up): on the vLLM CPU engine a 32-token
prefill takes a few ms more than a one-token decode.

One more figure is no part of any step: ``request_s``, the latency a request spends outside
the engine's steps (the API server's work on it before the scheduler sees it and on its answer
after; the simulated engine delays each request's arrival at its scheduler by it). The
coefficients of a profile come from measurements, each cited in the profile's ``source``
(profile files: ``cortex/sim/profiles/``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cortex.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Chunk:
    """Prompt tokens one request computes in one step."""

    tokens: int  # new tokens computed in this step
    context: int  # tokens of the request already in KV before them (cached + earlier chunks)


@dataclass(frozen=True, slots=True)
class StepWork:
    """What one step computes."""

    chunks: tuple[Chunk, ...] = ()
    decodes: int = 0  # sequences producing one token each
    decode_context: int = 0  # KV tokens those sequences read, summed

    @property
    def prefill_tokens(self) -> int:
        return sum(chunk.tokens for chunk in self.chunks)

    @property
    def prefills(self) -> bool:
        """Whether the step computes prompt tokens (any chunk)."""
        return bool(self.chunks)

    @property
    def empty(self) -> bool:
        return not self.chunks and not self.decodes


@dataclass(frozen=True, slots=True)
class StepProfile:
    """Step-time coefficients of one engine on one machine (seconds)."""

    name: str
    step_s: float  # fixed cost of a step (launch, sampling, scheduling)
    prefill_token_s: float  # per prompt token computed (the weights' matmuls)
    attention_pair_s: float  # per (new token, context token) pair a prefill chunk attends
    decode_seq_s: float  # per sequence decoded in the step
    decode_kv_token_s: float  # per KV token a decoding sequence reads
    prefill_step_s: float = 0.0  # once per step that computes any prefill chunk
    request_s: float = 0.0  # per request, outside the steps (API server): not in ``seconds``
    source: str = ""  # where every coefficient comes from

    def __post_init__(self) -> None:
        problems = [f"{name} must be >= 0" for name in (
            "step_s", "prefill_token_s", "attention_pair_s", "decode_seq_s",
            "decode_kv_token_s", "prefill_step_s", "request_s")
            if not getattr(self, name) >= 0]
        if problems:
            raise ConfigError(problems)

    def seconds(self, work: StepWork) -> float:
        """The step's duration; 0 for a step that computes nothing."""
        if work.empty:
            return 0.0
        tokens = 0
        pairs = 0.0
        for chunk in work.chunks:
            tokens += chunk.tokens
            pairs += chunk.tokens * (chunk.context + chunk.tokens / 2)
        return (self.step_s + (self.prefill_step_s if work.chunks else 0.0)
                + self.prefill_token_s * tokens + self.attention_pair_s * pairs
                + self.decode_seq_s * work.decodes
                + self.decode_kv_token_s * work.decode_context)

    def scaled(self, tokens_per_token: float) -> StepProfile:
        """This profile for a workload whose every token stands for ``tokens_per_token`` real
        ones (a replay that shrinks a trace's prompts to what two vCPUs can tokenize): per-token
        costs grow by that factor, attention pairs by its square, per-step and per-sequence
        costs stay. A step of scaled work then takes what the real-size step would."""
        if not tokens_per_token > 0:
            raise ConfigError([f"tokens_per_token must be > 0, not {tokens_per_token}"])
        k = tokens_per_token
        return replace(self, name=self.name if k == 1 else f"{self.name} x{k:g} tokens",
                       prefill_token_s=self.prefill_token_s * k,
                       attention_pair_s=self.attention_pair_s * k * k,
                       decode_kv_token_s=self.decode_kv_token_s * k)

    def prefill_tokens_per_s(self, budget: int, context: int = 0) -> float:
        """Prompt tokens per second of back-to-back steps that each compute ``budget`` tokens
        of one prompt after ``context`` tokens already in KV: an engine's prefill speed under
        load (what a router's cost model divides queued work by)."""
        return budget / self.seconds(StepWork((Chunk(budget, context),)))

    def decode_seq_cost_s(self, context: int) -> float:
        """What one more decoding sequence with ``context`` KV tokens adds to a step."""
        return self.decode_seq_s + self.decode_kv_token_s * context

    def router_cost_terms(self, budget: int, mean_prompt: int, decode_context: int) -> dict:
        """The few coefficients Cortex's cost needs in its step form (``scheduler.cost``;
        ``cortex/scheduling/cost.py``): the step's fixed seconds, the marginal prompt tokens
        per second within a step (attention over half a mean prompt of context), one decoding
        request's share of a step (``decode_context`` KV tokens read) and the budget."""
        per_token = self.prefill_token_s + self.attention_pair_s * mean_prompt / 2
        return {"step_s": self.step_s + self.prefill_step_s,
                "prefill_tokens_per_s": 1.0 / per_token if per_token > 0 else 1e12,
                "decode_s_per_in_flight": self.decode_seq_cost_s(decode_context),
                "step_token_budget": budget}
