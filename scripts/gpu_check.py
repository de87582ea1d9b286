"""The GPU suite's checks (scripts/test_gpu.sh): a real cluster whose two
workers keep their shards on cuda:0, driven through the Python SDK, every
result compared byte for byte with numpy."""

from __future__ import annotations

import sys

import numpy as np
import tessera


def check(what: str, got, want) -> None:
    got = np.asarray(got)
    if got.shape != want.shape or got.dtype != want.dtype or \
            got.tobytes() != want.tobytes():
        sys.exit(f"gpu_check: {what}: differs from numpy")
    print(f"gpu_check: {what}: ok")


def main(address: str, allow_cpu: bool) -> None:
    c = tessera.connect(address)
    devices = {w.name: str(w.device) for w in c.workers()}
    if not allow_cpu and not all(d.startswith("cuda") for d in devices.values()):
        sys.exit(f"gpu_check: workers are not on GPUs: {devices}")
    rng = np.random.default_rng(7)
    a = rng.standard_normal((1000, 37), dtype=np.float32)
    c.put("g", a, chunk_dim=0, placements=["rank:0", "rank:1"])
    check("put/get", c.get("g"), a)
    check("region", c.get("g", "100:700,3:30"), a[100:700, 3:30])
    c.reshard("g", chunk_dim=1, placements=["rank:1", "rank:0"])
    check("reshard rows -> columns", c.get("g"), a)
    idx = np.array([999, 0, 5, 5, -1, 500], dtype=np.int64)
    check("rows", c.get_rows("g", idx), a[idx])
    patch = rng.standard_normal((50, 10), dtype=np.float32)
    c.update("g", patch, "480:530,20:30")
    a[480:530, 20:30] = patch
    check("regional update", c.get("g"), a)
    z = c.create("z", [64, 64], "float16", chunk_dim=0,
                 placements=["rank:0", "rank:1"], init="ones")
    del z
    check("create ones (float16)", c.get("z"), np.ones((64, 64), np.float16))
    c.delete("g")
    c.delete("z")


if __name__ == "__main__":
    # --allow-cpu: run the same checks on host-memory workers (to check the
    # checks themselves where there is no GPU).
    main(sys.argv[1], "--allow-cpu" in sys.argv[2:])
