"""Round trips, regions, out=, handles and metadata against a real cluster."""

import contextlib
import os
import re
import signal
import socket
import threading

import numpy as np
import pytest

import tessera
from conftest import eventual_bytes_used, random_array, settled_bytes_used

RANKS = ["rank:0", "rank:1", "rank:2", "rank:3"]


@contextlib.contextmanager
def stopped(cluster, worker, seconds=1.5):
    """Worker `worker` stopped (SIGSTOP) from now until `seconds` have
    passed; leaving the block waits until it runs again."""
    pid = cluster.workers[worker].pid
    os.kill(pid, signal.SIGSTOP)
    resume = threading.Timer(seconds, os.kill, (pid, signal.SIGCONT))
    resume.start()
    try:
        yield
    finally:
        resume.join()


@pytest.mark.parametrize("dtype", list(tessera.DTYPES))
def test_round_trip_every_dtype(client, name, dtype):
    rng = np.random.default_rng(tessera.DTYPES.index(dtype))
    array = random_array(rng, dtype, (13, 7), scale=100)
    # Raw words (bfloat16, float8) name their dtype; the others are numpy's.
    words = dtype in ("bfloat16", "float8_e4m3fn", "float8_e5m2")
    meta = client.put(name, array, chunk_dim=0, placements=RANKS,
                      dtype=dtype if words else None)
    assert meta.dtype == dtype
    assert meta.shape == (13, 7)
    back = client.get(name)
    assert back.dtype == tessera.numpy_dtype(dtype)
    assert back.shape == array.shape
    assert np.array_equal(back, array)
    assert back.flags.c_contiguous and back.flags.writeable
    # Along the other dim too, and a region crossing every shard.
    other = name + "-d1"
    client.put(other, array, chunk_dim=1, placements=RANKS[:3],
               dtype=dtype if words else None)
    assert np.array_equal(client.get(other, np.s_[2:11, 1:-1]), array[2:11, 1:-1])
    client.delete(name)
    client.delete(other)


def test_float8_bytes_keep_their_dtype_and_init_rounds_as_torch(client, name):
    # e4m3fn: 1.0 is 0x38, 448 (the largest) 0x7e; past it NaN (0x7f).
    # e5m2: 1.0 is 0x3c, 57344 0x7b; past it infinity (0x7c).
    for dtype, one, big, past in (("float8_e4m3fn", 0x38, 0x7e, 0x7f),
                                  ("float8_e5m2", 0x3c, 0x7b, 0x7c)):
        client.create(name, (4, 3), dtype, init="ones", chunk_dim=0, placements=RANKS[:2])
        assert client.describe(name).dtype == dtype
        got = client.get(name)
        assert got.dtype == np.uint8 and np.all(got == one)
        client.delete(name)
        top = 448 if dtype == "float8_e4m3fn" else 57344
        client.create(name, (2,), dtype, init=f"full:{top}", chunk_dim=0,
                      placements=RANKS[:1])
        assert np.all(client.get(name) == big)
        client.delete(name)
        client.create(name, (2,), dtype, init="full:1e6", chunk_dim=0, placements=RANKS[:1])
        assert np.all(client.get(name) == past)
        client.delete(name)
    # Bytes put with the dtype come back as they went; without it they are uint8.
    raw = np.arange(256, dtype=np.uint8).reshape(16, 16)
    client.put(name, raw, dtype="float8_e5m2", chunk_dim=1, placements=RANKS)
    assert client.describe(name).dtype == "float8_e5m2"
    assert np.array_equal(client.get(name), raw)
    client.delete(name)
    client.put(name, raw, chunk_dim=0, placements=RANKS[:2])
    assert client.describe(name).dtype == "uint8"
    client.delete(name)


def test_bfloat16_words_view_as_float32(client, name):
    values = np.array([[1.0, -2.5, 0.15625], [3.0e38, -0.0, 65504.0]], dtype=np.float32)
    words = tessera.float32_to_bfloat16(values)
    client.put(name, words, dtype="bfloat16", chunk_dim=0, placements=RANKS[:2])
    assert client.describe(name).dtype == "bfloat16"
    back = client.get(name)
    assert back.dtype == np.uint16
    widened = tessera.bfloat16_to_float32(back)
    assert widened.dtype == np.float32
    assert np.allclose(widened, values, rtol=1e-2)
    assert widened[0, 0] == 1.0 and widened[0, 1] == -2.5


def test_put_non_contiguous_array(client, name):
    base = np.arange(24 * 10, dtype=np.int64).reshape(24, 10)
    view = base[::2, 3:7].T  # neither C- nor F-contiguous
    client.put(name, view, chunk_dim=1, placements=RANKS)
    assert np.array_equal(client.get(name), view)


def test_put_default_placements_use_every_alive_worker(client, name):
    array = np.arange(40, dtype=np.float32).reshape(8, 5)
    meta = client.put(name, array)
    assert [s.rank for s in meta.shards] == [0, 1, 2, 3]
    assert np.array_equal(client.get(name), array)


@pytest.fixture(scope="module")
def cube(client):
    """A 3-d int32 tensor sharded in uneven enumerable boxes over 4 workers."""
    name = "cube"
    full = np.arange(10 * 9 * 8, dtype=np.int32).reshape(10, 9, 8)
    shards = [
        (np.s_[0:3, :, :], "rank:0"),
        ([(3, 10), (0, 4), (None, None)], "rank:1"),
        ("3:10,4:9,0:5", "rank:2"),
        (np.s_[3:, 4:, 5:], "rank:3"),
    ]
    client.put(name, full, shards=shards)
    yield name, full
    client.delete(name)


def random_key(rng, shape):
    """A numpy basic-indexing key of slices, maybe negative, maybe with omitted trailing dims."""
    ndims = rng.integers(1, len(shape) + 1)  # omit trailing dims sometimes
    key = []
    for d in range(ndims):
        n = shape[d]
        a = int(rng.integers(0, n + 1))
        b = int(rng.integers(a, n + 1))  # a == b: empty
        start = a - n if (a < n and rng.random() < 0.4) else a
        stop = b - n if (b < n and rng.random() < 0.4) else b
        if rng.random() < 0.15:
            start = None if a == 0 else start
        if rng.random() < 0.15 and b == n:
            stop = None
        key.append(slice(start, stop))
    return tuple(key)


def test_region_slicing_matches_numpy_on_random_boxes(client, cube):
    name, full = cube
    rng = np.random.default_rng(7)
    for _ in range(60):
        key = random_key(rng, full.shape)
        got = client.get(name, key)
        want = full[key]
        assert got.shape == want.shape, key
        assert np.array_equal(got, want), key


def test_region_forms(client, cube):
    name, full = cube
    cases = [np.s_[7:], np.s_[-3:], np.s_[:, -2:], np.s_[2:2, :, :], np.s_[...],
             np.s_[..., 3:5], np.s_[1:4, ..., -1:], np.s_[4], np.s_[-1, 2], np.s_[2, :, 7],
             np.s_[:, :, :], np.s_[np.int64(1):np.int32(3)]]
    for key in cases:
        got = client.get(name, key)
        assert got.shape == full[key].shape, key
        assert np.array_equal(got, full[key]), key
    assert np.array_equal(client.get(name, "0:5,:"), full[0:5])
    assert np.array_equal(client.get(name, "-2:,1:3,-1:"), full[-2:, 1:3, -1:])


def test_empty_region(client, cube):
    name, full = cube
    got = client.get(name, np.s_[5:5, 2:3])
    assert got.shape == (0, 1, 8)
    got = client.get(name, np.s_[:, 9:])
    assert got.shape == (10, 0, 8)


def test_step_is_a_clear_error(client, cube):
    name, _ = cube
    with pytest.raises(tessera.InvalidArgument, match="step"):
        client.get(name, np.s_[::2])
    with pytest.raises(ValueError, match="step"):
        client.get(name, np.s_[0:4, 1:5:-1])


def test_unsupported_keys(client, cube):
    name, _ = cube
    with pytest.raises(ValueError):
        client.get(name, np.s_[None, 0:2])
    with pytest.raises(ValueError):
        client.get(name, np.array([1, 2]))
    with pytest.raises(ValueError, match="single ellipsis"):
        client.get(name, np.s_[..., 1, ...])


def test_region_out_of_bounds(client, cube):
    name, _ = cube
    for key in [np.s_[0:11], np.s_[:, :, 0:9], np.s_[-11:], np.s_[10], np.s_[5:3]]:
        with pytest.raises(tessera.OutOfBounds, match="out of bounds"):
            client.get(name, key)
    with pytest.raises(IndexError):
        client.get(name, np.s_[12])
    with pytest.raises(ValueError, match="dims"):
        client.get(name, np.s_[0, 0, 0, 0])


def test_get_into_out(client, cube):
    name, full = cube
    buf = np.full((4, 9, 8), -1, dtype=np.int32)
    got = client.get(name, np.s_[2:6], out=buf)
    assert got is buf
    assert np.array_equal(buf, full[2:6])
    # Reuse the buffer for another region of the same shape.
    client.get(name, np.s_[-4:], out=buf)
    assert np.array_equal(buf, full[-4:])
    row = np.empty((9, 8), dtype=np.int32)
    client.get(name, np.s_[3], out=row)
    assert np.array_equal(row, full[3])
    whole = np.empty_like(full)
    client.get(name, out=whole)
    assert np.array_equal(whole, full)


def test_out_must_match(client, cube):
    name, _ = cube
    cases = [
        (np.empty((4, 9, 8), dtype=np.int64), "dtype"),
        (np.empty((4, 9, 7), dtype=np.int32), "shape"),
        (np.empty((4 * 9 * 8,), dtype=np.int32), "shape"),
        (np.empty((8, 9, 4), dtype=np.int32).transpose(2, 1, 0), "C-contiguous"),
        (np.empty((4, 9, 16), dtype=np.int32)[:, :, ::2], "C-contiguous"),
        ([0] * 288, "not a numpy array"),
    ]
    for out, words in cases:
        with pytest.raises(tessera.InvalidArgument, match=words):
            client.get(name, np.s_[0:4], out=out)
    ro = np.empty((4, 9, 8), dtype=np.int32)
    ro.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        client.get(name, np.s_[0:4], out=ro)


def test_describe_fields_and_handles(client, name):
    array = np.arange(60, dtype=np.float64).reshape(6, 10)
    client.put(name, array, chunk_dim=1, placements=["rank:3", "w1", "rank:0/cpu"])
    meta = client.describe(name)
    assert meta.name == name
    assert meta.shape == (6, 10)
    assert meta.dtype == "float64" and meta.numpy_dtype == np.float64
    assert meta.version == 1
    assert meta.nbytes == 60 * 8
    assert meta.ndim == 2
    assert [s.offsets for s in meta.shards] == [(0, 0), (0, 4), (0, 8)]
    assert [s.sizes for s in meta.shards] == [(6, 4), (6, 4), (6, 2)]
    assert [s.rank for s in meta.shards] == [3, 1, 0]
    assert [s.worker for s in meta.shards] == ["w3", "w1", "w0"]
    assert [s.placement for s in meta.shards] == ["rank:3/cpu", "rank:1/cpu", "rank:0/cpu"]
    for i, s in enumerate(meta.shards):
        assert s.index == i and s.available and s.device == "cpu"
        assert s.address.startswith("127.0.0.1:")
        assert str(s.handle) == s.handle_string == f"{name}@v1#{s.shard_id}"
        assert s.handle.tensor == name and s.handle.version == 1 and s.handle.index == i
        assert s.handle.dtype == "float64" and s.handle.sizes == s.sizes
        data = s.handle.to_here()
        assert data.dtype == np.float64 and data.shape == s.sizes
        assert np.array_equal(data, array[s.box])
        assert np.array_equal(client.get_shard(name, i), array[s.box])
    with pytest.raises(tessera.OutOfBounds, match="out of bounds"):
        client.get_shard(name, 3)


def test_list_workers_delete(client, cluster, name):
    client.create(name, (3, 4), "int16", chunk_dim=0, placements=RANKS[:2])
    info = {t.name: t for t in client.list()}[name]
    assert info.shape == (3, 4) and info.dtype == "int16"
    assert info.version == 1 and info.num_shards == 2
    workers = sorted(client.workers(), key=lambda w: w.rank)
    assert [w.name for w in workers] == ["w0", "w1", "w2", "w3"]
    assert [w.address for w in workers] == cluster.worker_addresses
    assert all(w.alive and w.device == "cpu" and w.bytes_used >= 0 for w in workers)
    # One cluster all along: nothing is kept for another.
    assert all(w.quarantined_shards == 0 and w.quarantined_bytes == 0 for w in workers)
    # No --zone: each worker's zone is its host.
    assert all(w.zone == socket.gethostname() and w.state == "ready" for w in workers)
    client.delete(name)
    assert name not in {t.name for t in client.list()}
    with pytest.raises(tessera.NotFound):
        client.describe(name)


@pytest.mark.parametrize("dtype", ["float32", "int32", "float16", "bfloat16", "bool", "uint8",
                                   "uint16", "uint32", "uint64"])
def test_create_init_modes(client, name, dtype):
    shape = (5, 6)
    n = 30
    npd = tessera.numpy_dtype(dtype)

    def fetch(init, **spec):
        client.create(name, shape, dtype, init=init, **spec)
        try:
            return client.get(name)
        finally:
            client.delete(name)

    def as_values(a):
        return tessera.bfloat16_to_float32(a) if dtype == "bfloat16" else a

    chunk = dict(chunk_dim=0, placements=RANKS[:3])
    zeros = fetch("zeros", **chunk)
    assert zeros.dtype == npd and zeros.shape == shape and not np.any(as_values(zeros))
    ones = fetch("ones", **chunk)
    assert np.all(as_values(ones) == 1)
    arange = fetch("arange", chunk_dim=1, placements=RANKS)
    want = np.arange(n).reshape(shape)
    if dtype == "bfloat16":
        assert np.array_equal(as_values(arange), want.astype(np.float32))
    else:
        assert np.array_equal(arange, want.astype(npd))
    full = fetch("full:3", **chunk)
    assert np.all(as_values(full) == (True if dtype == "bool" else 3))
    # rand: a pure function of the seed, whatever the sharding.
    r1 = fetch("rand:42", **chunk)
    r2 = fetch("rand:42", shards=[(np.s_[0:2, :], "rank:3"), (np.s_[2:, :], "rank:2")])
    assert np.array_equal(r1, r2)
    if dtype in ("float32", "float16", "bfloat16"):
        v = as_values(r1).astype(np.float64)
        assert np.all((v >= 0) & (v < 1)) and len(np.unique(v)) > 5


def test_create_full_float_value(client, name):
    client.create(name, (4,), "float64", chunk_dim=0, placements=RANKS, init="full:2.5")
    assert np.array_equal(client.get(name), np.full(4, 2.5))
    client.delete(name)
    with pytest.raises(tessera.InvalidArgument):
        client.create(name, (4,), "int32", chunk_dim=0, placements=RANKS, init="full:nan")
    with pytest.raises(tessera.InvalidArgument):
        client.create(name, (4,), "int32", chunk_dim=0, placements=RANKS, init="bogus")


def test_reshard_chunk_and_enumerable(client, name):
    array = np.random.default_rng(3).standard_normal((12, 8)).astype(np.float32)
    client.put(name, array, chunk_dim=0, placements=RANKS[:2])
    old = client.describe(name)
    stats = client.reshard(name, chunk_dim=1, placements=["rank:2", "rank:3"])
    assert isinstance(stats, tessera.ReshardStats)
    assert stats.version == 2
    assert stats.bytes_moved + stats.bytes_copied_locally == array.nbytes
    # Rows 0:6 on rank 0 and 6:12 on rank 1, each sent whole to ranks 2 and 3.
    assert sum(stats.sent.values()) == stats.bytes_moved == array.nbytes
    assert sorted(stats.sent.values()) == [array.nbytes // 2] * 2
    meta = client.describe(name)
    assert meta.version == 2
    assert [s.rank for s in meta.shards] == [2, 3]
    assert [s.sizes for s in meta.shards] == [(12, 4), (12, 4)]
    assert np.array_equal(client.get(name), array)
    # Enumerable forms: slices, (start, stop) pairs, text; and the CLI's text.
    stats = client.reshard(name, shards=[(np.s_[0:5, :], "rank:0"),
                                         ([(5, None), (0, 3)], "rank:1"),
                                         ("5:,3:", "rank:2")])
    assert stats.version == 3
    meta = client.describe(name)
    assert [s.offsets for s in meta.shards] == [(0, 0), (5, 0), (5, 3)]
    assert np.array_equal(client.get(name, np.s_[3:9, 2:6]), array[3:9, 2:6])
    assert client.reshard(name, shards="0:6,:@rank:3;6:,:@rank:1").version == 4
    assert np.array_equal(client.get(name), array)
    for s in client.describe(name).shards:
        assert np.array_equal(s.handle.to_here(), array[s.box])
    # A handle to a replaced version fails clearly once that version is freed.
    with pytest.raises(tessera.FailedPrecondition, match="resharded or deleted"):
        for _ in range(200):
            old.shards[0].handle.to_here()
            import time
            time.sleep(0.05)
    with pytest.raises(tessera.InvalidArgument, match="missing the sharding"):
        client.reshard(name)
    client.delete(name)


def test_replicas_keep_each_shard_on_distinct_workers(client, name):
    client.create(name, (8, 4), "int32", chunk_dim=0,
                  placements=["rank:0", "rank:1"], init="arange", replicas=2)
    assert [t.replicas for t in client.list() if t.name == name] == [2]
    np.testing.assert_array_equal(
        client.get(name), np.arange(32, dtype=np.int32).reshape(8, 4))
    stats = client.reshard(name, chunk_dim=1, placements=["rank:2", "rank:3"])
    assert stats.version == 2
    assert [t.replicas for t in client.list() if t.name == name] == [2]
    np.testing.assert_array_equal(
        client.get(name), np.arange(32, dtype=np.int32).reshape(8, 4))
    client.delete(name)
    with pytest.raises(tessera.InvalidArgument, match="--replicas=-1"):
        client.create(name, (4,), "int32", placements=["rank:0"], replicas=-1)
    with pytest.raises(tessera.FailedPrecondition, match="replicas"):
        client.create(name, (4,), "int32", placements=["rank:0"], replicas=9)
    assert name not in {t.name for t in client.list()}


def test_mirror_keeps_a_copy_on_every_matching_worker(client, name):
    data = np.arange(32, dtype=np.float32).reshape(8, 4)
    before = settled_bytes_used(client)
    client.put(name, data, chunk_dim=0, placements=["rank:0", "rank:1"],
               mirror="all")
    assert client.describe(name).mirror == "all"
    assert [t.mirror for t in client.list() if t.name == name] == ["all"]
    assert [t.replicas for t in client.list() if t.name == name] == [1]
    np.testing.assert_array_equal(client.get(name), data)
    # Every worker holds the whole tensor (a copy of each shard it does not
    # hold as a replica): bytes_used grows by its size on each.
    want = {n: b + data.nbytes for n, b in before.items()}
    assert eventual_bytes_used(client, lambda now: now == want) == want
    stats = client.reshard(name, chunk_dim=0, placements=["rank:0", "rank:1"],
                           mirror="none")
    assert stats.version == 2
    assert client.describe(name).mirror is None
    np.testing.assert_array_equal(client.get(name), data)
    with pytest.raises(tessera.InvalidArgument, match="mirror"):
        client.create(name + "-bad", (4,), "int32", placements=["rank:0"],
                      mirror="role")
    assert name + "-bad" not in {t.name for t in client.list()}
    client.delete(name)


def test_an_update_of_a_mirrored_tensor_relays_only_what_changed(client, name):
    data = np.arange(256 * 1024, dtype=np.float32).reshape(512, 512)
    client.put(name, data, chunk_dim=0, placements=["rank:0"], mirror="all")
    changed = data.copy()
    flat = changed.reshape(-1)
    flat[::100] = -1.0  # 1 % of the elements, scattered
    stats = client.update(name, changed)
    copies = len([w for w in client.workers() if w.alive]) - 1
    n = flat[::100].size
    # Each copy took a varint gap and count and the 4 bytes of each
    # changed element: under 8 bytes an element, far under whole copies.
    assert 4 * n * copies < stats.relayed_bytes <= 8 * n * copies
    np.testing.assert_array_equal(client.get(name), changed)
    client.delete(name)


def test_drain_moves_a_workers_shards_and_uncordon_takes_it_back(client, name):
    data = np.arange(64, dtype=np.float32).reshape(16, 4)
    client.put(name, data, chunk_dim=0, placements=["rank:2", "rank:3"])
    client.drain("w3")
    states = {w.name: w for w in client.workers()}
    assert states["w3"].state == "draining"
    assert eventual_bytes_used(client, lambda now: now["w3"] == 0)["w3"] == 0
    assert all(s.worker != "w3" for s in client.describe(name).shards)
    np.testing.assert_array_equal(client.get(name), data)
    client.uncordon("w3")
    client.cordon("w3")
    assert {w.name: w.state for w in client.workers()}["w3"] == "cordoned"
    client.uncordon("w3")
    assert {w.name: w.state for w in client.workers()}["w3"] == "ready"
    with pytest.raises(tessera.FailedPrecondition, match="holds"):
        client.remove_worker("w2")  # the only replica of a shard
    with pytest.raises(tessera.NotFound):
        client.drain("w9")
    client.delete(name)


def test_progress_bar_counts_the_bytes_of_a_get_and_a_put(client, name, capsys):
    pytest.importorskip("tqdm")  # Debian's python3-tqdm, from scripts/setup.sh
    a = np.arange(2 * 1024 * 1024, dtype=np.float32).reshape(1024, 2048)  # 8 MiB
    client.put(name, a, progress=True)
    err = capsys.readouterr().err
    assert f"put {name}" in err and "8.00M" in err and "100%" in err, err
    b = client.get(name, progress=True)
    np.testing.assert_array_equal(a, b)
    err = capsys.readouterr().err
    assert f"get {name}" in err and "8.00M" in err and "100%" in err, err
    # Off by default: nothing on stderr.
    client.get(name)
    assert capsys.readouterr().err == ""


def test_reshard_progress_bar_counts_the_bytes_landed(cluster, client, name, capsys):
    """The bar of a reshard shows the coordinator's count of the bytes landed
    in the new shards: with one source worker stopped, part of them."""
    pytest.importorskip("tqdm")
    a = np.arange(8192 * 1024, dtype=np.float32).reshape(8192, 1024)  # 32 MiB
    client.put(name, a, chunk_dim=0, placements=["w2", "w3"])
    with stopped(cluster, 3):
        client.reshard(name, chunk_dim=1, placements=["w0", "w1"], progress=True)
    err = capsys.readouterr().err
    assert f"reshard {name}" in err and "32.0M" in err and "100%" in err, err
    # Redrawn while the stopped worker's pieces waited: half of them landed.
    assert re.search(r"reshard [^:]*: +(4\d|5\d)%", err), err
    np.testing.assert_array_equal(client.get(name), a)
    client.delete(name)


def test_save_and_load_progress_bars_count_the_workers_bytes(cluster, client, name, capsys):
    """The bars of a save and a load show the coordinator's count of the
    bytes the workers wrote and landed: with one worker stopped during the
    save, half of them for a while (and one stopped during the load, so
    that it is drawn before it ends)."""
    pytest.importorskip("tqdm")
    a = np.arange(8192 * 1024, dtype=np.float32).reshape(8192, 1024)  # 32 MiB
    client.put(name, a, chunk_dim=0, placements=["w2", "w3"])
    with stopped(cluster, 3):
        client.save(f"progress-{name}", [name], progress=True)
    err = capsys.readouterr().err
    assert f"save progress-{name}" in err and "32.0M" in err and "100%" in err, err
    assert re.search(r"save [^:]*: +50%", err), err
    with stopped(cluster, 1):
        client.load(f"progress-{name}", chunk_dim=1, placements=["w0", "w1"],
                    prefix="p/", progress=True)
    err = capsys.readouterr().err
    assert f"load progress-{name}" in err and "32.0M" in err and "100%" in err, err
    np.testing.assert_array_equal(client.get(f"p/{name}"), a)
    client.delete(name)
    client.delete(f"p/{name}")


def test_one_coordinator_lists_itself_as_leader(client):
    coordinators = client.coordinators()
    assert len(coordinators) == 1
    assert coordinators[0].role == "leader"
    assert coordinators[0].alive


@pytest.mark.parametrize("transport", ["tcp", "grpc"])
def test_connect_forces_a_transport_and_reports_what_it_moved(cluster, name, transport):
    with tessera.connect(cluster.address, transport=transport) as c:
        arr = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
        c.put(name, arr, chunk_dim=0, placements=RANKS[:2])
        np.testing.assert_array_equal(c.get(name), arr)
        np.testing.assert_array_equal(c.get(name, region=np.s_[3:60, 5:9]), arr[3:60, 5:9])
        stats = c.transfer_stats()
        # Only the forced transport carried bytes: the put's and the gets'.
        assert set(stats["bytes"]) == {transport}
        assert stats["bytes"][transport] >= 2 * arr.nbytes
        assert stats["fallbacks"] == {}
        # Every byte read is counted once, at the worker that served it.
        assert set(stats["served"]) <= {"w0", "w1"}, stats["served"]
        assert sum(stats["served"].values()) == arr.nbytes + arr[3:60, 5:9].nbytes
        c.delete(name)


def test_workers_list_their_data_ports(client):
    for w in client.workers():
        host, port = w.data_address.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
        assert w.data_address != w.address


def test_an_unknown_transport_is_refused(cluster):
    with pytest.raises(tessera.InvalidArgument, match="transport"):
        tessera.connect(cluster.address, transport="carrier-pigeon")
