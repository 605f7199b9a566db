"""Checks that span sections of a built ``CortexConfig``, and the optional file checks.

Rules:

* ``cross_checks`` is pure (no I/O) and returns every problem: duplicate worker or model names,
  two workers on one url, a worker naming a model that is not configured (when models are), DP
  ranks whose KV-event or replay endpoints cannot be derived (port + rank past 65535, an ipc://
  endpoint with several ranks) or collide with another rank's, an admin token exposed on a
  non-loopback control host without ``control.allow_remote``, data and control plane on the
  same port.
* ``file_checks`` looks at the disk: the files the models and the admin token point to exist
  and are readable; when they do, each model's profile is loaded as ``serve`` would load it, so
  a tokenizer that does not parse or a BOS string that is not one token shows up here instead
  of silently turning exact KV routing off. ``check-config`` runs it; ``load_config`` does not
  (the app reads the files when it starts and reports its own errors).
"""

from __future__ import annotations

import ipaddress
import os
from collections import Counter

from cortex.config.tree import CortexConfig
from cortex.errors import ConfigError
from cortex.events.source import rank_endpoint
from cortex.workers.spec import engine_address

ANY_HOSTS = ("0.0.0.0", "::", "")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def cross_checks(config: CortexConfig) -> list[str]:
    problems: list[str] = []
    for name, count in Counter(worker.name for worker in config.workers).items():
        if count > 1:
            problems.append(f"workers: name {name!r} is used by {count} workers")
    for name, count in Counter(model.name for model in config.models).items():
        if count > 1:
            problems.append(f"models: name {name!r} is configured {count} times")
    for url, count in Counter(engine_address(worker.url) for worker in config.workers).items():
        if count > 1:
            problems.append(f"workers: url {url} is used by {count} workers")
    problems.extend(_endpoint_problems(config))
    if config.models:
        served = {model.name for model in config.models}
        for worker in config.workers:
            if worker.model is not None and worker.model not in served:
                problems.append(f"worker {worker.name}: model {worker.model!r} is not one of "
                                f"the configured models ({', '.join(sorted(served))})")
    control = config.control
    if control.has_admin_token and not is_loopback(control.host) and not control.allow_remote:
        problems.append(f"control: an admin token is set and control.host {control.host!r} is "
                        "not loopback; set control.allow_remote = true to expose /admin on it")
    server = config.server
    if server.port == control.port != 0 and (
            server.host == control.host or server.host in ANY_HOSTS
            or control.host in ANY_HOSTS):
        problems.append(f"server and control both listen on port {server.port}")
    if server.processes > 1 and config.replicas.listen:
        problems.append("replicas.listen with server.processes > 1: the processes of one host "
                        "tell each other over IPC, and one listen endpoint cannot carry all "
                        "of them to other hosts; run one process per replica there, or leave "
                        "listen empty (replicas.peers still hears the other hosts)")
    return problems


def _endpoint_problems(config: CortexConfig) -> list[str]:
    """Every (worker, rank) gets its own events and replay endpoint (rank r: port + r)."""
    problems: list[str] = []
    owners: dict[str, str] = {}
    for worker in config.workers:
        for field_name in ("events", "replay"):
            base = getattr(worker, field_name)
            if base is None:
                continue
            for rank in range(worker.dp_size):
                try:
                    endpoint = rank_endpoint(base, rank)
                except ConfigError as error:
                    problems.extend(f"worker {worker.name}: {field_name}: {problem}"
                                    for problem in error.problems)
                    break
                owner = f"worker {worker.name} rank {rank} {field_name}"
                if endpoint in owners:
                    problems.append(f"{owner} and {owners[endpoint]} are both {endpoint}")
                else:
                    owners[endpoint] = owner
    return problems


def file_checks(config: CortexConfig) -> list[str]:
    problems: list[str] = []
    for index, model in enumerate(config.models):
        for field_name in ("tokenizer", "chat_template"):
            path = getattr(model, field_name)
            if path is not None:
                problems.extend(_readable(f"models[{index}].{field_name}", path,
                                          directory_ok=True))
    if config.control.admin_token_file is not None:
        problems.extend(_readable("control.admin_token_file", config.control.admin_token_file))
    return problems or _profile_problems(config)


def _profile_problems(config: CortexConfig) -> list[str]:
    from cortex.profile.model_profile import ProfileError, load_profile

    problems: list[str] = []
    for index, model in enumerate(config.models):
        if model.passthrough:
            continue
        try:
            load_profile(model.profile_spec())
        except ProfileError as error:
            problems.extend(f"models[{index}] ({model.name}): {problem}"
                            for problem in error.problems)
    return problems


def _readable(key: str, path: str, directory_ok: bool = False) -> list[str]:
    if directory_ok and os.path.isdir(path):
        return [] if os.access(path, os.R_OK | os.X_OK) else [f"{key}: cannot read {path}"]
    if not os.path.isfile(path):
        return [f"{key}: no such file {path}"]
    if not os.access(path, os.R_OK):
        return [f"{key}: cannot read {path}"]
    return []
