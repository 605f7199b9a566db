"""The head of a request Cortex sends to a worker: origin parsing and header hygiene. Pure.

Rules:

* An origin is ``http://host:port`` (port optional, 80 by default; IPv6 hosts in brackets).
  Anything else — another scheme, a path, a query, user info — is a ``ConfigError``: the pool
  only ever talks plain HTTP/1.1 to workers inside the cluster.
* ``Host`` is always the origin's ``host[:port]``; the caller's ``host`` is dropped.
* Hop-by-hop headers (RFC 9110 §7.6.1: ``connection``, ``keep-alive``, ``proxy-connection``,
  ``transfer-encoding``, ``te``, ``trailer``, ``upgrade``, ``proxy-authenticate``,
  ``proxy-authorization``) and every header named in the caller's ``connection`` header are
  dropped: the pool manages its own connection.
* ``content-length`` is always set from the body actually sent (0 for an empty body on methods
  that carry one; omitted for a bodiless GET/HEAD); the caller's is dropped.
* Header names are lower-cased; values and order are otherwise kept.
* ``request_bytes`` writes the request line, the headers and the body as one buffer (one
  ``send`` for the whole request), after checking the head against HTTP/1.1's grammar in one
  regular-expression match: a method that is not a token, a target with blanks or control
  bytes, a header name that is not a token or a value with CR, LF or another control byte
  (HTAB excepted) is ``BadRequest`` — nothing malformed is ever written to a worker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cortex.errors import BadRequest, ConfigError
from cortex.host_literal import host_port

Headers = list[tuple[bytes, bytes]]

HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"te",
    b"trailer", b"upgrade", b"proxy-authenticate", b"proxy-authorization",
})
_SET_BY_POOL = frozenset({b"host", b"content-length"})
_BODILESS = frozenset({b"GET", b"HEAD", b"DELETE", b"OPTIONS"})


@dataclass(frozen=True, slots=True)
class Origin:
    host: str  # as given to the resolver (no brackets for IPv6)
    port: int
    host_header: bytes  # value of the Host header: b"host:port"


def parse_origin(origin: str) -> Origin:
    """``"http://host:port"`` → ``Origin``; raises ``ConfigError`` for anything else."""
    if not origin.startswith("http://"):
        raise ConfigError([f"upstream origin {origin!r} must start with http://"])
    rest = origin[len("http://"):].rstrip("/")
    if not rest or any(c in rest for c in "/?#@ "):
        raise ConfigError([f"upstream origin {origin!r} must be http://host:port"])
    if rest.startswith("["):  # [v6]:port
        close = rest.find("]")
        if close < 0:
            raise ConfigError([f"upstream origin {origin!r}: unclosed IPv6 bracket"])
        host, tail = rest[1:close], rest[close + 1:]
        if tail and not tail.startswith(":"):
            raise ConfigError([f"upstream origin {origin!r} must be http://host:port"])
        port_text = tail[1:] if tail else ""
    else:
        host, _, port_text = rest.partition(":")
        if ":" in port_text:
            raise ConfigError([f"upstream origin {origin!r}: IPv6 hosts need brackets"])
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ConfigError([f"upstream origin {origin!r}: bad port {port_text!r}"])
        port = int(port_text)
    else:
        port = 80
    if not host:
        raise ConfigError([f"upstream origin {origin!r}: empty host"])
    return Origin(host, port, host_port(host, port).encode("ascii"))


def upstream_headers(origin: Origin, method: bytes, headers: Headers, body_length: int) -> Headers:
    """The header list to send: ``Host`` first, caller's end-to-end headers, ``content-length``."""
    named: frozenset[bytes] = frozenset()
    for name, value in headers:
        if name.lower() == b"connection":
            named = named | {t.strip().lower() for t in value.split(b",") if t.strip()}
    out: Headers = [(b"host", origin.host_header)]
    for name, value in headers:
        lower = name.lower()
        if lower in HOP_BY_HOP or lower in _SET_BY_POOL or lower in named:
            continue
        out.append((lower, value))
    if body_length or method not in _BODILESS:
        out.append((b"content-length", str(body_length).encode("ascii")))
    return out


_TOKEN = rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+"
_REQUEST_HEAD = re.compile(
    rb"%s [\x21-\x7e]+ HTTP/1\.1\r\n(?:%s: [\t\x20-\x7e\x80-\xff]*\r\n)*\r\n"
    % (_TOKEN, _TOKEN))


def request_bytes(method: bytes, target: bytes, headers: Headers, body: bytes) -> bytes:
    """The whole request as sent: head (checked, see the rules) and body in one buffer."""
    lines = [b"%s %s HTTP/1.1" % (method, target)]
    lines += [b"%s: %s" % pair for pair in headers]
    lines += (b"", body)
    data = b"\r\n".join(lines)
    head_length = len(data) - len(body)
    # one line per header: a CR or LF inside a field would add lines, or break the grammar
    if (_REQUEST_HEAD.fullmatch(data, 0, head_length) is None
            or data.count(b"\n", 0, head_length) != len(headers) + 2):
        fault = _first_fault(method, target, headers)
        raise BadRequest(f"request cannot be forwarded: invalid head {fault}",
                         reason="unforwardable_head")
    return data


def _first_fault(method: bytes, target: bytes, headers: Headers) -> str:
    """Which part of a refused head is at fault (only on the error path)."""
    if re.fullmatch(_TOKEN, method) is None:
        return f"(method {method!r})"
    if re.fullmatch(rb"[\x21-\x7e]+", target) is None:
        return f"(target {target!r})"
    for name, value in headers:
        if re.fullmatch(_TOKEN, name) is None:
            return f"(header name {name!r})"
        if re.fullmatch(rb"[\t\x20-\x7e\x80-\xff]*", value) is None:
            return f"(value of header {name.decode('latin-1')!r})"
    return ""
