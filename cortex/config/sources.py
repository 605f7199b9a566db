"""Where configuration values come from: TOML file, ``CORTEX_*`` environment, command-line flags.

Rules:

* Each scalar key ``a.b.c`` has the environment twin ``CORTEX_A_B_C`` and the flag ``--a-b-c``,
  both generated from ``walk.scalar_keys`` (nothing is written by hand per key).
* Lists: ``--worker SPEC`` and ``--model SPEC`` (repeatable) with the twins ``CORTEX_WORKERS``
  and ``CORTEX_MODELS`` (entries separated by whitespace). A SPEC is ``FIRST[,key=value]...``:
  the first item is the worker's url / the model's name, then any field of the entry
  (``-`` and ``_`` alike in keys). A list from a higher layer replaces the lower one whole.
* Overlays put ``Text`` leaves into the raw tree; typing and checking happen in one place
  (``walk.build``), so a bad flag is reported with every other problem instead of aborting.
* An environment variable ``CORTEX_*`` that is not a key is a problem when it names a config
  section or is close to a key (a typo); other ``CORTEX_*`` variables are left alone, and those
  of ``FOREIGN_PREFIXES`` (``cortex sim``'s own twins, build switches, test settings) always.
* Flags default to ``None`` so that only what the user typed overrides the lower layers.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import tomllib
import typing
from collections.abc import Iterator, Mapping
from typing import Any

from cortex.config.docs import DOCS
from cortex.config.tree import CortexConfig, ModelConfig
from cortex.config.walk import ScalarKey, Text, optional_inner, scalar_keys, suggest, type_hints
from cortex.workers.discovery import DnsService
from cortex.workers.spec import WorkerSpec

ENV_PREFIX = "CORTEX_"
CONFIG_ENV = "CORTEX_CONFIG"
LISTS = {"workers": ("CORTEX_WORKERS", "worker", "url", WorkerSpec),
         "models": ("CORTEX_MODELS", "model", "name", ModelConfig),
         "discovery": ("CORTEX_DISCOVERY", "discover", "service", DnsService)}
FOREIGN_PREFIXES = ("CORTEX_SIM_", "CORTEX_CYTHON_", "CORTEX_SHARED_")
FLAG_DEST = "cfg."  # namespace attribute of a scalar flag: "cfg.server.limits.max_body_bytes"


def env_name(path: tuple[str, ...]) -> str:
    return ENV_PREFIX + "_".join(path).upper()


def flag_name(path: tuple[str, ...]) -> str:
    return "--" + "-".join(path).replace("_", "-")


@functools.cache
def keys() -> tuple[ScalarKey, ...]:
    return tuple(scalar_keys(CortexConfig))


def read_toml(path: str, problems: list[str]) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except OSError as error:
        problems.append(f"config file {path}: {error.strerror or error}")
    except tomllib.TOMLDecodeError as error:
        problems.append(f"config file {path}: not valid TOML ({error})")
    return {}


def set_path(raw: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    """Put ``value`` at ``path``, creating tables; a non-table in the way is left for ``build``
    to report (the file's own mistake)."""
    node = raw
    for name in path[:-1]:
        child = node.setdefault(name, {})
        if not isinstance(child, dict):
            return
        node = child
    node[path[-1]] = value


def parse_entry(spec: str, first: str, origin: str, problems: list[str]) -> dict[str, Text]:
    """``FIRST[,key=value]...`` → raw entry of ``Text`` leaves (``first`` names the field of
    the leading item)."""
    items = [item.strip() for item in spec.split(",")]
    entry: dict[str, Text] = {}
    for index, item in enumerate(items):
        if not item:
            continue
        name, sep, value = item.partition("=")
        if not sep:
            if index == 0:
                entry[first] = Text(item, origin)
            else:
                problems.append(f"{origin}: {item!r} is not key=value")
            continue
        key = name.strip().replace("-", "_")
        if key in entry:
            problems.append(f"{origin}: {key} given twice")
        entry[key] = Text(value.strip(), origin)
    if first not in entry:
        problems.append(f"{origin}: {first} is required (the first item of {spec!r})")
    return entry


def overlay_env(raw: dict[str, Any], env: Mapping[str, str], problems: list[str]) -> None:
    table = {env_name(key.path): key.path for key in keys()}
    known = set(table) | {CONFIG_ENV} | {names[0] for names in LISTS.values()}
    sections = {f"{ENV_PREFIX}{name.upper()}_" for name in type_hints(CortexConfig)}
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name in known or name.startswith(FOREIGN_PREFIXES):
            continue
        close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.85)
        if close or name.startswith(tuple(sections)):
            problems.append(f"unknown environment variable {name}{suggest(name, list(known))}")
    for name, path in table.items():
        if name in env:
            set_path(raw, path, Text(env[name], f"env {name}"))
    for section, (variable, _, first, _) in LISTS.items():
        if variable in env:
            raw[section] = [parse_entry(spec, first, f"env {variable} entry {index + 1}", problems)
                            for index, spec in enumerate(env[variable].split())]


def overlay_flags(raw: dict[str, Any], flags: Mapping[str, Any], problems: list[str]) -> None:
    for key in keys():
        value = flags.get(FLAG_DEST + ".".join(key.path))
        if value is not None:
            set_path(raw, key.path, Text(value, flag_name(key.path)))
    for section, (_, flag, first, _) in LISTS.items():
        specs = flags.get(section)
        if specs:
            raw[section] = [parse_entry(spec, first, f"--{flag} #{index + 1}", problems)
                            for index, spec in enumerate(specs)]


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config``, ``--worker``, ``--model`` and one flag per scalar key, defaults shown."""
    group = parser.add_argument_group(
        "configuration", "defaults < TOML file < CORTEX_* environment < these flags")
    group.add_argument("--config", metavar="PATH", default=None,
                       help=f"TOML configuration file (env {CONFIG_ENV})")
    for section, (variable, flag, first, cls) in LISTS.items():
        fields = ", ".join(name for name in type_hints(cls) if name != first)
        group.add_argument(
            f"--{flag}", dest=section, action="append", default=None,
            metavar=f"{first.upper()}[,key=value...]",
            help=_escape(f"add one entry of [[{section}]] (repeatable; keys: {fields}) "
                         f"(env {variable}, entries separated by spaces)"))
    for key in keys():
        shown = "not set" if key.default is None else (
            "***" if key.secret else _shown(key.default))
        extra = {"nargs": "?", "const": "true"} if key.type is bool else {}
        group.add_argument(
            flag_name(key.path), dest=FLAG_DEST + ".".join(key.path), default=None,
            metavar=_metavar(key), **extra,
            help=_escape(f"{DOCS['.'.join(key.path)]} (default: {shown}; "
                         f"env {env_name(key.path)})"))


def flag_values(namespace: argparse.Namespace | Mapping[str, Any] | None) -> dict[str, Any]:
    if namespace is None:
        return {}
    return dict(namespace) if isinstance(namespace, Mapping) else vars(namespace)


def iter_flags(parser: argparse.ArgumentParser) -> Iterator[str]:
    """Every long option of ``parser`` (for tests and docs)."""
    for action in parser._actions:
        for option in action.option_strings:
            if option.startswith("--"):
                yield option


def _metavar(key: ScalarKey) -> str:
    tp = optional_inner(key.type) or key.type
    name = key.path[-1]
    if tp is bool:
        return "BOOL"
    if name.endswith("_s") and not name.endswith("_per_s"):
        return "SECONDS"
    if name.endswith("_bytes"):
        return "BYTES"
    if typing.get_origin(tp) is typing.Literal:
        return "{" + ",".join(typing.get_args(tp)) + "}"
    return {int: "N", float: "X", str: "TEXT"}.get(tp, "VALUE")


def _shown(value: Any) -> str:
    value = getattr(value, "value", value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _escape(text: str) -> str:
    return text.replace("%", "%%")
