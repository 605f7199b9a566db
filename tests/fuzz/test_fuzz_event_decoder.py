"""Fuzzing KV-event ingestion through the real subscriber (issue 7 §4), over real ZeroMQ.

``tests/property/test_decoder_fuzz.py`` proves the pure decoder's contract (only DecodeError
escapes; the fast path equals the reference). This extends it to the I/O shell: the same
mutated fixture payloads (byte mutations, near-valid structures, random bytes) and broken
framings are published on a live stream to ``run_source`` feeding a real ``LedgerBook``, and:

* every message is counted exactly as an offline classification predicts — broken framing as
  ``malformed_frames``, an undecodable payload as ``decode_errors`` — and every decodable batch
  is applied (the real ledger accepts whatever the decoder produces without raising);
* ingestion never dies: a valid sentinel batch published after all the fuzz is applied.

Hypothesis runs in a worker thread that owns the publishing socket; the subscriber runs in the
test's trio loop. The number of cases is printed (``pytest -s``).
"""

from __future__ import annotations

from collections import Counter
from functools import partial

import trio
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cortex.errors import DecodeError
from cortex.events.counters import IngestCounters
from cortex.events.decoder import decode_payload
from cortex.events.frames import parse_live_frames
from cortex.events.source import EventSource
from cortex.events.subscriber import run_source
from cortex.ledger.book import LedgerBook
from cortex.ledger.kv_events import EngineFamily
from tests.property.test_decoder_fuzz import LIVE, PAYLOADS, mutated, mutated_frames, near_valid

TOPIC = b"kv"
FUZZ = settings(max_examples=400, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def classify(frames: list[bytes], family: EngineFamily) -> str:
    """What the subscriber must count for this message."""
    try:
        live = parse_live_frames(frames)
    except DecodeError:
        return "malformed"
    try:
        decode_payload(live.payload, family)
    except DecodeError:
        return "decode_error"
    return "applied"


class Wire:
    """The publishing side; every method runs in the hypothesis worker thread."""

    def __init__(self, ctx: zmq.Context, family: EngineFamily) -> None:
        self.sock = ctx.socket(zmq.XPUB)
        self.sock.linger = 0
        self.sock.sndhwm = 0  # never drop on the way: every message must arrive
        self.sock.bind("tcp://127.0.0.1:*")
        self.endpoint = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.family = family
        self.next_seq = 0
        self.expected: Counter[str] = Counter()

    def wait_subscribed(self) -> None:
        self.sock.rcvtimeo = 30_000
        while self.sock.recv()[:1] != b"\x01":
            pass

    def send(self, frames: list[bytes]) -> None:
        self.expected[classify(frames, self.family)] += 1
        self.sock.send_multipart(frames)

    def sequenced(self, payload: bytes) -> list[bytes]:
        frames = [TOPIC, self.next_seq.to_bytes(8, "big"), payload]
        self.next_seq += 1
        return frames


PAYLOAD = mutated(PAYLOADS) | near_valid() | st.binary(max_size=64)


@FUZZ
@given(payload=PAYLOAD, broken=st.none() | mutated_frames(LIVE))
def feed(wire: Wire, payload: bytes, broken: list[bytes] | None) -> None:
    if broken is not None:  # ZeroMQ itself filters messages whose first frame is off-topic
        broken = [TOPIC + broken[0][len(TOPIC):], *broken[1:]] if broken else [TOPIC]
    if broken is not None and classify(broken, wire.family) == "malformed":
        wire.send(broken)  # broken framing: no sequence number is used up
    else:
        wire.send(wire.sequenced(payload))


async def fuzz_through_subscriber(family: EngineFamily) -> dict[str, int]:
    ctx = zmq.Context()
    wire = Wire(ctx, family)
    book = LedgerBook()
    target = book.register("w0", 0, family, "m")
    counters = IngestCounters()
    source = EventSource("w0", 0, family, "m", wire.endpoint, None, TOPIC)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(run_source, source, target, book, ctx=ctx,
                                        counters=counters))
            await trio.to_thread.run_sync(wire.wait_subscribed)
            await trio.to_thread.run_sync(feed, wire)
            sent = sum(wire.expected.values())
            sentinel = next(p for p in PAYLOADS if classify([TOPIC, bytes(8), p], family)
                            == "applied")
            await trio.to_thread.run_sync(wire.send, wire.sequenced(sentinel))
            with trio.fail_after(30):
                while counters.messages < sent + 1:
                    await trio.sleep(0.01)  # the stream is processed in order; poll its count
            assert counters.malformed_frames == wire.expected["malformed"], counters
            assert counters.decode_errors == wire.expected["decode_error"], counters
            assert counters.batches_applied == wire.expected["applied"], counters
            nursery.cancel_scope.cancel()
    finally:
        wire.sock.close(linger=0)
        ctx.destroy(linger=0)
    return dict(wire.expected)


async def test_fuzzed_stream_is_counted_and_survived_vllm() -> None:
    figures = await fuzz_through_subscriber(EngineFamily.VLLM)
    print("\nsubscriber fuzz (vllm):", figures)
    assert figures["malformed"] > 0 and figures["decode_error"] > 0 and figures["applied"] > 0


async def test_fuzzed_stream_is_counted_and_survived_sglang() -> None:
    figures = await fuzz_through_subscriber(EngineFamily.SGLANG)
    print("\nsubscriber fuzz (sglang):", figures)
    assert figures["malformed"] > 0 and figures["decode_error"] > 0 and figures["applied"] > 0
