"""tessera.aio against a real local cluster: the awaitable calls return what
the synchronous ones do, the event loop keeps running while calls wait, and
cancelling an awaited call cancels its RPCs (its thread is free at once,
although the worker it waits on is hung)."""
import asyncio
import os
import signal
import time

import numpy as np
import pytest

import tessera
import tessera.aio


def test_awaitable_calls_match_the_synchronous_ones(cluster, name):
    async def main():
        async with await tessera.aio.connect(cluster.address) as c:
            a = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)
            meta = await c.put(name, a, chunk_dim=0, placements=["rank:0", "rank:1"])
            assert tuple(meta.shape) == (64, 8)
            np.testing.assert_array_equal(await c.get(name), a)
            np.testing.assert_array_equal(await c.get(name, np.s_[10:20, 2:5]), a[10:20, 2:5])
            np.testing.assert_array_equal(await c.get_rows(name, [5, 1, 5]), a[[5, 1, 5]])
            await c.update(name, np.ones((2, 8), dtype=np.float32), np.s_[0:2, :])
            assert (await c.describe(name)).version == 2
            stats = await c.reshard(name, chunk_dim=1, placements=["rank:2", "rank:3"])
            assert stats.version == 3
            got = await c.get(name)
            np.testing.assert_array_equal(got[2:], a[2:])
            assert (got[:2] == 1).all()
            assert name in [t.name for t in await c.list()]
            assert len(await c.workers()) == 4
            await c.delete(name)
            with pytest.raises(tessera.NotFound):
                await c.describe(name)

    asyncio.run(main())


def test_sixteen_concurrent_gets_do_not_block_the_loop(cluster, name):
    async def main():
        c = await tessera.aio.connect(cluster.address)
        a = np.arange(4096 * 256, dtype=np.int32).reshape(4096, 256)
        await c.put(name, a, chunk_dim=0, placements=["rank:0", "rank:1", "rank:2", "rank:3"])
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.001)
                ticks += 1

        tick = asyncio.create_task(ticker())
        start = time.monotonic()
        for _ in range(20):
            rows = await asyncio.gather(*(c.get(name, np.s_[i * 64:(i + 1) * 64, :])
                                          for i in range(16)))
            for i, r in enumerate(rows):
                np.testing.assert_array_equal(r, a[i * 64:(i + 1) * 64])
        elapsed = time.monotonic() - start
        tick.cancel()
        # The loop ran its ticker all along (a blocked loop would not).
        assert ticks >= elapsed / 0.001 / 10, (ticks, elapsed)
        await c.delete(name)
        await c.close()

    asyncio.run(main())


def test_cancelling_an_awaited_get_cancels_its_rpc(cluster, name):
    client = tessera.connect(cluster.address)
    client.create(name, [1024, 256], "float32", chunk_dim=0,
                  placements=["rank:3"], init="ones")
    pid = cluster.workers[3].pid

    async def main():
        c = tessera.aio.AsyncClient(client)
        os.kill(pid, signal.SIGSTOP)
        try:
            task = asyncio.create_task(c.get(name))
            await asyncio.sleep(0.3)
            assert not task.done()  # waiting on the hung worker
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The call itself ended (CANCELLED), the worker still hung: its
            # data timeout is 30 minutes.
            deadline = time.monotonic() + 5
            while c._in_flight and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert c._in_flight == 0
            # asyncio.wait_for's timeout cancels the same way.
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(c.get(name), 0.3)
        finally:
            os.kill(pid, signal.SIGCONT)
        np.testing.assert_array_equal(await c.get(name), np.ones((1024, 256), np.float32))

    asyncio.run(main())
    client.delete(name)
