"""A background loop whose awaited library swallows a cancellation still stops (a router's
shutdown once waited forever for its shared-load loop)."""

from __future__ import annotations

import asyncio

from gpuroute.runtime import BackgroundLoop


def test_a_loop_that_swallows_one_cancellation_is_stopped_by_the_next() -> None:
    swallowed: list[int] = []

    async def loop() -> None:
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:  # as a library that turns it into its own error
                swallowed.append(1)
                if len(swallowed) > 1:
                    raise

    async def run() -> None:
        background = BackgroundLoop()
        background.start(loop())
        await asyncio.sleep(0)  # the loop runs up to its first await
        async with asyncio.timeout(5):
            await background.stop()

    asyncio.run(run())
    assert swallowed == [1, 1]


def test_a_loop_that_ends_on_its_first_cancellation_is_cancelled_once() -> None:
    cancelled: list[int] = []

    async def loop() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(1)
            raise

    async def run() -> None:
        background = BackgroundLoop()
        background.start(loop())
        await asyncio.sleep(0)
        await background.stop()

    asyncio.run(run())
    assert cancelled == [1]
