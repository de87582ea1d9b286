#!/usr/bin/env python3
"""Fetch rows of a sharded embedding table, as an inference service would.

    PYTHONPATH=bazel-bin/client/python /usr/bin/python3 \\
        client/python/examples/fetch_rows.py --coordinator=127.0.0.1:7070 --demo

The pattern to copy:
  * connect once at startup and share the client between request threads;
  * describe once to learn shape/dtype, then preallocate one buffer per thread;
  * per request, fetch only the rows needed with ``get(name, np.s_[a:b], out=buf)``:
    the bytes land in ``buf`` straight from the workers that own them.

With --demo it first puts a random table (and deletes it at the end);
otherwise it reads an existing tensor given with --tensor.
"""

import argparse
import concurrent.futures
import sys
import time

import numpy as np

import tessera


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coordinator", default=None,
                        help="HOST:PORT (default $TESSERA_COORDINATOR, then 127.0.0.1:7070)")
    parser.add_argument("--tensor", default="example/emb", help="2-d tensor to read rows of")
    parser.add_argument("--demo", action="store_true",
                        help="put a random table first, delete it at the end")
    parser.add_argument("--rows", type=int, default=4096, help="rows of the demo table")
    parser.add_argument("--dim", type=int, default=256, help="columns of the demo table")
    parser.add_argument("--batch", type=int, default=128, help="rows per request")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()

    try:
        client = tessera.connect(args.coordinator)
    except tessera.Unavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1

    table = None
    if args.demo:
        table = np.random.default_rng(0).standard_normal((args.rows, args.dim)).astype(np.float32)
        alive = sorted(w.rank for w in client.workers() if w.alive)
        client.put(args.tensor, table, chunk_dim=0, placements=[f"rank:{r}" for r in alive])

    try:
        meta = client.describe(args.tensor)
        if meta.ndim != 2:
            print(f"error: {args.tensor} has shape {meta.shape}; expected 2 dims", file=sys.stderr)
            return 1
        rows, dim = meta.shape
        batch = min(args.batch, rows)
        print(f"{args.tensor}: shape {meta.shape} {meta.dtype} v{meta.version}, "
              f"{len(meta.shards)} shards on {sorted({s.worker for s in meta.shards})}")

        rng = np.random.default_rng(1)
        starts = rng.integers(0, rows - batch + 1, size=args.requests)

        def serve(worker_index: int) -> int:
            # One buffer per thread, reused for every request: no allocation per fetch.
            buf = np.empty((batch, dim), dtype=meta.numpy_dtype)
            served = 0
            for start in starts[worker_index::args.threads]:
                client.get(args.tensor, np.s_[start:start + batch, :], out=buf)
                if table is not None and not np.array_equal(buf, table[start:start + batch]):
                    raise AssertionError(f"rows {start}:{start + batch} differ")
                served += 1
            return served

        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(args.threads) as pool:
            served = sum(pool.map(serve, range(args.threads)))
        seconds = time.perf_counter() - t0
        nbytes = served * batch * dim * meta.numpy_dtype.itemsize
        print(f"served {served} requests of {batch} rows with {args.threads} threads "
              f"in {seconds:.3f}s ({nbytes / max(seconds, 1e-9) / 1e6:.1f} MB/s)"
              + (", rows verified" if table is not None else ""))

        # One shard, fetched straight from its worker through its handle.
        first = meta.shards[0]
        shard = first.handle.to_here()
        print(f"shard {first.handle} on {first.worker}: rows {first.offsets[0]}:"
              f"{first.offsets[0] + first.sizes[0]}, {shard.nbytes} bytes")
        # torch users: torch.from_numpy(buf) shares the memory (no copy).
    except tessera.TesseraError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        if args.demo:
            try:
                client.delete(args.tensor)
            except tessera.NotFound:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
