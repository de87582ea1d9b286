"""get_rows (row gather) and update (version N+1, whole or a region)."""

import numpy as np
import pytest

import tessera

RANKS = ["rank:0", "rank:1", "rank:2", "rank:3"]


@pytest.fixture
def table(client, name):
    arr = np.arange(50 * 6, dtype=np.float32).reshape(50, 6)
    client.put(name, arr, chunk_dim=0, placements=RANKS)
    yield arr
    client.delete(name)


def test_rows_in_any_order_with_repeats_and_negatives(client, name, table):
    idx = [49, 0, 7, 7, -1, -50, 13]
    got = client.get_rows(name, idx)
    assert got.shape == (7, 6) and got.dtype == np.float32
    assert np.array_equal(got, table[idx])
    assert np.array_equal(client.get_rows(name, np.array(idx, dtype=np.int32)), table[idx])
    assert np.array_equal(client.get_rows(name, np.array(idx, dtype=np.int64)), table[idx])


def test_rows_empty_index_list(client, name, table):
    got = client.get_rows(name, [])
    assert got.shape == (0, 6) and got.dtype == np.float32
    got = client.get_rows(name, np.zeros(0, dtype=np.int32))
    assert got.shape == (0, 6)


def test_rows_out_of_range_and_bad_indices(client, name, table):
    for bad in ([50], [-51], [0, 3, 1000]):
        with pytest.raises(tessera.OutOfBounds, match="out of bounds"):
            client.get_rows(name, bad)
    with pytest.raises(tessera.InvalidArgument, match="integers"):
        client.get_rows(name, [1.5, 2.0])
    with pytest.raises(tessera.InvalidArgument, match="integers"):
        client.get_rows(name, np.array([True, False]))
    with pytest.raises(tessera.InvalidArgument, match="1-D"):
        client.get_rows(name, [[1, 2], [3, 4]])
    with pytest.raises(tessera.NotFound):
        client.get_rows(name + "-missing", [0])


def test_rows_into_out(client, name, table):
    out = np.empty((3, 6), np.float32)
    assert client.get_rows(name, [2, 1, 2], out=out) is out
    assert np.array_equal(out, table[[2, 1, 2]])
    with pytest.raises(tessera.InvalidArgument, match="out"):
        client.get_rows(name, [2, 1], out=out)


def test_rows_across_column_shards(client, name):
    arr = np.arange(10 * 8, dtype=np.int16).reshape(10, 8)
    client.put(name, arr, chunk_dim=1, placements=RANKS[:3])
    assert np.array_equal(client.get_rows(name, [9, 0, 5, 5]), arr[[9, 0, 5, 5]])
    client.delete(name)


def test_update_whole_tensor(client, name, table):
    new = table * 2
    stats = client.update(name, new)
    assert isinstance(stats, tessera.UpdateStats)
    assert stats.version == 2
    assert stats.bytes_written == new.nbytes
    assert np.array_equal(client.get(name), new)
    assert client.describe(name).version == 2


def test_update_region_keeps_other_shards(client, name, table):
    patch = np.full((3, 6), -1, np.float32)
    stats = client.update(name, patch, np.s_[2:5, :])
    assert stats.version == 2
    assert stats.shards_kept == 3  # rows 2:5 live in the first of four shards
    expected = table.copy()
    expected[2:5] = -1
    assert np.array_equal(client.get(name), expected)
    # An integer index drops the dim, as numpy assignment does.
    client.update(name, np.arange(6, dtype=np.float32), np.s_[40])
    expected[40] = np.arange(6)
    assert np.array_equal(client.get(name), expected)
    assert client.describe(name).version == 3


def test_update_mismatches_change_nothing(client, name, table):
    with pytest.raises(tessera.InvalidArgument, match="shape"):
        client.update(name, np.zeros((49, 6), np.float32))
    with pytest.raises(tessera.InvalidArgument, match="dtype"):
        client.update(name, np.zeros((50, 6), np.float64))
    with pytest.raises(tessera.InvalidArgument, match="shape"):
        client.update(name, np.zeros((2, 6), np.float32), np.s_[0:3])
    with pytest.raises(tessera.OutOfBounds, match="out of bounds"):
        client.update(name, np.zeros((2, 6), np.float32), np.s_[49:51])
    assert client.describe(name).version == 1
    assert np.array_equal(client.get(name), table)
