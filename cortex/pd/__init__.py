"""Prefill/decode disaggregation: pure planning of both legs (``plan``) and their trio
orchestration."""
