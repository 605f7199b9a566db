import trio
import trio.lowlevel
import zmq

from cortex.events import zmq_trio


async def test_dealer_router_roundtrip_without_blocking_the_loop():
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    router.bind("tcp://127.0.0.1:*")
    dealer = ctx.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.connect(zmq_trio.bound_endpoint(router))
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await trio.lowlevel.checkpoint()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker)
            await zmq_trio.send_multipart(dealer, [b"", b"ping"])
            ident, empty, body = await zmq_trio.recv_multipart(router)
            assert (empty, body) == (b"", b"ping")
            await zmq_trio.send_multipart(router, [ident, b"", b"pong"])
            assert await zmq_trio.recv_multipart(dealer) == [b"", b"pong"]
            assert zmq_trio.try_recv_multipart(dealer) is None
            nursery.cancel_scope.cancel()
        assert ticks > 0
    finally:
        dealer.close()
        router.close()
