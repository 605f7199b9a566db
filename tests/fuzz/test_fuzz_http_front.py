"""Fuzzing Cortex's HTTP front (issue 7 §4): the lean llhttp server with the real gateway handler
over a simulated vLLM engine, over real loopback sockets.

Property, for every input: the server answers with a status below 500 (4xx with an
OpenAI-style JSON error, or 2xx when the input happens to be a valid request), or — only for
framing it cannot answer — closes the connection; it never answers 500 from a bug, never
crashes, never leaves a connection stuck (every exchange ends within the client's timeout).
After all cases the server has counted no handler errors and still serves a valid request.

Targets: the request line, header blocks, chunked encodings, JSON bodies (random documents,
mutated chat bodies, invalid UTF-8, deep nesting, huge bodies), byte-mutated valid requests,
and slowloris (bytes dribbled under the header and body deadlines: cut at the deadline with
408). The number of cases run per target is printed at the end (``pytest -s``).

atheris was not tried (no attempt to install it was made); generation is hypothesis only.
"""

from __future__ import annotations

import json
import socket
import time
from collections import Counter
from collections.abc import Callable

import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.front_server import LIMITS, Answer, exchange, fuzz_front, read_answer
from tests.gateway_cluster import MODEL

CASES: Counter[str] = Counter()
OUTCOMES: Counter[str] = Counter()
FUZZ = settings(max_examples=120, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
CHAT = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}


async def run_fuzz(*targets: Callable[[int], None]) -> None:
    """Start a gateway, run each synchronous fuzz target against it in a worker thread, then
    check the server counted no handler error and still serves a valid request."""
    async with fuzz_front() as front:
        for target in targets:
            await trio.to_thread.run_sync(target, front.port)
        print("\nfuzz cases per target:", json.dumps(dict(sorted(CASES.items()))),
              "outcomes:", json.dumps(dict(sorted(OUTCOMES.items()))))
        counters = front.running.server.counters
        assert counters.handler_errors == 0, counters
        answer = await trio.to_thread.run_sync(
            exchange, front.port, request(body=json.dumps(CHAT).encode()))
        assert answer.status == 200, answer


def request(method: bytes = b"POST", target: bytes = b"/v1/chat/completions",
            headers: list[tuple[bytes, bytes]] | None = None, body: bytes = b"",
            version: bytes = b"HTTP/1.1", length: bool = True) -> bytes:
    lines = [method + b" " + target + b" " + version, b"host: fuzz"]
    lines += [name + b": " + value for name, value in headers or []]
    if length:
        lines.append(b"content-length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def check(target: str, answer: Answer, *, must_answer: bool = False) -> None:
    CASES[target] += 1
    if answer.status is None:
        OUTCOMES["closed"] += 1
        assert not must_answer, "closed without an answer to a well-framed request"
        return
    OUTCOMES[str(answer.status)] += 1
    assert answer.status < 500, answer
    if answer.status >= 400 and answer.body:  # (a HEAD request's answer has no body)
        error = json.loads(answer.body)["error"]
        assert isinstance(error["message"], str) and error["code"] == answer.status, answer


# --- request line ---------------------------------------------------------------------------

TOKENS = [b"GET", b"POST", b"HEAD", b"PUT", b"OPTIONS", b"CONNECT", b"PRI", b"post", b"G\x00T",
          b"", b"POST POST", b"\xff\xfe", b"GET\t"]
TARGETS = [b"/v1/chat/completions", b"/", b"*", b"http://x/v1/models", b"/v1/models?%zz",
           b"/\x00", b"/\xc3\x28", b"/" + b"a" * 20_000, b"", b"/v1/chat/completions#frag"]
VERSIONS = [b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/0.9", b"HTTP/1.1 x", b"http/1.1",
            b"HTTP/1.", b"HTTP/11", b""]


@FUZZ
@given(method=st.sampled_from(TOKENS) | st.binary(max_size=12),
       target=st.sampled_from(TARGETS) | st.binary(max_size=40),
       version=st.sampled_from(VERSIONS) | st.binary(max_size=10))
def fuzz_request_line(port: int, method: bytes, target: bytes, version: bytes) -> None:
    body = json.dumps(CHAT).encode()
    check("request_line", exchange(port, request(method, target, body=body,
                                                       version=version)))


# --- headers --------------------------------------------------------------------------------

NASTY_HEADERS = [
    (b"content-length", b"-1"), (b"content-length", b"99999999999999999999"),
    (b"content-length", b"1, 2"), (b"content-length", b"0x10"), (b"transfer-encoding", b"gzip"),
    (b"transfer-encoding", b"chunked, chunked"), (b"expect", b"100-continue"),
    (b"expect", b"bogus"), (b"x-cortex-assigned-worker", b"e9"), (b"connection", b"upgrade"),
    (b"upgrade", b"h2c"), (b"host", b""), (b" bad", b"x"), (b"bad name", b"x"),
    (b"x", b"a\rb"), (b"x", b"a\x00b"), (b"x", b"\xc3\x28"), (b"", b"empty name"),
    (b"x-data-parallel-rank", b"99"), (b"x-data-parallel-rank", b"-1"),
]
HEADER = st.sampled_from(NASTY_HEADERS) | st.tuples(st.binary(min_size=1, max_size=12),
                                                    st.binary(max_size=30))


@FUZZ
@given(headers=st.lists(HEADER, max_size=6), with_length=st.booleans())
def fuzz_headers(port: int, headers: list[tuple[bytes, bytes]], with_length: bool) -> None:
    body = json.dumps(CHAT).encode()
    data = request(headers=headers, body=body, length=with_length)
    check("headers", exchange(port, data))


def fuzz_header_limits(port: int) -> None:
    many = [(b"x-h%d" % i, b"v") for i in range(LIMITS.max_header_count + 5)]
    answer = exchange(port, request(headers=many, body=b"{}"))
    check("headers", answer, must_answer=True)
    assert answer.status == 431 and answer.closed
    big = [(b"x-big", b"v" * (LIMITS.max_header_bytes + 10))]
    answer = exchange(port, request(headers=big, body=b"{}"))
    check("headers", answer, must_answer=True)
    assert answer.status == 431 and answer.closed


# --- chunked encodings ----------------------------------------------------------------------

@st.composite
def chunked_body(draw: st.DrawFn) -> bytes:
    payload = json.dumps(CHAT).encode()
    cuts = sorted(draw(st.lists(st.integers(0, len(payload)), max_size=4)))
    pieces = [payload[a:b] for a, b in zip([0, *cuts], [*cuts, len(payload)], strict=True)]
    out = b""
    for piece in pieces:
        size = draw(st.sampled_from([b"%x" % len(piece)] * 4 + [
            b"%X" % len(piece), b"%x;ext=1" % len(piece), b"-%x" % len(piece), b"zz",
            b"%x" % (len(piece) + 1), b"ffffffffffffffffffff", b" %x" % len(piece), b""]))
        end = draw(st.sampled_from([b"\r\n"] * 4 + [b"\n", b"", b"\r\nxx"]))
        out += size + b"\r\n" + piece + end
    out += draw(st.sampled_from([b"0\r\n\r\n"] * 3 + [b"0\r\nx-trailer: 1\r\n\r\n", b"0\r\n",
                                                      b"", b"0;e\r\n\r\n", b"00000\r\n\r\n"]))
    return out


@FUZZ
@given(body=chunked_body(), also_length=st.booleans())
def fuzz_chunked(port: int, body: bytes, also_length: bool) -> None:
    headers = [(b"transfer-encoding", b"chunked")]
    if also_length:
        headers.append((b"content-length", b"%d" % len(body)))
    check("chunked", exchange(port, request(headers=headers, body=body, length=False)))


def fuzz_chunked_body_over_the_limit(port: int) -> None:
    chunk = b"x" * 65536
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk)
                    for _ in range(LIMITS.max_body_bytes // len(chunk) + 2))
    answer = exchange(port, request(headers=[(b"transfer-encoding", b"chunked")],
                                          body=body, length=False))
    check("chunked", answer, must_answer=True)
    assert answer.status == 413 and answer.closed


@FUZZ
@given(size=st.integers(LIMITS.max_body_bytes + 1, 2**64 - 1), sent=st.integers(0, 64),
       before=st.integers(0, 2048), extension=st.sampled_from([b"", b";a=b", b";x"]),
       upper=st.booleans(), zeros=st.integers(0, 3))
def fuzz_chunk_declared_over_the_limit(port: int, size: int, sent: int, before: int,
                                       extension: bytes, upper: bool, zeros: int) -> None:
    """A chunk whose size line alone says the body is too large: 413 at once, never the body
    deadline's 408 (issue 22 §9), whatever came before it and however the size is spelt."""
    first = b"%x\r\n%s\r\n" % (before, b"y" * before) if before else b""
    digits = (b"%X" if upper else b"%x") % size
    body = first + b"0" * zeros + digits + extension + b"\r\n" + b"z" * sent
    answer = exchange(port, request(headers=[(b"transfer-encoding", b"chunked")], body=body,
                                    length=False))
    check("chunked", answer, must_answer=True)
    assert answer.status == 413 and answer.closed, answer


# --- JSON bodies ----------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=5),
    max_leaves=30,
)
CHAT_FIELDS = ["model", "messages", "max_tokens", "max_completion_tokens", "stream",
               "stream_options", "n", "prompt", "temperature", "cache_salt", "routed_dp_rank",
               "continue_final_message", "add_generation_prompt", "tools", "response_format"]


def _clamped(field: str, value: object) -> object:
    """A fuzzed output length stays small (the engine would really produce it)."""
    if field in ("max_tokens", "max_completion_tokens") and type(value) is int and value > 8:
        return 8
    return value


@st.composite
def chat_mutation(draw: st.DrawFn) -> bytes:
    body: dict[str, object] = json.loads(json.dumps(CHAT))
    for _ in range(draw(st.integers(1, 3))):
        field = draw(st.sampled_from(CHAT_FIELDS))
        if draw(st.booleans()):
            body[field] = _clamped(field, draw(JSON))
        elif field == "messages":
            body["messages"] = draw(st.lists(st.dictionaries(
                st.sampled_from(["role", "content", "name", "tool_calls"]), JSON, max_size=3),
                max_size=3))
        else:
            body.pop(field, None)
    return json.dumps(body).encode()


@FUZZ
@given(body=chat_mutation())
def fuzz_mutated_chat_bodies(port: int, body: bytes) -> None:
    check("json_chat", exchange(port, request(body=body)), must_answer=True)


@FUZZ
@given(value=JSON, path=st.sampled_from([b"/v1/chat/completions", b"/v1/completions",
                                          b"/generate"]))
def fuzz_random_json_documents(port: int, value: object, path: bytes) -> None:
    check("json_random", exchange(port, request(target=path, body=json.dumps(value)
                                                      .encode())), must_answer=True)


@FUZZ
@given(raw=st.binary(max_size=200), where=st.sampled_from(["content", "model", "key", "raw"]))
def fuzz_invalid_utf8(port: int, raw: bytes, where: str) -> None:
    bad = raw + b"\xc3\x28\xff\xed\xa0\x80"  # invalid sequence, 0xff, a surrogate
    if where == "content":
        body = b'{"model":"%s","max_tokens":2,"messages":[{"role":"user","content":"%s"}]}' % (
            MODEL.encode(), bad.replace(b'"', b"").replace(b"\\", b""))
    elif where == "model":
        body = b'{"model":"%s","messages":[]}' % bad.replace(b'"', b"").replace(b"\\", b"")
    elif where == "key":
        body = b'{"%s": 1}' % bad.replace(b'"', b"").replace(b"\\", b"")
    else:
        body = bad
    check("invalid_utf8", exchange(port, request(body=body)), must_answer=True)


def fuzz_deeply_nested_bodies(port: int) -> None:
    for depth in (64, 500):  # deeper: see test_deeply_nested_json_is_a_client_error
        _nested(port, depth)


def fuzz_very_deeply_nested_bodies(port: int) -> None:
    for depth in (1_000, 100_000):
        _nested(port, depth)


def _nested(port: int, depth: int) -> None:
    nested = b"[" * depth + b"]" * depth
    for body in (nested, b'{"model":"%s","messages":[{"role":"user","content":%s}]}' % (
            MODEL.encode(), nested), b'{"model":"%s","messages":%s}' % (MODEL.encode(), nested)):
        check("deep_nesting", exchange(port, request(body=body)), must_answer=True)


def fuzz_huge_bodies(port: int) -> None:
    over = b"x" * (LIMITS.max_body_bytes + 1)
    answer = exchange(port, request(body=over))
    check("huge_body", answer, must_answer=True)
    assert answer.status == 413
    # Just under the limit: one huge message, a valid request.
    text = "word " * ((LIMITS.max_body_bytes - 200) // 5)
    body = json.dumps({"model": MODEL, "max_tokens": 1,
                       "messages": [{"role": "user", "content": text}]}).encode()
    assert len(body) <= LIMITS.max_body_bytes
    answer = exchange(port, request(body=body), timeout_s=120)  # ~200k tokens, twice
    check("huge_body", answer, must_answer=True)
    # A declared length above the limit is refused before the body is read.
    answer = exchange(port, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                                  b"content-length: %d\r\n\r\n" % (LIMITS.max_body_bytes * 8))
    check("huge_body", answer, must_answer=True)
    assert answer.status == 413 and answer.closed


# --- byte-level mutation of a valid request --------------------------------------------------

VALID = [request(body=json.dumps(CHAT).encode()),
         request(body=json.dumps({**CHAT, "stream": True}).encode()),
         request(method=b"GET", target=b"/v1/models", length=False),
         request(headers=[(b"transfer-encoding", b"chunked")], length=False,
                 body=b"%x\r\n%s\r\n0\r\n\r\n" % (len(json.dumps(CHAT)), json.dumps(CHAT)
                                                    .encode()))]


@st.composite
def mutated_request(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["flip", "insert", "delete", "crlf"]))
        if op == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=6))
        elif op == "delete":
            del data[at:at + draw(st.integers(1, 6))]
        else:
            data[at:at] = b"\r\n"
    return bytes(data)


@settings(FUZZ, max_examples=80)
@given(data=mutated_request())
def fuzz_mutated_requests(port: int, data: bytes) -> None:
    check("mutated_bytes", exchange(port, data))


# --- slowloris ------------------------------------------------------------------------------

def _dribble(port: int, data: bytes, gap_s: float) -> tuple[Answer, float]:
    pieces = [data[i:i + 1] for i in range(len(data))]
    began = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            for piece in pieces:
                sock.sendall(piece)
                time.sleep(gap_s)  # the client is slow on purpose (slowloris)
        except (BrokenPipeError, ConnectionResetError):
            pass  # cut at the deadline, as it should be
        answer = read_answer(sock)
    return answer, time.monotonic() - began


def fuzz_slowloris_head_is_cut_at_the_header_deadline(port: int) -> None:
    data = request(body=json.dumps(CHAT).encode())
    answer, elapsed = _dribble(port, data[:60], 0.05)  # 60 bytes over 3 s, deadline 0.4 s
    check("slowloris", answer, must_answer=True)
    assert answer.status == 408 and answer.closed
    assert elapsed < 3 + 2  # the answer came when the deadline passed, not when we stopped


def fuzz_slowloris_body_is_cut_at_the_body_deadline(port: int) -> None:
    body = json.dumps(CHAT).encode()
    head = request(body=body)[: -len(body)]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head)
        began = time.monotonic()
        try:
            for i in range(len(body)):
                sock.sendall(body[i:i + 1])
                time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = read_answer(sock)
    check("slowloris", answer, must_answer=True)
    assert answer.status == 408 and answer.closed
    assert time.monotonic() - began < len(body) * 0.05 + 2


# --- the tests: one gateway each, targets grouped ---------------------------------------------

async def test_fuzz_framing() -> None:
    """Request lines, header blocks, chunked encodings, byte-mutated valid requests."""
    await run_fuzz(fuzz_request_line, fuzz_headers, fuzz_header_limits, fuzz_chunked,
                   fuzz_chunked_body_over_the_limit, fuzz_chunk_declared_over_the_limit,
                   fuzz_mutated_requests)


async def test_fuzz_bodies() -> None:
    """JSON documents, mutated chat bodies, invalid UTF-8, deep nesting, huge bodies."""
    await run_fuzz(fuzz_mutated_chat_bodies, fuzz_random_json_documents, fuzz_invalid_utf8,
                   fuzz_deeply_nested_bodies, fuzz_huge_bodies)


async def test_deeply_nested_json_is_a_client_error() -> None:
    await run_fuzz(fuzz_very_deeply_nested_bodies)


async def test_slowloris() -> None:
    """Bytes dribbled under the header and body deadlines: cut with 408 at the deadline."""
    await run_fuzz(fuzz_slowloris_head_is_cut_at_the_header_deadline,
                   fuzz_slowloris_body_is_cut_at_the_body_deadline)
