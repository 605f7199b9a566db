"""``load_config``: defaults < TOML file < ``CORTEX_*`` environment < flags, checked at once."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from cortex.config.checks import cross_checks
from cortex.config.sources import CONFIG_ENV, flag_values, overlay_env, overlay_flags, read_toml
from cortex.config.tree import CortexConfig
from cortex.config.walk import Text, build
from cortex.errors import ConfigError


def config_path(flags: Mapping[str, Any], env: Mapping[str, str], path: str | None) -> str | None:
    """The file to read: ``path`` argument, else ``--config``, else ``CORTEX_CONFIG``."""
    return path or flags.get("config") or env.get(CONFIG_ENV) or None


def load_config(
    flags: argparse.Namespace | Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    path: str | None = None,
) -> CortexConfig:
    """The effective configuration, or ``ConfigError`` listing every problem found.

    ``flags`` is the namespace of a parser given ``add_config_arguments`` (or a mapping of the
    same attribute names); ``env`` defaults to ``os.environ``; ``path`` overrides ``--config``
    and ``CORTEX_CONFIG``.
    """
    values = flag_values(flags)
    env = os.environ if env is None else env
    problems: list[str] = []
    file = config_path(values, env, path)
    raw: dict[str, Any] = read_toml(file, problems) if file else {}
    overlay_env(raw, env, problems)
    overlay_flags(raw, values, problems)
    _name_workers(raw)
    config = build(CortexConfig, raw, "", problems)
    if config is not None:
        problems.extend(cross_checks(config))
    if problems or config is None:
        error = ConfigError(problems or ["configuration could not be built"])
        error.partial = config  # what did build: the caller may check its files as well
        raise error
    return config


def _name_workers(raw: dict[str, Any]) -> None:
    """A worker entry without a name is named after its url's ``host:port``."""
    workers = raw.get("workers")
    if not isinstance(workers, list):
        return
    for entry in workers:
        if isinstance(entry, dict) and "name" not in entry and "url" in entry:
            url = entry["url"]
            text = url.value if isinstance(url, Text) else url
            if isinstance(text, str):
                try:
                    netloc = urlsplit(text).netloc
                except ValueError:
                    netloc = ""
                # a malformed url still names its worker, so the url's own problem is
                # reported (not "name is required")
                name = netloc or text
                entry["name"] = Text(name, "the url") if isinstance(url, Text) else name
