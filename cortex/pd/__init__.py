"""Prefill/decode disaggregation: pure planning of both legs (``plan``) and the serving
strategy that runs them over the dispatch layer (``orchestrate``)."""
