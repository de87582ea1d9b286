"""torch=True results: torch tensors sharing the fetched memory, bfloat16 as
torch.bfloat16, torch tensors accepted by put/update and as out=."""

import sys

import numpy as np
import pytest

import tessera
from conftest import random_array

torch = pytest.importorskip("torch")

RANKS = ["rank:0", "rank:1", "rank:2", "rank:3"]

TORCH_OF = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int8": torch.int8, "uint8": torch.uint8,
    "int16": torch.int16, "int32": torch.int32, "int64": torch.int64, "bool": torch.bool,
    # Where this torch has them (float8 since 2.1, uint16-64 since 2.3).
    **{d: getattr(torch, d) for d in ("uint16", "uint32", "uint64", "float8_e4m3fn",
                                       "float8_e5m2") if hasattr(torch, d)},
}


@pytest.mark.parametrize("dtype", list(tessera.DTYPES))
def test_get_torch_every_dtype(client, name, dtype):
    arr = random_array(np.random.default_rng(3), dtype, (9, 5))
    client.put(name, arr, dtype=dtype, chunk_dim=0, placements=RANKS[:3])
    if dtype not in TORCH_OF:
        # This torch lacks the dtype: a clear error, and numpy still works.
        with pytest.raises(tessera.InvalidArgument, match=f"has no {dtype}"):
            client.get(name, torch=True)
        assert np.array_equal(client.get(name), arr)
        client.delete(name)
        return
    t = client.get(name, torch=True)
    assert isinstance(t, torch.Tensor)
    assert t.dtype == TORCH_OF[dtype]
    assert tuple(t.shape) == (9, 5)
    assert t.is_contiguous()
    if dtype == "bfloat16":
        # The same 16-bit words, seen as bfloat16.
        assert np.array_equal(t.view(torch.int16).numpy().view(np.uint16), arr)
        assert torch.equal(t.float(), torch.from_numpy(tessera.bfloat16_to_float32(arr)))
    else:
        assert np.array_equal(t.numpy(), arr)
    region = client.get(name, np.s_[2:7, 1:3], torch=True)
    assert tuple(region.shape) == (5, 2)
    shard = client.get_shard(name, 1, torch=True)
    assert shard.dtype == TORCH_OF[dtype]
    rows = client.get_rows(name, [4, -1, 4], torch=True)
    assert rows.dtype == TORCH_OF[dtype] and tuple(rows.shape) == (3, 5)
    client.delete(name)


def test_torch_result_shares_memory_with_out(client, name):
    arr = np.arange(24, dtype=np.float32).reshape(6, 4)
    client.put(name, arr, chunk_dim=0, placements=RANKS[:2])
    buf = np.zeros((6, 4), np.float32)
    t = client.get(name, out=buf, torch=True)
    assert t.data_ptr() == buf.ctypes.data  # no copy: torch.from_numpy of the result
    assert np.array_equal(buf, arr)
    # A torch tensor as out: filled in place and returned.
    dst = torch.zeros((2, 4), dtype=torch.float32)
    got = client.get_rows(name, [5, 0], out=dst, torch=True)
    assert got is dst
    assert torch.equal(dst, torch.from_numpy(arr[[5, 0]]))
    dst2 = torch.zeros((6, 4), dtype=torch.float32)
    assert client.get(name, out=dst2) is not None
    assert torch.equal(dst2, torch.from_numpy(arr))
    client.delete(name)


def test_put_and_update_take_torch_tensors(client, name):
    values = torch.randn(8, 3).to(torch.bfloat16)
    meta = client.put(name, values, chunk_dim=0, placements=RANKS[:2])
    assert meta.dtype == "bfloat16"
    back = client.get(name, torch=True)
    assert back.dtype == torch.bfloat16 and torch.equal(back, values)
    out = torch.empty((8, 3), dtype=torch.bfloat16)
    client.get(name, out=out)
    assert torch.equal(out, values)
    stats = client.update(name, torch.ones(2, 3, dtype=torch.bfloat16), np.s_[6:8])
    assert stats.version == 2
    expected = values.clone()
    expected[6:8] = 1
    assert torch.equal(client.get(name, torch=True), expected)
    client.delete(name)


def test_torch_missing_is_a_clear_error(client, name, monkeypatch):
    client.put(name, np.arange(3, dtype=np.int32), chunk_dim=0, placements=RANKS[:1])
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now fails
    with pytest.raises(ImportError, match="torch=True needs PyTorch"):
        client.get(name, torch=True)
    with pytest.raises(ImportError, match="torch=True needs PyTorch"):
        client.get_rows(name, [0], torch=True)
    # numpy results are unaffected.
    assert np.array_equal(client.get(name), np.arange(3, dtype=np.int32))
    monkeypatch.undo()
    client.delete(name)
