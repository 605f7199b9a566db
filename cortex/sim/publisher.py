"""One simulated engine publisher per DP rank: a PUB socket and an optional replay ROUTER.

Thin trio shell over pyzmq (through ``cortex.events.zmq_trio``, never blocking the loop); the
bytes come from ``cortex.sim.wire`` and the delivery faults from ``cortex.sim.faults``.

Rules (kv-events.md §2 and §6):

* ``publish(payload)`` assigns the next sequence number (0, 1, 2, ... per non-empty batch),
  appends ``(seq, payload)`` to the replay buffer (the newest ``buffer_steps`` batches) and
  queues the batch for sending. It never waits, so a synchronous engine step can call it.
* The sender task sends queued batches as ``[topic, seq, payload]`` in order, through the
  fault injector (drops, duplicates, swaps) and honouring stalls and pauses.
* The replay task answers ``[identity, b"", start_seq]`` with every buffered batch whose
  ``seq >= start_seq``, ascending, then the end marker, in the profile's reply generation.
  Malformed requests get no answer at all (like the engines).
* The live socket is an XPUB (a PUB to subscribers) so the simulator can tell when a
  subscription has arrived: ``wait_subscribed()`` returns once one has. Messages published
  before that reach nobody (ZeroMQ's slow-joiner effect), as with a real engine.
* ``restart()`` is an engine process restart: sequence back to 0, replay buffer emptied,
  unsent batches lost. The sockets stay bound (subscribers see the sequence go backwards).
"""

from __future__ import annotations

import errno
import random
import socket
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import trio
import zmq

from cortex.events import zmq_trio
from cortex.sim.faults import BatchFaults, FaultInjector
from cortex.sim.wire import (
    ReplayGeneration,
    live_frames,
    parse_replay_request,
    replay_data_frames,
    replay_end_frames,
)

Batch = tuple[int, bytes]  # (seq, payload)


@dataclass(slots=True)
class PublisherCounters:
    published: int = 0  # batches given a sequence number
    sent: int = 0  # live messages actually sent (duplicates count twice)
    replay_requests: int = 0
    replayed: int = 0  # batches re-sent through replay
    malformed_requests: int = 0


class EventPublisher:
    """Publishes one DP rank's batches; owns (and closes) the two sockets it is given."""

    def __init__(
        self,
        pub: zmq.Socket,
        router: zmq.Socket | None,
        *,
        topic: bytes,
        replay_generation: ReplayGeneration,
        buffer_steps: int = 10_000,
        rng: random.Random | None = None,
        reorder_max_hold_s: float = 0.5,
    ) -> None:
        if buffer_steps < 1:
            raise ValueError("buffer_steps must be at least 1")
        self.pub = pub
        self.router = router
        self.topic = topic
        self.replay_generation = replay_generation
        self.faults: FaultInjector[Batch] = FaultInjector(rng)
        self.counters = PublisherCounters()
        self.reorder_max_hold_s = reorder_max_hold_s
        self.next_seq = 0
        self._buffer: deque[Batch] = deque(maxlen=buffer_steps)
        self._queue: deque[tuple[Batch, BatchFaults]] = deque()
        self._wakeup = trio.Event()
        self._resumed = trio.Event()
        self._resumed.set()
        self._stall_until = 0.0
        self._epoch = 0  # bumped by restart(): batches of an older epoch are never sent
        self._subscribed = trio.Event()

    @property
    def pub_endpoint(self) -> str:
        return zmq_trio.bound_endpoint(self.pub)

    @property
    def replay_endpoint(self) -> str | None:
        return None if self.router is None else zmq_trio.bound_endpoint(self.router)

    def buffered(self) -> list[Batch]:
        return list(self._buffer)

    def publish(self, payload: bytes) -> int:
        """Give ``payload`` the next sequence number, buffer it and queue it. Returns the seq."""
        seq = self.next_seq
        self.next_seq += 1
        self._buffer.append((seq, payload))
        self._queue.append(((seq, payload), self.faults.decide()))
        self.counters.published += 1
        self._wakeup.set()
        return seq

    async def wait_subscribed(self) -> None:
        """Return once at least one subscriber's subscription has reached this publisher."""
        await self._subscribed.wait()

    def restart(self) -> None:
        self.next_seq = 0
        self._buffer.clear()
        self._queue.clear()
        self.faults.reset()
        self._epoch += 1

    def stall(self, seconds: float) -> None:
        """Send nothing for ``seconds`` (batches queue up, nothing is lost)."""
        self._stall_until = max(self._stall_until, trio.current_time() + seconds)

    def pause(self) -> None:
        """Stop sending until ``resume()``."""
        if self._resumed.is_set():
            self._resumed = trio.Event()

    def resume(self) -> None:
        self._resumed.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._send_loop)
                nursery.start_soon(self._subscription_loop)
                if self.router is not None:
                    nursery.start_soon(self._replay_loop, self.router)
                task_status.started()
        finally:
            self.pub.close(linger=0)
            if self.router is not None:
                self.router.close(linger=0)

    async def _next_batch(self) -> tuple[Batch, BatchFaults] | None:
        """The next queued batch; None when a held (reordered) batch waited long enough."""
        while not self._queue:
            self._wakeup = trio.Event()
            if not self.faults.holding:
                await self._wakeup.wait()
                continue
            with trio.move_on_after(self.reorder_max_hold_s):
                await self._wakeup.wait()
            if not self._queue:
                return None
        return self._queue.popleft()

    async def _send_loop(self) -> None:
        while True:
            queued = await self._next_batch()
            epoch = self._epoch
            await self._resumed.wait()
            await trio.sleep_until(self._stall_until)
            if queued is not None and queued[1].stall_s > 0:
                await trio.sleep(queued[1].stall_s)
            if epoch != self._epoch:
                continue  # the engine restarted while this batch waited: it is gone
            outgoing = self.faults.take_held() if queued is None else self.faults.route(*queued)
            for seq, payload in outgoing:
                await zmq_trio.send_multipart(self.pub, live_frames(self.topic, seq, payload))
                self.counters.sent += 1

    async def _subscription_loop(self) -> None:
        # XPUB delivers one frame per (un)subscription: 0x01 or 0x00, then the topic prefix.
        # Sending on an XPUB never waits (it drops), so this is the socket's only waiter.
        while True:
            frames = await zmq_trio.recv_multipart(self.pub)
            if frames and frames[0][:1] == b"\x01":
                self._subscribed.set()

    async def _replay_loop(self, router: zmq.Socket) -> None:
        while True:
            request = parse_replay_request(await zmq_trio.recv_multipart(router))
            if request is None:
                self.counters.malformed_requests += 1
                continue
            identity, start_seq = request
            self.counters.replay_requests += 1
            for count, (seq, payload) in enumerate(b for b in self.buffered() if b[0] >= start_seq):
                frames = replay_data_frames(self.replay_generation, self.topic, seq, payload)
                await zmq_trio.send_multipart(router, [identity, *frames])
                self.counters.replayed += 1
                if count % 256 == 255:
                    await trio.lowlevel.checkpoint()
            end = replay_end_frames(self.replay_generation)
            await zmq_trio.send_multipart(router, [identity, *end])


# ---------------------------------------------------------------- ports and sockets


def find_free_port_range(count: int, host: str = "127.0.0.1", *, attempts: int = 50) -> int:
    """A port P such that P .. P+count-1 were all free on ``host`` just now (bind-probe).

    Candidates lie below the kernel's ephemeral range (``ip_local_port_range``), where no
    outgoing connection ever takes a port: inside it a busy host (a test suite's thousands of
    client connections) holds so many odd ports that six in a row are rarely all free. Then,
    as a fallback, ports the kernel hands out for bind(0). Someone may take them before they
    are bound again; ``bind_rank_sockets`` retries then.
    """
    if count < 1:
        raise ValueError("count must be at least 1")
    low, _ = ephemeral_port_range()
    rng = random.Random()
    for attempt in range(2 * attempts):
        probes: list[socket.socket] = []
        try:
            if attempt < attempts and low - count > _QUIET_PORTS_FROM:
                base = rng.randrange(_QUIET_PORTS_FROM, low - count)
            else:
                first = _probe_socket()
                probes.append(first)
                first.bind((host, 0))
                base = first.getsockname()[1]
            if base + count - 1 > 65535:
                continue
            for port in range(base + len(probes), base + count):
                probe = _probe_socket()
                probes.append(probe)
                probe.bind((host, port))
            return base
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
        finally:
            for probe in probes:
                probe.close()
    raise OSError(errno.EADDRINUSE, f"no {count} contiguous free ports on {host}")


_QUIET_PORTS_FROM = 20_000  # registered services rarely sit between this and the ephemeral range


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' ports (Linux's default where unreadable)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(part) for part in f.read().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def _probe_socket() -> socket.socket:
    """A probe that binds as ZeroMQ will (``SO_REUSEADDR``): a port held only by a closed
    connection in TIME_WAIT is free to it — the kernel hands bind(0) even ports and outgoing
    connections odd ones, so on a busy host the port after a free one is often such a leftover."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return probe


@dataclass(slots=True)
class RankSockets:
    pub: zmq.Socket
    router: zmq.Socket | None


def _open(ctx: zmq.Context, kind: int, endpoint: str, sndhwm: int | None) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.linger = 0
    if sndhwm is not None:
        sock.sndhwm = sndhwm
        sock.rcvhwm = sndhwm
    try:
        sock.bind(endpoint)
    except BaseException:
        sock.close(linger=0)
        raise
    return sock


def _close_all(bound: Sequence[RankSockets]) -> None:
    for rank in bound:
        rank.pub.close(linger=0)
        if rank.router is not None:
            rank.router.close(linger=0)


def bind_rank_sockets(
    ctx: zmq.Context,
    dp_size: int,
    *,
    host: str = "127.0.0.1",
    base_port: int | None = None,
    replay_base_port: int | None = None,
    replay: bool = True,
    hwm: int = 100_000,
    router_sndhwm: int | None = None,
    attempts: int = 20,
) -> tuple[list[RankSockets], int, int | None]:
    """Bind an XPUB on ``base + rank`` (and a ROUTER on ``replay_base + rank``) for every rank.

    Ports left as None are found by bind-probing a free contiguous range (the PUB range and the
    replay range side by side); a bind that then hits EADDRINUSE closes everything and retries
    with a new range. Explicit ports are bound as given (EADDRINUSE propagates).
    Returns the sockets (index = rank), the PUB base port and the replay base port.
    """
    auto = base_port is None or (replay and replay_base_port is None)
    for attempt in range(attempts if auto else 1):
        ranges = 2 if replay and base_port is None and replay_base_port is None else 1
        probed = find_free_port_range(dp_size * ranges, host) if auto else 0
        base = base_port if base_port is not None else probed
        replay_base = None
        if replay:
            replay_base = replay_base_port
            if replay_base is None:
                replay_base = probed + dp_size if base_port is None else probed
        overlap = replay_base is not None and abs(replay_base - base) < dp_size
        if overlap and auto:
            continue
        bound: list[RankSockets] = []
        try:
            for rank in range(dp_size):
                pub = _open(ctx, zmq.XPUB, f"tcp://{host}:{base + rank}", hwm)
                bound.append(RankSockets(pub, None))
                if replay_base is not None:
                    endpoint = f"tcp://{host}:{replay_base + rank}"
                    bound[-1].router = _open(ctx, zmq.ROUTER, endpoint, router_sndhwm)
        except zmq.ZMQError as exc:
            _close_all(bound)
            if exc.errno != errno.EADDRINUSE or not auto or attempt == attempts - 1:
                raise
            continue
        return bound, base, replay_base
    raise OSError(errno.EADDRINUSE, f"could not bind {dp_size} contiguous ports on {host}")
