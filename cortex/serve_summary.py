"""The one line ``cortex serve`` logs once it serves: listeners, models, workers.

Rules:

* One line, in this order: the data plane's and the control plane's ``host:port`` (the bound
  ports: a configured 0 shows the port picked; an IPv6 host in brackets); every model with
  its block size (``passthrough`` for a proxied pool) and how many workers serve it — the
  configured models first, in configuration order, then models only workers name (``no
  profile``: routed by load); then every worker as ``name engine url``, plus ``dp N`` above 1
  and its role unless ``both``, at most ``MAX_WORKERS`` of them and how many more.
* A worker's model is ``cortex.worker_lifecycle.model_of``'s (the one configured model when
  the worker names none).
* ``nothing_to_serve``: the warning logged once beside that line when no worker is configured
  (nor discovered), saying what is missing and where to start; ``None`` otherwise.

Pure: reads the configuration and worker specs it is given.
"""

from __future__ import annotations

from collections.abc import Sequence

from cortex.config.tree import CortexConfig
from cortex.host_literal import host_port
from cortex.scheduling.view import Role
from cortex.worker_lifecycle import model_of
from cortex.workers.spec import WorkerSpec

MAX_WORKERS = 16


def serve_summary(config: CortexConfig, workers: Sequence[WorkerSpec], data_port: int,
                  control_port: int) -> str:
    counts: dict[str, int] = {model.name: 0 for model in config.models}
    for spec in workers:
        name = model_of(spec, config)
        counts[name] = counts.get(name, 0) + 1
    kinds = {model.name: "passthrough" if model.passthrough else f"block {model.block_size}"
             for model in config.models}
    models = [f"{name} ({kinds.get(name, 'no profile')}, {_workers(count)})"
              for name, count in counts.items()]
    shown = [_worker(spec) for spec in workers[:MAX_WORKERS]]
    if len(workers) > MAX_WORKERS:
        shown.append(f"... ({len(workers) - MAX_WORKERS} more)")
    return (f"serving: data plane {host_port(config.server.host, data_port)}, control plane "
            f"{host_port(config.control.host, control_port)}; "
            f"models: {', '.join(models) or 'none'}; "
            f"workers: {', '.join(shown) or 'none'}")


def _workers(count: int) -> str:
    return f"{count} worker{'' if count == 1 else 's'}"


def _worker(spec: WorkerSpec) -> str:
    parts = [spec.name, spec.engine, spec.url]
    if spec.dp_size > 1:
        parts.append(f"dp {spec.dp_size}")
    if spec.role is not Role.BOTH:
        parts.append(spec.role.value)
    return " ".join(parts)


def nothing_to_serve(config: CortexConfig, workers: Sequence[WorkerSpec]) -> str | None:
    """What is missing when no request can be served yet (no worker, none from DNS)."""
    if workers or config.discovery:
        return None
    later = ("add workers with --worker, [[workers]] in the configuration file (SIGHUP re-reads "
             "them) or the admin API (POST /admin/workers); to try Cortex without a GPU, see the "
             "README's 'Quick start without a GPU' (cortex sim starts engines and prints the "
             "cortex serve line for them)")
    if not config.models:
        return ("nothing to serve: no model and no worker configured (--model NAME,... "
                f"--worker URL,...), so every request is refused; {later}")
    names = ", ".join(model.name for model in config.models)
    return f"no worker configured: requests for {names} are answered 503; {later}"
