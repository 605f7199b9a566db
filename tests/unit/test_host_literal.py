"""host_literal: an IPv6 literal is bracketed once wherever a host meets a port."""

from __future__ import annotations

from cortex.host_literal import host_port, url_host


def test_ipv6_literals_get_brackets_once_and_names_stay():
    assert url_host("::1") == "[::1]"
    assert url_host("[::1]") == "[::1]"
    assert url_host("fe80::1%eth0") == "[fe80::1%eth0]"
    assert url_host("127.0.0.1") == "127.0.0.1"
    assert url_host("engine-0.svc") == "engine-0.svc"
    assert host_port("::", 8080) == "[::]:8080"
    assert host_port("localhost", 30000) == "localhost:30000"
