"""The configuration tree: one frozen, typed dataclass per section, rooted at ``CortexConfig``.

Rules:

* Sections reuse the frozen types their components already own (``ServerLimits``,
  ``PoolLimits``, ``CostConfig``, ``Watermarks``, ``BoundedLoad``, ``IngestSettings``,
  ``LedgerSettings``,
  ``WorkerSpec``) instead of re-declaring fields; a component is handed its own sub-tree.
* Every section validates itself in ``__post_init__`` and raises ``ConfigError`` listing all of
  its own problems; problems that span sections live in ``checks``.
* Names carry units (``_s`` seconds, ``_bytes`` bytes). A field with ``metadata["secret"]`` is
  never printed: it is left out of ``repr`` and masked as ``"***"`` by ``dump_toml``.
* Lists are tuples, so the whole tree is immutable and hashable.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from cortex.control.admin import WorkerHostPolicy
from cortex.dispatch.settings import AdmissionSettings, PoolSettings
from cortex.errors import ConfigError
from cortex.events.source import IngestSettings
from cortex.front.limits import ServerLimits
from cortex.ledger.book import LedgerSettings
from cortex.logs import LogConfig
from cortex.pd.plan import PdSettings
from cortex.profile.builtin import unknown_name as unknown_builtin
from cortex.replicas.settings import ReplicaSettings
from cortex.scheduling.cost import BoundedLoad, CostConfig
from cortex.scheduling.watermark import Watermarks
from cortex.upstream.limits import PoolLimits
from cortex.workers.discovery import DnsService
from cortex.workers.health import HealthSettings
from cortex.workers.spec import WorkerSpec

if TYPE_CHECKING:
    from cortex.profile.model_profile import ProfileSpec

MAX_BLOCK_SIZE = 1 << 16  # same bound as cortex.profile.model_profile (not imported: heavy deps)
SECRET = {"secret": True}


def _port_problems(port: int) -> list[str]:
    return [] if 0 <= port <= 65535 else ["port must be in [0, 65535] (0: any free port)"]


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "0.0.0.0"
    port: int = 8080
    limits: ServerLimits = field(default_factory=ServerLimits)
    memory_trim_s: float = 30.0  # freed memory given back to the system this often (0: never)
    # SO_REUSEPORT on the data-plane port: several Cortex processes of one host bind the same
    # port and the kernel spreads new connections among them (replicas of one host)
    reuse_port: bool = False
    # processes serving the data plane on this host (every core): each a replica with its own
    # ledger, sharing requests in flight with the others over IPC; one control plane, one
    # systemd service (``cortex.processes``). 1: this process alone
    processes: int = 1
    # no longer used (long new text is encoded in a worker thread): accepted, with a warning at
    # start, so that configurations naming it still load
    tokenize_processes: int = 0

    def __post_init__(self) -> None:
        problems = _port_problems(self.port)
        if not 0 <= self.tokenize_processes <= 256:
            problems.append("tokenize_processes must be in [0, 256] (0: a worker thread)")
        if not 1 <= self.processes <= 256:
            problems.append("processes must be in [1, 256]")
        if not self.host:
            problems.append("host must not be empty")
        if not (self.memory_trim_s == 0 or 1 <= self.memory_trim_s <= 86400):
            problems.append("memory_trim_s must be 0 (never) or in [1, 86400] seconds")
        if problems:
            raise ConfigError(problems)


PRIVATE_NETWORKS = ("127.0.0.0/8,::1/128,10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,fc00::/7,"
                    "localhost")


@dataclass(frozen=True, slots=True)
class ControlConfig:
    host: str = "127.0.0.1"
    port: int = 8081
    admin_token: str | None = field(default=None, repr=False, metadata=SECRET)
    admin_token_file: str | None = None
    allow_remote: bool = False  # admin API on a non-loopback host: only when this says so
    # Where workers added through the admin API may live (no SSRF through /admin): networks
    # and host names, comma-separated; "*" accepts any host. Link-local (cloud metadata) is
    # not in the default.
    worker_hosts: str = PRIVATE_NETWORKS

    def worker_host_policy(self) -> WorkerHostPolicy | None:
        """The admin API's host allow-list (``None``: any host)."""
        if self.worker_hosts.strip() == "*":
            return None
        return WorkerHostPolicy.parse(
            entry for entry in self.worker_hosts.split(",") if entry.strip())

    def __post_init__(self) -> None:
        problems = _port_problems(self.port)
        try:
            self.worker_host_policy()
        except ConfigError as error:
            problems += error.problems
        if not self.host:
            problems.append("host must not be empty")
        if self.admin_token is not None and self.admin_token_file is not None:
            problems.append("set admin_token or admin_token_file, not both")
        if self.admin_token is not None and (
                not self.admin_token or self.admin_token != self.admin_token.strip()):
            problems.append("admin_token must be non-empty, without surrounding whitespace")
        if problems:
            raise ConfigError(problems)

    @property
    def has_admin_token(self) -> bool:
        return self.admin_token is not None or self.admin_token_file is not None

    def read_admin_token(self) -> str | None:
        """The bearer token of ``/admin/*``: inline, or the stripped content of its file."""
        if self.admin_token_file is None:
            return self.admin_token
        with open(self.admin_token_file, encoding="utf-8") as handle:
            token = handle.read().strip()
        if not token:
            raise ConfigError([f"control.admin_token_file {self.admin_token_file} is empty"])
        return token


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    limits: PoolLimits = field(default_factory=PoolLimits)
    retries_before_first_byte: int = 2  # other workers tried before any byte reached the client

    def __post_init__(self) -> None:
        if self.retries_before_first_byte < 0:
            raise ConfigError(["retries_before_first_byte must be >= 0"])


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """One served model: where its profile's files are, or ``passthrough`` (proxy only)."""

    name: str
    # tokenizer.json, or the model directory holding it (required unless passthrough or
    # builtin); its directory's tokenizer_config.json gives the template's special tokens, BOS
    # handling and (unless chat_template is set) the chat template, as the engines read them
    tokenizer: str | None = None
    # a profile Cortex carries instead of tokenizer (cortex.profile.builtin): "deepseek", the
    # tokenizer and chat template `cortex sim` serves by default
    builtin: str | None = None
    block_size: int | None = None  # the engine's KV block / page size in tokens
    chat_template: str | None = None  # .jinja file, HF tokenizer_config.json or model dir
    add_bos: bool | None = None  # None: as the tokenizer does it
    bos_token: str | None = None  # None: the model directory's
    eos_token: str | None = None
    version: str = ""
    passthrough: bool = False  # another component schedules this pool: Cortex only proxies
    segment_cache_bytes: int = 64 << 20
    render_cache_bytes: int = 32 << 20  # rendered conversations kept (the chat render cache)
    prompt_reuse_bytes: int = 16 << 20  # tokenized prompts kept whole for their next turn
    required: bool = True  # a profile that cannot load stops the start (false: by load only)
    max_prompt_chars: int = 1 << 20  # longer prompts are routed by load, not tokenized (0: any)

    def __post_init__(self) -> None:
        label = f"model {self.name or '?'}"
        problems = [] if self.name else ["model name must not be empty"]
        if self.builtin is not None and (unknown := unknown_builtin(self.builtin)) is not None:
            problems.append(f"{label}: {unknown}")
        if self.builtin is not None and self.tokenizer is not None:
            problems.append(f"{label}: tokenizer and builtin both set: name one of them")
        if not self.passthrough:
            if self.tokenizer is None and self.builtin is None:
                problems.append(f"{label}: tokenizer is required (or set passthrough = true)")
            if self.block_size is None:
                problems.append(f"{label}: block_size is required (or set passthrough = true)")
        if self.block_size is not None and not 0 < self.block_size <= MAX_BLOCK_SIZE:
            problems.append(f"{label}: block_size must be in [1, {MAX_BLOCK_SIZE}]")
        if self.segment_cache_bytes < 0:
            problems.append(f"{label}: segment_cache_bytes must be >= 0")
        if self.render_cache_bytes < 0:
            problems.append(f"{label}: render_cache_bytes must be >= 0")
        if self.prompt_reuse_bytes < 0:
            problems.append(f"{label}: prompt_reuse_bytes must be >= 0")
        if self.max_prompt_chars < 0:
            problems.append(f"{label}: max_prompt_chars must be >= 0")
        if problems:
            raise ConfigError(problems)

    def profile_spec(self) -> ProfileSpec:
        """What ``cortex.profile.model_profile.load_profile`` needs (not for passthrough)."""
        from cortex.profile.model_profile import ProfileSpec

        if self.passthrough or (self.tokenizer is None and self.builtin is None) or (
                self.block_size is None):
            raise ConfigError([f"model {self.name}: a passthrough model has no profile"])
        return ProfileSpec(
            model=self.name, tokenizer_path=self.tokenizer, block_size=self.block_size,
            chat_template_path=self.chat_template, add_bos=self.add_bos,
            bos_token=self.bos_token, eos_token=self.eos_token, version=self.version,
            builtin=self.builtin)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    cost: CostConfig = field(default_factory=CostConfig)
    watermarks: Watermarks = field(default_factory=Watermarks)
    bounds: BoundedLoad = field(default_factory=BoundedLoad)
    seed: int | None = None  # RNG seed of the power-of-two-choices fallback; None: random
    route_on_partial: bool = False  # route exact on PARTIAL ledgers (true lower bounds)
    client_dp_rank: bool = False  # honour a client's routed_dp_rank / x-data-parallel-rank

    def __post_init__(self) -> None:
        problems = []
        if self.bounds.factor is not None and not self.bounds.factor > 0:
            problems.append("bounds.factor must be > 0 (or none: no cap)")
        if self.bounds.slack < 0:
            problems.append("bounds.slack must be >= 0")
        if problems:
            raise ConfigError(problems)


# The health section is the monitor's own settings type (one definition of its fields).
HealthConfig = HealthSettings


@dataclass(frozen=True, slots=True)
class CortexConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    models: tuple[ModelConfig, ...] = ()
    workers: tuple[WorkerSpec, ...] = ()
    discovery: tuple[DnsService, ...] = ()  # workers from DNS records, refreshed
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    ingest: IngestSettings = field(default_factory=IngestSettings)
    ledger: LedgerSettings = field(default_factory=LedgerSettings)
    health: HealthConfig = field(default_factory=HealthConfig)
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    pd: PdSettings = field(default_factory=PdSettings)
    replicas: ReplicaSettings = field(default_factory=ReplicaSettings)
    log: LogConfig = field(default_factory=LogConfig)

    def model(self, name: str) -> ModelConfig | None:
        for entry in self.models:
            if entry.name == name:
                return entry
        return None

    def pool_settings(self, name: str) -> PoolSettings:
        """How the pool of model ``name`` routes: the scheduler's settings, and the model's
        cache sizes and prompt limit when it is configured (a model only a worker names gets
        the pool's defaults for those)."""
        scheduler = self.scheduler
        routing = PoolSettings(cost=scheduler.cost, watermarks=scheduler.watermarks,
                               bounds=scheduler.bounds,
                               route_on_partial=scheduler.route_on_partial)
        model = self.model(name)
        if model is None:
            return routing
        return replace(routing, max_prompt_chars=model.max_prompt_chars,
                       segment_cache_bytes=model.segment_cache_bytes,
                       render_cache_bytes=model.render_cache_bytes,
                       prompt_reuse_bytes=model.prompt_reuse_bytes)
