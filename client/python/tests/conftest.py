"""A real local cluster for the Python SDK tests.

Starts bazel-bin/coordinator/tessera-coordinator and four
bazel-bin/worker/tessera-worker processes (w0..w3, ranks 0..3) on free
127.0.0.1 ports, waits until every worker is alive, and stops them with
SIGTERM at the end. Binaries come from $TESSERA_BIN_DIR if set, else from
bazel-bin/ of the repository. The package is imported from
bazel-bin/client/python unless PYTHONPATH already provides it.
"""

from __future__ import annotations

import gc
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from typing import List, Optional, Sequence

import numpy as np
import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BIN_DIR = os.environ.get("TESSERA_BIN_DIR") or os.path.join(REPO, "bazel-bin")

try:
    import tessera  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(BIN_DIR, "client", "python"))
    import tessera  # noqa: F401


def random_array(rng, dtype: str, shape, scale: float = 1.0):
    """Values of tessera dtype `dtype` drawn from `rng`: bools 0/1, floats
    standard normal times `scale`, integers over their whole range."""
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype == "bfloat16":
        return tessera.float32_to_bfloat16(rng.standard_normal(shape).astype(np.float32))
    np_dtype = tessera.numpy_dtype(dtype)
    if np.issubdtype(np_dtype, np.floating):
        return (rng.standard_normal(shape) * scale).astype(np_dtype)
    info = np.iinfo(np_dtype)
    return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=np_dtype)


# Workers report bytes_used with their heartbeats (every second), so it is
# current within 2 s: a heartbeat sampled just before a free can land after
# the free's own answer and show the freed bytes for up to one heartbeat.
BYTES_USED_CURRENT_S = 2.0


def bytes_used(client) -> dict:
    """bytes_used by live worker name, as the coordinator reports it now."""
    return {w.name: w.bytes_used for w in client.workers() if w.alive}


def settled_bytes_used(client, timeout: float = 10.0) -> dict:
    """bytes_used once the frees of earlier work have landed: two readings
    that agree, taken further apart than the time within which it is
    current."""
    last = bytes_used(client)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(BYTES_USED_CURRENT_S + 0.1)
        now = bytes_used(client)
        if now == last:
            return now
        last = now
    return last


def eventual_bytes_used(client, want, timeout: float = 10.0) -> dict:
    """bytes_used once it equals `want(reading)`, or the last reading after
    `timeout` (for the caller's assert to show)."""
    deadline = time.monotonic() + timeout
    while True:
        now = bytes_used(client)
        if want(now) or time.monotonic() >= deadline:
            return now
        time.sleep(0.1)


_handed_out = set()


def free_port() -> int:
    """A free port on 127.0.0.1 below the ephemeral range: one the kernel
    hands out there (a daemon's data port bound to 0, any outgoing
    connection) could take it before the daemon given it binds it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            below = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        below = 32768
    rng = random.SystemRandom()
    for _ in range(1000 if below > 11024 else 0):
        port = rng.randrange(10000, below)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """One coordinator and `num_workers` workers, as real processes."""

    def __init__(self, num_workers: int = 4, retire_grace_ms: int = 200,
                 secure: bool = False, coordinator_flags: Sequence[str] = ()) -> None:
        self.dir = tempfile.mkdtemp(prefix="tessera_py_")
        self.address = f"127.0.0.1:{free_port()}"
        # secure: mutual TLS and tokens from deploy/make-certs.sh (in
        # self.secrets); the readiness check connects as admin.
        self.secrets = os.path.join(self.dir, "secrets")
        self.admin = {}
        extra_flags = list(coordinator_flags)
        coordinator_flags: List[str] = []
        if secure:
            subprocess.run(["bash", os.path.join(REPO, "deploy", "make-certs.sh"),
                            self.secrets, "--workers", str(num_workers)],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            coordinator_flags = self._tls("coordinator") + [
                f"--tokens={self.secret('tokens')}"]
            self.admin = self.credentials("admin")
        self.coordinator = self._spawn(
            "coordinator",
            [os.path.join(BIN_DIR, "coordinator", "tessera-coordinator"),
             f"--listen={self.address}", f"--retire_grace_ms={retire_grace_ms}"]
            + coordinator_flags + extra_flags)
        # Checkpoints load from here (each worker's --checkpoint_root).
        self.checkpoint_root = os.path.join(self.dir, "ckpt")
        os.makedirs(self.checkpoint_root)
        self.worker_addresses: List[str] = []
        self.workers: List[Optional[subprocess.Popen]] = []
        for i in range(num_workers):
            addr = f"127.0.0.1:{free_port()}"
            self.worker_addresses.append(addr)
            self.workers.append(self._spawn(
                f"w{i}",
                [os.path.join(BIN_DIR, "worker", "tessera-worker"),
                 f"--coordinator={self.address}", f"--listen={addr}", f"--name=w{i}",
                 f"--rank={i}", f"--checkpoint_root={self.checkpoint_root}"]
                + (self._tls(f"w{i}") + [f"--token_file={self.secret(f'w{i}.token')}"]
                   if secure else [])))
        self._wait_alive(num_workers, timeout=30.0)

    def secret(self, name: str) -> str:
        return os.path.join(self.secrets, name)

    def _tls(self, name: str) -> List[str]:
        return [f"--tls_ca={self.secret('ca.crt')}", f"--tls_cert={self.secret(name + '.crt')}",
                f"--tls_key={self.secret(name + '.key')}"]

    def credentials(self, principal: Optional[str], cert: bool = True) -> dict:
        """connect() arguments for the user certificate and `principal`'s token."""
        out = {"tls_ca": self.secret("ca.crt")}
        if cert:
            out.update(tls_cert=self.secret("user.crt"), tls_key=self.secret("user.key"))
        if principal is not None:
            out["token_file"] = self.secret(principal + ".token")
        return out

    def _spawn(self, name: str, argv: List[str]) -> subprocess.Popen:
        log = open(os.path.join(self.dir, name + ".log"), "ab")
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    def _wait_alive(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            try:
                c = tessera.connect(self.address, connect_timeout=2.0, **self.admin)
                alive = [w for w in c.workers() if w.alive]
                if len(alive) == n:
                    return
                last = f"{len(alive)} of {n} workers alive"
            except tessera.TesseraError as e:
                last = e
            time.sleep(0.05)
        self.stop()
        with open(os.path.join(self.dir, "coordinator.log")) as f:
            log = f.read()
        raise RuntimeError(f"cluster did not come up: {last}\ncoordinator log:\n{log}")

    def stop_worker(self, i: int, sig: int = signal.SIGTERM) -> None:
        p = self.workers[i]
        if p is not None:
            p.send_signal(sig)
            p.wait(timeout=30)
            self.workers[i] = None

    def stop(self) -> None:
        for p in self.workers:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for i, p in enumerate(self.workers):
            if p is not None:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
                self.workers[i] = None
        if self.coordinator.poll() is None:
            self.coordinator.send_signal(signal.SIGTERM)
            try:
                self.coordinator.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.coordinator.kill()
                self.coordinator.wait()


@pytest.fixture(scope="session")
def cluster():
    c = Cluster(num_workers=4)
    yield c
    c.stop()


@pytest.fixture(scope="session")
def client(cluster):
    c = tessera.connect(cluster.address)
    yield c
    # Open client channels make the daemons' graceful shutdown wait out its
    # deadline; close before the cluster stops.
    c.close()
    gc.collect()


@pytest.fixture
def name():
    """A fresh tensor name per test."""
    return "t/" + uuid.uuid4().hex[:12]
