import trio
import trio.lowlevel

import cortex


def test_version():
    assert cortex.__version__


async def test_trio_mode_runs_async_tests():
    await trio.lowlevel.checkpoint()
