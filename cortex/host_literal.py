"""Hosts as URLs and ``host:port`` strings write them: an IPv6 literal goes in brackets.

RFC 3986 §3.2.2: an IP literal in a URI's authority is enclosed in ``[`` ``]``, so that its
colons are not read as the port's. Every place Cortex writes a host next to a port (worker
URLs, ZeroMQ endpoints, listen addresses, the upstream ``Host`` header, log lines) uses these,
so the rule lives once. Pure.
"""

from __future__ import annotations


def url_host(host: str) -> str:
    """``host`` as written in a URL: an IPv6 literal bracketed (once: a bracketed one stays)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def host_port(host: str, port: int) -> str:
    """``host:port``, the host as written in a URL."""
    return f"{url_host(host)}:{port}"
