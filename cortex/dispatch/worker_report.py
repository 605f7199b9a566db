"""What a worker says about itself, for the model profile check. Pure parsers.

engine-endpoints.md §2 and §6: SGLang's ``GET /server_info`` carries ``served_model_name`` (or
``model_path``), ``page_size``, ``disable_radix_cache`` (prefix caching off) and, on a PD
prefill server, ``disaggregation_bootstrap_port`` (pd-disaggregation.md §1.2: used when the
worker was registered without one); vLLM's ``GET /v1/models`` lists the served model ids and
its ``GET /metrics`` has the ``vllm:cache_config_info`` gauge whose ``block_size`` and
``enable_prefix_caching`` labels are the block size and whether prefix caching is on (labels
are the config's values as strings: ``"True"`` / ``"False"``). Whatever a worker does not say
stays ``None`` — the profile check then reports a missing model or page size instead of
assuming agreement (prefix caching not reported is not held against it).

The KV pool of one engine (one DP rank), in tokens, for the cost's KV-pressure term: SGLang's
``max_total_num_tokens``; vLLM's ``num_gpu_blocks`` label less its null block (block 0, never
handed out: engine-scheduling.md §3), times ``block_size``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

_CACHE_CONFIG_INFO = re.compile(r'^vllm:cache_config_info\{([^}]*)\}', re.MULTILINE)
_BLOCK_SIZE_LABEL = re.compile(r'(?:^|,)\s*block_size="(\d+)"')
_PREFIX_CACHING_LABEL = re.compile(r'(?:^|,)\s*enable_prefix_caching="(True|False)"')
_NUM_GPU_BLOCKS_LABEL = re.compile(r'(?:^|,)\s*num_gpu_blocks="(\d+)"')


@dataclass(frozen=True, slots=True)
class WorkerReport:
    models: tuple[str, ...]
    block_size: int | None
    bootstrap_port: int | None = None  # SGLang PD prefill: disaggregation_bootstrap_port
    prefix_caching: bool | None = None  # None: not reported
    kv_tokens: int | None = None  # one engine's (DP rank's) KV pool, in tokens

    def model_for(self, wanted: str) -> str | None:
        """``wanted`` if the worker serves it, else the first model it names (or ``None``)."""
        if wanted in self.models:
            return wanted
        return self.models[0] if self.models else None


def sglang_server_info(body: bytes) -> WorkerReport:
    try:
        info = json.loads(body)
    except ValueError:
        return WorkerReport((), None)
    if not isinstance(info, dict):
        return WorkerReport((), None)
    models = [name for name in (info.get("served_model_name"), info.get("model_path"))
              if isinstance(name, str) and name]
    page = info.get("page_size")
    port = info.get("disaggregation_bootstrap_port")
    radix_off = info.get("disable_radix_cache")
    pool = info.get("max_total_num_tokens")
    return WorkerReport(tuple(models), page if type(page) is int and page > 0 else None,
                        port if type(port) is int and 0 < port < 65536 else None,
                        None if type(radix_off) is not bool else not radix_off,
                        pool if type(pool) is int and pool > 0 else None)


def vllm_models(body: bytes) -> tuple[str, ...]:
    try:
        listing = json.loads(body)
        data = listing["data"] if isinstance(listing, dict) else []
        return tuple(entry["id"] for entry in data
                     if isinstance(entry, dict) and isinstance(entry.get("id"), str)
                     and entry.get("parent") is None)
    except (ValueError, KeyError, TypeError):
        return ()


def vllm_report(models: tuple[str, ...], metrics_text: str) -> WorkerReport:
    """A vLLM worker's report: the served ``models`` (``vllm_models``) and what its
    ``vllm:cache_config_info`` says."""
    return WorkerReport(models, vllm_block_size(metrics_text), None,
                        vllm_prefix_caching(metrics_text), vllm_kv_tokens(metrics_text))


def _cache_config_label(metrics_text: str, label: re.Pattern[str]) -> str | None:
    """The first value of ``label`` among the ``vllm:cache_config_info`` samples."""
    for match in _CACHE_CONFIG_INFO.finditer(metrics_text):
        found = label.search(match.group(1))
        if found:
            return found.group(1)
    return None


def vllm_block_size(metrics_text: str) -> int | None:
    size = _cache_config_label(metrics_text, _BLOCK_SIZE_LABEL)
    return None if size is None else int(size)


def vllm_prefix_caching(metrics_text: str) -> bool | None:
    flag = _cache_config_label(metrics_text, _PREFIX_CACHING_LABEL)
    return None if flag is None else flag == "True"


def vllm_kv_tokens(metrics_text: str) -> int | None:
    """One engine's KV pool in tokens (``num_gpu_blocks`` less the null block, times
    ``block_size``), or None when not reported."""
    blocks = _cache_config_label(metrics_text, _NUM_GPU_BLOCKS_LABEL)
    size = vllm_block_size(metrics_text)
    if blocks is None or size is None or int(blocks) < 2:
        return None
    return (int(blocks) - 1) * size
