#!/usr/bin/env python3
"""Figure 15: tessera.aio from one event loop against threads, 16 concurrent
small gets through the same client.

A cluster of its own (1 coordinator, 4 workers on 127.0.0.1, from
$TESSERA_BIN_DIR); a 64 MiB float32 tensor chunked over the 4 workers;
gets of one 4 KiB row at spread positions. Reference, in the same run: 16
threads calling Client.get back to back. Each is measured twice, in turn,
and the best kept. Prints the figure lines and a Markdown table row.

    PYTHONPATH=bazel-bin/client/python TESSERA_BIN_DIR=$PWD/bazel-bin \\
        /usr/bin/python3 bench/aio_bench.py [--quick]
"""
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

import tessera
import tessera.aio

CALLERS = 16
ROWS = 16384


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cluster(bin_dir: str, workers: int = 4):
    d = tempfile.mkdtemp(prefix="tessera_aio_bench_")
    address = f"127.0.0.1:{free_port()}"
    procs = [subprocess.Popen(
        [os.path.join(bin_dir, "coordinator", "tessera-coordinator"), f"--listen={address}"],
        stdout=open(os.path.join(d, "coordinator.log"), "w"), stderr=subprocess.STDOUT)]
    for i in range(workers):
        procs.append(subprocess.Popen(
            [os.path.join(bin_dir, "worker", "tessera-worker"), f"--coordinator={address}",
             f"--listen=127.0.0.1:{free_port()}", f"--name=w{i}", f"--rank={i}"],
            stdout=open(os.path.join(d, f"w{i}.log"), "w"), stderr=subprocess.STDOUT))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if sum(w.alive for w in tessera.connect(address, connect_timeout=1).workers()) == workers:
                return address, procs
        except tessera.TesseraError:
            pass
        time.sleep(0.05)
    raise RuntimeError("cluster did not come up")


def row_of(c: int, i: int) -> int:
    return (c * 7919 + i * 104729) % ROWS


def threaded_qps(client, seconds: float) -> float:
    counts = [0] * CALLERS
    end = time.monotonic() + seconds

    def caller(c: int) -> None:
        i = 0
        while time.monotonic() < end:
            r = row_of(c, i)
            client.get("aio", np.s_[r:r + 1, :])
            i += 1
        counts[c] = i

    start = time.monotonic()
    threads = [threading.Thread(target=caller, args=(c,)) for c in range(CALLERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.monotonic() - start)


def aio_qps(client, seconds: float) -> float:
    async def main() -> float:
        ac = tessera.aio.AsyncClient(client, max_workers=CALLERS)
        counts = [0] * CALLERS
        end = time.monotonic() + seconds

        async def caller(c: int) -> None:
            i = 0
            while time.monotonic() < end:
                r = row_of(c, i)
                await ac.get("aio", np.s_[r:r + 1, :])
                i += 1
            counts[c] = i

        start = time.monotonic()
        await asyncio.gather(*(caller(c) for c in range(CALLERS)))
        elapsed = time.monotonic() - start
        ac._pool.shutdown(wait=True)
        return sum(counts) / elapsed

    return asyncio.run(main())


def main() -> int:
    quick = "--quick" in sys.argv[1:]
    seconds = 0.5 if quick else 3.0
    bin_dir = os.environ.get("TESSERA_BIN_DIR", "bazel-bin")
    address, procs = start_cluster(bin_dir)
    try:
        client = tessera.connect(address)
        client.create("aio", [ROWS, 1024], "float32", chunk_dim=0,
                      placements=[f"rank:{i}" for i in range(4)], init="arange")
        for c in range(CALLERS):  # warm every path
            client.get("aio", np.s_[row_of(c, 0):row_of(c, 0) + 1, :])
        threads = aio = 0.0
        for _ in range(2):
            threads = max(threads, threaded_qps(client, seconds))
            aio = max(aio, aio_qps(client, seconds))
        ratio = aio / threads
        figure = "15. 16 concurrent 4 KiB gets from one asyncio loop"
        print(f"  {figure:<44} {aio:>8.0f}/s        threads {threads:.0f}/s        {ratio:6.2f}x")
        print()
        print("| figure | value | reference (same run) | ratio | target | met? |")
        print("|---|---|---|---|---|---|")
        met = "yes" if ratio >= 0.8 else "**no**"
        print(f"| {figure} | {aio:.0f}/s | 16 threads {threads:.0f}/s | {ratio:.2f}x | >= 0.80x | {met} |")
        client.delete("aio")
        client.close()
    finally:
        for p in procs[1:] + procs[:1]:
            p.terminate()
        for p in procs:
            p.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
