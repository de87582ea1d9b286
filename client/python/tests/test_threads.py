"""Many Python threads sharing one client fetch in parallel (GIL released)."""

import sys
import threading

import numpy as np



def test_eight_threads_fetch_concurrently(client, name):
    full = np.random.default_rng(5).standard_normal((256, 64)).astype(np.float32)
    client.put(name, full, chunk_dim=0, placements=["rank:0", "rank:1", "rank:2", "rank:3"])
    errors = []

    def fetch(seed):
        try:
            rng = np.random.default_rng(seed)
            buf = None
            for _ in range(25):
                a = int(rng.integers(0, 256))
                b = int(rng.integers(a, 257))
                got = client.get(name, np.s_[a:b, 3:-3])
                assert np.array_equal(got, full[a:b, 3:-3])
                if buf is None:
                    buf = np.empty((32, 64), np.float32)
                client.get(name, np.s_[a // 2:a // 2 + 32], out=buf)
                assert np.array_equal(buf, full[a // 2:a // 2 + 32])
        except BaseException as e:  # report in the main thread
            errors.append(e)

    threads = [threading.Thread(target=fetch, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    client.delete(name)


def test_gil_is_released_during_fetches(client, name):
    """With a huge switch interval a thread keeps the GIL until it blocks, so
    two fetches can only be in flight together if the SDK releases the GIL."""
    full = np.arange(512 * 512, dtype=np.float64).reshape(512, 512)
    client.put(name, full, chunk_dim=0, placements=["rank:0", "rank:1", "rank:2", "rank:3"])
    lock = threading.Lock()
    in_flight = [0]
    most = [0]

    def fetch():
        for _ in range(10):
            with lock:
                in_flight[0] += 1
                most[0] = max(most[0], in_flight[0])
            got = client.get(name)
            with lock:
                in_flight[0] -= 1
            assert got[511, 511] == full[511, 511]

    old = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    try:
        threads = [threading.Thread(target=fetch) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert most[0] >= 2
    client.delete(name)
