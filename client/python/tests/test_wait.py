"""Waiting for a tensor's next version: answered at the commit, nothing polls."""
import asyncio
import threading
import time

import numpy as np
import pytest

import tessera
import tessera.aio
from conftest import Cluster


def _update_later(client, name, value, delay):
    def run():
        time.sleep(delay)
        client.update(name, np.full(8, value, dtype=np.int32))
    t = threading.Thread(target=run)
    t.start()
    return t


def test_wait_returns_at_the_commit_of_the_next_version(client, name):
    client.create(name, (8,), "int32", chunk_dim=0, placements=["rank:0", "rank:1"])
    assert client.wait(name, version=1) == 1  # already there: at once
    writer = _update_later(client, name, 7, 0.5)
    start = time.monotonic()
    assert client.wait(name, timeout=30) == 2
    waited = time.monotonic() - start
    writer.join()
    assert 0.4 < waited < 10, waited
    # The new version's bytes are there when the wait returns.
    assert (client.get(name) == 7).all()
    client.delete(name)


def test_a_wait_times_out_or_finds_no_tensor(client, name):
    client.create(name, (8,), "int32", chunk_dim=0, placements=["rank:0"])
    with pytest.raises(tessera.DeadlineExceeded, match="timeout"):
        client.wait(name, timeout=0.3)
    with pytest.raises(tessera.NotFound):
        client.wait(name + "-nothing", timeout=1)
    # Deleted while waited on.
    threading.Timer(0.3, lambda: client.delete(name)).start()
    with pytest.raises(tessera.NotFound):
        client.wait(name, timeout=10)


def test_one_commit_wakes_every_async_waiter_and_a_cancelled_one_ends(cluster, client, name):
    client.create(name, (8,), "int32", chunk_dim=0, placements=["rank:0"])

    async def main():
        async with await tessera.aio.connect(cluster.address) as c:
            waits = [asyncio.ensure_future(c.wait(name, timeout=30)) for _ in range(16)]
            gone = asyncio.ensure_future(c.wait(name, timeout=30))
            await asyncio.sleep(0.3)
            gone.cancel()
            writer = _update_later(client, name, 3, 0.2)
            versions = await asyncio.gather(*waits)
            writer.join()
            with pytest.raises(asyncio.CancelledError):
                await gone
            return versions

    assert asyncio.run(main()) == [2] * 16
    client.delete(name)


def test_the_coordinator_bounds_its_waiters(name):
    c = Cluster(num_workers=1, coordinator_flags=["--max_waiters=2"])
    try:
        client = tessera.connect(c.address)
        client.create(name, (4,), "int32", chunk_dim=0, placements=["rank:0"])
        held = [threading.Thread(target=lambda: pytest.raises(
            tessera.DeadlineExceeded, client.wait, name, timeout=3)) for _ in range(2)]
        for t in held:
            t.start()
        time.sleep(1)
        with pytest.raises(tessera.ResourceExhausted, match="waiters"):
            client.wait(name, timeout=1)
        for t in held:
            t.join()
        # Their places are free again.
        with pytest.raises(tessera.DeadlineExceeded):
            client.wait(name, timeout=0.2)
        client.close()
    finally:
        c.stop()
