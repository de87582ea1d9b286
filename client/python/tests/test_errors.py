"""Errors: the CLI's words, the right exception classes, never a crash."""

import numpy as np
import pytest

import tessera

RANKS = ["rank:0", "rank:1", "rank:2", "rank:3"]


def test_not_found_is_a_key_error(client):
    with pytest.raises(tessera.NotFound) as info:
        client.describe("no/such/tensor")
    e = info.value
    assert isinstance(e, KeyError) and isinstance(e, tessera.TesseraError)
    assert e.code == "NOT_FOUND"
    assert str(e) == "tensor 'no/such/tensor' not found"  # no KeyError quotes
    for call in (lambda: client.get("no/such/tensor"),
                 lambda: client.get("no/such/tensor", np.s_[0:1]),
                 lambda: client.delete("no/such/tensor"),
                 lambda: client.get_shard("no/such/tensor", 0),
                 lambda: client.reshard("no/such/tensor", chunk_dim=0, placements=RANKS)):
        with pytest.raises(KeyError, match="not found"):
            call()


def test_already_exists(client, name):
    client.put(name, np.zeros(4, np.int8), chunk_dim=0, placements=RANKS[:1])
    with pytest.raises(tessera.AlreadyExists, match="already exists"):
        client.put(name, np.zeros(4, np.int8), chunk_dim=0, placements=RANKS[:1])
    with pytest.raises(tessera.AlreadyExists, match="already exists"):
        client.create(name, (4,), "int8", chunk_dim=0, placements=RANKS[:1])
    client.delete(name)


def test_bad_specs_carry_the_cli_words(client, name):
    a = np.zeros((8, 4), np.float32)
    cases = [
        (dict(shards=[(np.s_[0:5, :], "rank:0"), (np.s_[4:8, :], "rank:1")]), "overlap"),
        (dict(shards=[(np.s_[0:4, :], "rank:0"), (np.s_[5:8, :], "rank:1")]), "cover"),
        (dict(chunk_dim=2, placements=RANKS), "invalid sharding dim"),
        (dict(chunk_dim=0, placements=["rank:9"]), "does not exist"),
        (dict(chunk_dim=0, placements=["nosuchworker"]), "does not exist"),
        (dict(chunk_dim=0, placements=["rank:x"]), "rank"),
        (dict(chunk_dim=0, placements=[]), ""),
        (dict(shards=[(np.s_[0:8], "rank:0")]), "dims"),
        (dict(shards=[(np.s_[0:8:2, :], "rank:0")]), "step"),
        (dict(chunk_dim=0, shards="0:8,:@rank:0"), "not both"),
    ]
    for spec, words in cases:
        with pytest.raises(tessera.InvalidArgument, match=words) as info:
            client.put(name, a, **spec)
        assert isinstance(info.value, ValueError)
    out_of_bounds = dict(shards=[(np.s_[0:9, :], "rank:0")])
    with pytest.raises(ValueError, match="out of bounds"):
        client.put(name, a, **out_of_bounds)
    # Nothing was left behind by any failed put.
    assert name not in {t.name for t in client.list()}
    with pytest.raises(tessera.InvalidArgument, match="invalid sharding dim"):
        client.create(name, (3, 3), "float32", chunk_dim=-3, placements=RANKS)
    with pytest.raises(tessera.InvalidArgument, match="dtype"):
        client.create(name, (3, 3), "complex64", chunk_dim=0, placements=RANKS)


def test_bad_arrays(client, name):
    with pytest.raises(tessera.InvalidArgument, match="no tessera dtype"):
        client.put(name, np.zeros(3, np.complex64), chunk_dim=0, placements=RANKS[:1])
    with pytest.raises(tessera.InvalidArgument, match="uint16"):
        client.put(name, np.zeros(3, np.float32), dtype="bfloat16", chunk_dim=0,
                   placements=RANKS[:1])
    with pytest.raises(tessera.InvalidArgument, match="0-d"):
        client.put(name, np.float32(1.0), chunk_dim=0, placements=RANKS[:1])
    with pytest.raises(tessera.InvalidArgument, match="name"):
        client.put("bad name!", np.zeros(3, np.int8), chunk_dim=0, placements=RANKS[:1])


def test_dead_coordinator_is_unavailable():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(tessera.Unavailable, match="coordinator") as info:
        tessera.connect(f"127.0.0.1:{port}", connect_timeout=0.5)
    assert f"127.0.0.1:{port}" in str(info.value)
    with pytest.raises(tessera.InvalidArgument, match="HOST:PORT"):
        tessera.connect("nonsense")


def test_connect_uses_env(cluster, monkeypatch):
    monkeypatch.setenv("TESSERA_COORDINATOR", cluster.address)
    assert tessera.connect().address == cluster.address


def test_closed_client(cluster):
    with tessera.connect(cluster.address) as c:
        assert c.workers()
    with pytest.raises(tessera.FailedPrecondition, match="closed"):
        c.list()


def test_dead_worker_is_unavailable():
    import signal
    from conftest import Cluster
    small = Cluster(num_workers=2)
    c = None
    try:
        c = tessera.connect(small.address)
        a = np.arange(20, dtype=np.int32)
        c.put("x", a, chunk_dim=0, placements=["rank:0", "rank:1"])
        small.stop_worker(1, signal.SIGKILL)
        with pytest.raises(tessera.Unavailable, match="w1") as info:
            c.get("x")
        assert "unavailable" in str(info.value)
        # The live worker's shard still reads.
        assert np.array_equal(c.get("x", np.s_[0:10]), a[0:10])
    finally:
        if c is not None:
            c.close()
        small.stop()
