"""Quotas from Python: a put past its principal's quota raises
ResourceExhausted and leaves nothing; quota() shows use and limits."""
import asyncio
import os
import tempfile

import numpy as np
import pytest

import tessera
import tessera.aio
from conftest import Cluster


def test_a_put_past_the_quota_raises_and_quota_shows_use():
    quotas = tempfile.NamedTemporaryFile("w", suffix=".quotas", delete=False)
    quotas.write("* 1M 2\n")  # no tokens: every caller is 'anonymous'
    quotas.close()
    c = Cluster(num_workers=2, coordinator_flags=[f"--quotas={quotas.name}"])
    try:
        client = tessera.connect(c.address)
        client.put("q1", np.zeros((2, 65536), dtype=np.float32),  # 512 KiB
                   chunk_dim=0, placements=["rank:0", "rank:1"])
        assert client.describe("q1").owner is None  # nobody is named
        with pytest.raises(tessera.ResourceExhausted,
                           match=r"quota: principal 'anonymous' uses 524288 "
                                 r"of its 1048576 bytes; creating 'q2' needs "
                                 r"1048576 more"):
            client.put("q2", np.zeros((2, 131072), dtype=np.float32),
                       chunk_dim=0, placements=["rank:0", "rank:1"])
        assert [t.name for t in client.list()] == ["q1"]
        assert client.quota() == [{"principal": "anonymous", "bytes": 524288,
                                   "bytes_limit": 1048576, "names": 1,
                                   "names_limit": 2}]

        async def from_asyncio():
            aclient = await tessera.aio.connect(c.address)
            return await aclient.quota()
        assert asyncio.run(from_asyncio())[0]["bytes"] == 524288
    finally:
        c.stop()
        os.unlink(quotas.name)
