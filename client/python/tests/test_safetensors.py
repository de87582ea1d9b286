"""safetensors import/export against a real cluster, checked with a small
reference reader/writer of the format written here from its specification
(8-byte little-endian header length, compact JSON header, space padding to a
multiple of 8, row-major little-endian data tiling the data section)."""

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import tessera

RANKS = ["rank:0", "rank:1", "rank:2", "rank:3"]

# safetensors dtype code -> (tessera dtype, numpy dtype of the words)
CODES = {
    "F32": ("float32", np.float32), "F64": ("float64", np.float64),
    "F16": ("float16", np.float16), "BF16": ("bfloat16", np.uint16),
    "I8": ("int8", np.int8), "U8": ("uint8", np.uint8), "I16": ("int16", np.int16),
    "I32": ("int32", np.int32), "I64": ("int64", np.int64), "BOOL": ("bool", np.bool_),
}


def st_save(path, tensors, metadata=None):
    """Writes {name: (code, array)} the way the format specifies."""
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    blobs = []
    for name in sorted(tensors):
        code, arr = tensors[name]
        data = np.ascontiguousarray(arr).astype(np.dtype(CODES[code][1]).newbyteorder("<")).tobytes()
        header[name] = {"dtype": code, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def st_load(path):
    """Reads a file, checking the format's rules; returns ({name: (code, array)}, metadata, n)."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    metadata = header.pop("__metadata__", None)
    out = {}
    spans = []
    for name, info in header.items():
        begin, end = info["data_offsets"]
        np_dtype = np.dtype(CODES[info["dtype"]][1]).newbyteorder("<")
        arr = np.frombuffer(data[begin:end], dtype=np_dtype).reshape(info["shape"])
        out[name] = (info["dtype"], arr)
        spans.append((begin, end))
    spans.sort()
    pos = 0
    for begin, end in spans:
        assert begin == pos, "entries must tile the data section"
        pos = end
    assert pos == len(data)
    return out, metadata, n


def sample_tensors(rng):
    return {
        "emb.weight": ("F32", rng.standard_normal((20, 6)).astype(np.float32)),
        "q.weight": ("BF16", tessera.float32_to_bfloat16(rng.standard_normal((8, 4)).astype(np.float32))),
        "q.bias": ("F16", rng.standard_normal(8).astype(np.float16)),
        "norm": ("F64", rng.standard_normal((2, 3, 4))),
        "ids": ("I64", rng.integers(-2**62, 2**62, size=9, dtype=np.int64)),
        "small": ("I32", rng.integers(-1000, 1000, size=(3, 3), dtype=np.int32)),
        "codes": ("I16", rng.integers(-30000, 30000, size=5, dtype=np.int16)),
        "bytes": ("U8", rng.integers(0, 256, size=17, dtype=np.uint8)),
        "signed": ("I8", rng.integers(-128, 128, size=(4, 2), dtype=np.int8)),
        "mask": ("BOOL", rng.integers(0, 2, size=6).astype(bool)),
        "empty": ("F32", np.zeros((0, 3), dtype=np.float32)),
    }


def names_now(client):
    return sorted(t.name for t in client.list())


def test_import_then_export_round_trip(client, name, tmp_path):
    rng = np.random.default_rng(7)
    tensors = sample_tensors(rng)
    src = tmp_path / "model.safetensors"
    st_save(src, tensors, {"format": "pt"})
    prefix = name + "/"
    infos = client.import_safetensors(str(src), chunk_dim=0, placements=RANKS[:3], prefix=prefix)
    assert sorted(i.name for i in infos) == sorted(prefix + k for k in tensors)
    for key, (code, arr) in tensors.items():
        meta = client.describe(prefix + key)
        assert meta.dtype == CODES[code][0]
        assert meta.shape == arr.shape
        assert len(meta.shards) == 3
        back = client.get(prefix + key)
        assert back.dtype == np.dtype(CODES[code][1])
        assert back.tobytes() == arr.tobytes(), key

    out = tmp_path / "out.safetensors"
    result = client.export_safetensors(str(out), prefix=prefix, metadata={"k": "v"})
    assert isinstance(result, tessera.SafetensorsExport)
    assert result.file_bytes == os.path.getsize(out)
    assert result.bytes == sum(a.nbytes for _, a in tensors.values())
    loaded, metadata, n = st_load(out)
    assert n % 8 == 0
    # The imported file's own metadata comes back, with the added key.
    assert metadata == {"format": "pt", "k": "v"}
    assert sorted(loaded) == sorted(tensors)
    for key, (code, arr) in tensors.items():
        assert loaded[key][0] == code
        assert loaded[key][1].shape == arr.shape
        assert loaded[key][1].tobytes() == arr.tobytes(), key

    # By names: entry names are the tensor names, in the imported file's
    # order whatever order they are named in.
    named = tmp_path / "named.safetensors"
    client.export_safetensors(str(named), [prefix + "ids", prefix + "mask"])
    again = tmp_path / "again.safetensors"
    client.export_safetensors(str(again), [prefix + "mask", prefix + "ids"])
    assert open(named, "rb").read() == open(again, "rb").read()
    loaded, metadata, _ = st_load(named)
    assert metadata == {"format": "pt"}
    assert sorted(loaded) == [prefix + "ids", prefix + "mask"]
    assert np.array_equal(loaded[prefix + "ids"][1], tensors["ids"][1])
    for key in tensors:
        client.delete(prefix + key)


def test_import_enumerable_shards_per_entry(client, name, tmp_path):
    src = tmp_path / "boxes.safetensors"
    a = np.arange(12, dtype=np.int32).reshape(4, 3)
    b = np.arange(30, dtype=np.int32).reshape(10, 3)
    st_save(src, {"a": ("I32", a), "b": ("I32", b)})
    client.import_safetensors(str(src), shards=[(np.s_[:2, :], "rank:0"), (np.s_[2:, :], "rank:1")],
                              prefix=name + "/")
    meta = client.describe(name + "/b")
    assert [s.sizes for s in meta.shards] == [(2, 3), (8, 3)]
    assert np.array_equal(client.get(name + "/b"), b)
    assert np.array_equal(client.get(name + "/a"), a)


def malformed_files():
    entry = '"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'

    def raw(text, data=b""):
        text = text.encode()
        return struct.pack("<Q", len(text)) + text + data

    return {
        "header length": b"\xff" * 8 + b"{}",
        "past end": struct.pack("<Q", 64) + b"{}",
        "bad json": raw("{" + entry + ",", b"x" * 8),
        "offsets out of range": raw('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}}', b"x" * 8),
        "overlapping": raw("{" + entry + ',"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}',
                           b"x" * 8),
        "hole": raw('{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', b"x" * 8),
        "bad dtype": raw('{"a":{"dtype":"F8_E8M0","shape":[2],"data_offsets":[0,8]}}', b"x" * 8),
        "size mismatch": raw('{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', b"x" * 8),
    }


@pytest.mark.parametrize("kind", sorted(malformed_files()))
def test_malformed_file_creates_nothing(client, name, tmp_path, kind):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(malformed_files()[kind])
    before = names_now(client)
    with pytest.raises(tessera.InvalidArgument, match="safetensors"):
        client.import_safetensors(str(path), chunk_dim=0, placements=RANKS, prefix=name + "/")
    assert names_now(client) == before


def test_invalid_sharding_dim_creates_nothing(client, name, tmp_path):
    src = tmp_path / "dims.safetensors"
    st_save(src, {"m": ("F32", np.ones((4, 4), np.float32)), "v": ("F32", np.ones(4, np.float32))})
    before = names_now(client)
    with pytest.raises(tessera.InvalidArgument, match="invalid sharding dim"):
        client.import_safetensors(str(src), chunk_dim=1, placements=RANKS[:2], prefix=name + "/")
    assert names_now(client) == before
    with pytest.raises(tessera.InvalidArgument, match="does not exist"):
        client.import_safetensors(str(src), chunk_dim=0, placements=["rank:0", "rank:99"],
                                  prefix=name + "/")
    assert names_now(client) == before


def test_export_errors_leave_no_file(client, name, tmp_path):
    client.put(name, np.arange(4, dtype=np.float32), chunk_dim=0, placements=RANKS[:1])
    out = tmp_path / "never.safetensors"
    with pytest.raises(tessera.NotFound):
        client.export_safetensors(str(out), [name, name + "-missing"])
    assert not out.exists()
    with pytest.raises(tessera.NotFound, match="safetensors"):
        client.export_safetensors(str(out), prefix=name + "-nothing/")
    assert not out.exists()
    with pytest.raises(tessera.InvalidArgument):
        client.export_safetensors(str(out), [name], prefix=name)
    with pytest.raises(tessera.InvalidArgument):
        client.export_safetensors(str(out))
    assert list(tmp_path.iterdir()) == []
    client.delete(name)


PRELOAD = os.path.join(os.environ.get("TESSERA_BIN_DIR") or os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "bazel-bin"), "client",
    "libtruncate_after_map.so")


def test_a_file_that_shrinks_while_imported_fails_cleanly(cluster, client, name, tmp_path):
    """A file cut short while the SDK reads it used to kill the whole Python
    process with SIGBUS. Run in a child process with the file truncated,
    deterministically, once it is mapped and its header read (at the
    child's first connect(2) after the mapping, when it dials a worker:
    client/testing/truncate_after_map.cc)."""
    src = tmp_path / "shrinks.safetensors"
    st_save(src, {"w": ("F32", np.ones((256, 1024), np.float32))})
    script = "\n".join([
        "import sys, tessera",
        f"c = tessera.connect({cluster.address!r})",
        "try:",
        f"    c.import_safetensors({str(src)!r}, chunk_dim=0, placements={RANKS[:2]!r},",
        f"                         prefix={name + '/'!r})",
        "except tessera.FailedPrecondition as e:",
        "    print(e)",
        "    sys.exit(0)",
        "sys.exit(3)",
    ])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), LD_PRELOAD=PRELOAD,
               UCX_MEM_MMAP_HOOK_MODE="none",
               TESSERA_TEST_TRUNCATE_AFTER_MAP=f"{src}:8192:connect")
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)  # -7: SIGBUS
    assert "safetensors file" in r.stdout and "changed while it was read" in r.stdout
    assert os.path.getsize(src) == 8192
    assert not [n for n in names_now(client) if n.startswith(name + "/")]


def test_import_with_replicas_reports_and_keeps_them(client, name, tmp_path):
    src = tmp_path / "two.safetensors"
    arr = np.arange(24, dtype=np.float32).reshape(6, 4)
    st_save(src, {"w": ("F32", arr)}, {})
    infos = client.import_safetensors(str(src), chunk_dim=0, placements=RANKS[:2],
                                      prefix=name + "/", replicas=2)
    assert [(i.name, i.replicas) for i in infos] == [(name + "/w", 2)]
    assert [t.replicas for t in client.list() if t.name == name + "/w"] == [2]
    assert client.get(name + "/w").tobytes() == arr.tobytes()


def test_load_a_model_directory_in_another_layout(cluster, client, name):
    """A model written into a directory under the workers' checkpoint root
    loads back in another layout, bit-exact, the workers reading the bytes."""
    rng = np.random.default_rng(5)
    weights = {"wte": rng.standard_normal((48, 16)).astype(np.float32),
               "ids": np.arange(21, dtype=np.int64)}
    for key, arr in weights.items():
        client.put(f"{name}/{key}", arr, chunk_dim=0, placements=["w0", "w1"])
    model = os.path.join(cluster.checkpoint_root, "m")
    os.makedirs(model)
    client.export_safetensors(os.path.join(model, "model.safetensors"), prefix=f"{name}/")
    stats = client.load("m", chunk_dim=-1, placements=["w3", "w2", "w1"],
                        prefix=f"{name}-loaded/")
    assert isinstance(stats, tessera.LoadStats)
    assert sorted(t.name for t in stats.tensors) == sorted(
        f"{name}-loaded/{k}" for k in weights)
    total = sum(a.nbytes for a in weights.values())
    assert stats.bytes == total and total <= stats.bytes_read <= total * 1.25
    for key, arr in weights.items():
        assert np.array_equal(client.get(f"{name}-loaded/{key}"), arr)
        assert len(client.describe(f"{name}-loaded/{key}").shards) == 3
    with pytest.raises(tessera.InvalidArgument, match="checkpoint_root"):
        client.load("../m", prefix="x/")
    with pytest.raises(tessera.InvalidArgument, match="checkpoint_root"):
        client.load(model, prefix="x/")  # absolute
    for key in weights:
        client.delete(f"{name}/{key}")
        client.delete(f"{name}-loaded/{key}")


def test_save_then_load_in_another_layout(cluster, client, name):
    """Tensors saved from three workers (rows) come back bit-exact on two
    (columns); the directory holds the workers' files and both indexes."""
    rng = np.random.default_rng(6)
    weights = {"emb": rng.standard_normal((30, 12)).astype(np.float32),
               "step": np.array([7], dtype=np.int64)}
    for key, arr in weights.items():
        client.put(f"{name}/{key}", arr, chunk_dim=0, placements=["w0", "w1", "w2"])
    stats = client.save(f"saved-{name}", prefix=f"{name}/")
    assert isinstance(stats, tessera.SaveStats)
    assert sorted(stats.tensors) == sorted(f"{name}/{k}" for k in weights)
    assert stats.bytes == sum(a.nbytes for a in weights.values())
    assert stats.files == 3
    files = set(os.listdir(os.path.join(cluster.checkpoint_root, f"saved-{name}")))
    assert {"tessera.json", "model.safetensors.index.json"} <= files
    assert len([f for f in files if f.endswith(".safetensors")]) == 3
    loaded = client.load(f"saved-{name}", chunk_dim=-1, placements=["w3", "w1"],
                         prefix="back/")
    assert loaded.bytes == stats.bytes
    for key, arr in weights.items():
        assert np.array_equal(client.get(f"back/{name}/{key}"), arr)
    with pytest.raises(tessera.InvalidArgument, match="not both"):
        client.save("x", [f"{name}/emb"], prefix="y")
    with pytest.raises(tessera.NotFound):
        client.save(f"saved-{name}", [f"{name}/absent"])
    for key in weights:
        client.delete(f"{name}/{key}")
        client.delete(f"back/{name}/{key}")


def test_export_hf_writes_a_sharded_directory_that_loads_back(cluster, client, name):
    """export_hf: the workers write model-0000K-of-0000N.safetensors files of
    whole tensors (none over max_shard_size unless one tensor is larger) and
    model.safetensors.index.json naming each tensor's file; the files read
    back with the reference reader, and load takes the directory back into
    another layout bit-exact."""
    rng = np.random.default_rng(9)
    weights = {"layers.0.w": rng.standard_normal((40, 16)).astype(np.float32),  # 2560 B
               "layers.1.w": rng.standard_normal((40, 16)).astype(np.float32),
               "bias": rng.standard_normal(24).astype(np.float32),  # 96 B
               "step": np.array([3], dtype=np.int64)}
    for key, arr in weights.items():
        client.put(f"{name}/{key}", arr, chunk_dim=0, placements=["w0", "w1"])
    out = f"hf-{name}"
    stats = client.export_hf(out, prefix=f"{name}/", strip_prefix=f"{name}/",
                             max_shard_size="3KB")
    assert isinstance(stats, tessera.SaveStats)
    assert sorted(stats.tensors) == sorted(f"{name}/{k}" for k in weights)
    assert stats.bytes == sum(a.nbytes for a in weights.values())
    root = os.path.join(cluster.checkpoint_root, out)
    index = json.load(open(os.path.join(root, "model.safetensors.index.json")))
    assert sorted(index["weight_map"]) == sorted(weights)
    files = sorted(set(index["weight_map"].values()))
    n = len(files)
    assert n >= 2 and stats.files == n  # 5.3 KB of data, 3 KB a file
    assert files == [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]
    seen = {}
    for f in files:
        tensors, _, _ = st_load(os.path.join(root, f))
        data = sum(arr.nbytes for _, arr in tensors.values())
        assert data <= 3000 or len(tensors) == 1
        for entry, (code, arr) in tensors.items():
            assert index["weight_map"][entry] == f
            seen[entry] = (code, arr)
    assert sorted(seen) == sorted(weights)
    for key, arr in weights.items():
        code, back = seen[key]
        assert code == {"float32": "F32", "int64": "I64"}[str(arr.dtype)]
        assert np.array_equal(back, arr)
    loaded = client.load(out, chunk_dim=-1, placements=["w3", "w2", "w1"],
                         prefix=f"{name}-hf/")
    assert loaded.bytes == stats.bytes
    for key, arr in weights.items():
        assert np.array_equal(client.get(f"{name}-hf/{key}"), arr)
    # Bad sizes and selections are refused before anything is written.
    for bad in ("3XB", "0", -1, 0, 2.5, 2**70):
        with pytest.raises(tessera.InvalidArgument, match="max_shard_size"):
            client.export_hf(f"hf-bad-{name}", prefix=f"{name}/", max_shard_size=bad)
    with pytest.raises(tessera.InvalidArgument, match="not both"):
        client.export_hf("x", [f"{name}/bias"], prefix="y")
    with pytest.raises(tessera.NotFound):
        client.export_hf(f"hf-bad-{name}", [f"{name}/absent"])
    assert not os.path.exists(os.path.join(cluster.checkpoint_root, f"hf-bad-{name}"))
    for key in weights:
        client.delete(f"{name}/{key}")
        client.delete(f"{name}-hf/{key}")
