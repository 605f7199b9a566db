"""Cortex configuration: one frozen, typed tree; TOML file → ``CORTEX_*`` env → CLI flags.

Public API::

    load_config(flags=None, env=None, path=None) -> CortexConfig   # raises ConfigError(problems)
    dump_toml(config, mask_secrets=True, comments=False) -> str
    add_config_arguments(parser)           # --config, --worker, --model, one flag per key
    file_checks(config) -> list[str]       # files named by the config exist (check-config)
    CortexConfig and its sections: ServerConfig, ControlConfig, UpstreamConfig, ModelConfig,
    SchedulerConfig, HealthConfig, LogConfig (plus the components' own ServerLimits,
    PoolLimits, CostConfig, Watermarks, BoundedLoad, IngestSettings, WorkerSpec)

Precedence, lowest first: the dataclass defaults; the TOML file (``path``, else ``--config``,
else ``CORTEX_CONFIG``); the environment (key ``server.limits.max_body_bytes`` is
``CORTEX_SERVER_LIMITS_MAX_BODY_BYTES``); the flags (``--server-limits-max-body-bytes``).
Workers and models are lists: ``[[workers]]`` / ``[[models]]`` in the file, ``CORTEX_WORKERS`` /
``CORTEX_MODELS`` (space-separated specs), repeatable ``--worker`` / ``--model``; a higher layer
replaces the list of a lower one. A spec is ``URL[,key=value]...`` for a worker (``name``
defaults to the url's ``host:port``) and ``NAME[,key=value]...`` for a model.

``None`` is written ``""`` (or ``"none"`` for a non-string key). Every problem (unknown keys
with a "did you mean", type errors with their key path and source, each section's own checks,
checks across sections) is collected and raised as one ``cortex.errors.ConfigError``.
A component is handed its own section (``config.server.limits``, ``config.scheduler``, ...),
never the root.
"""

from cortex.config.checks import cross_checks, file_checks
from cortex.config.emit import dump_toml
from cortex.config.load import load_config
from cortex.config.sources import add_config_arguments, env_name, flag_name
from cortex.config.tree import (
    ControlConfig,
    CortexConfig,
    HealthConfig,
    LogConfig,
    ModelConfig,
    SchedulerConfig,
    ServerConfig,
    UpstreamConfig,
)

__all__ = [
    "ControlConfig", "CortexConfig", "HealthConfig", "LogConfig", "ModelConfig",
    "SchedulerConfig", "ServerConfig", "UpstreamConfig", "add_config_arguments",
    "cross_checks", "dump_toml", "env_name", "file_checks", "flag_name", "load_config",
]
