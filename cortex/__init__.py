"""Cortex: a KV-cache-aware inference gateway for SGLang and vLLM clusters."""

__version__ = "0.1.0"
