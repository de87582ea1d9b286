"""The SDK against a cluster with mutual TLS and tokens (CLI.md "Security")."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

import tessera
from conftest import REPO, Cluster


@pytest.fixture(scope="module")
def secure_cluster():
    c = Cluster(num_workers=2, secure=True)
    yield c
    c.stop()


def test_admin_round_trip_and_reader_may_only_read(secure_cluster, name):
    a = np.arange(64, dtype=np.float32).reshape(8, 8)
    with tessera.connect(secure_cluster.address, **secure_cluster.credentials("admin")) as admin:
        admin.put(name, a, chunk_dim=0, placements=["rank:0", "rank:1"])
        np.testing.assert_array_equal(admin.get(name), a)
    with tessera.connect(secure_cluster.address,
                         **secure_cluster.credentials("reader")) as reader:
        np.testing.assert_array_equal(reader.get(name, np.s_[2:4, :]), a[2:4])
        with pytest.raises(tessera.PermissionDenied, match="permission denied"):
            reader.delete(name)
        with pytest.raises(tessera.PermissionDenied):
            reader.put(name + "x", a, chunk_dim=0, placements=["rank:0"])
        assert reader.describe(name).version == 1


def test_bad_credentials_are_unauthenticated(secure_cluster, tmp_path):
    with pytest.raises(tessera.Unauthenticated):
        tessera.connect(secure_cluster.address, connect_timeout=3.0,
                        **secure_cluster.credentials(None))
    wrong = tmp_path / "wrong.token"
    wrong.write_text("not-a-secret-of-this-cluster\n")
    creds = secure_cluster.credentials(None)
    with pytest.raises(tessera.Unauthenticated):
        tessera.connect(secure_cluster.address, connect_timeout=3.0,
                        token_file=str(wrong), **creds)
    with pytest.raises(tessera.Unauthenticated):
        tessera.connect(secure_cluster.address, connect_timeout=3.0,
                        **secure_cluster.credentials("admin", cert=False))


def test_tls_mismatches_say_tls_and_what_to_check(secure_cluster, tmp_path):
    # Both used to be "cannot reach the coordinator ... (is it running?)".
    with pytest.raises(tessera.Unauthenticated, match="speaks TLS.*--tls_ca"):
        tessera.connect(secure_cluster.address, connect_timeout=3.0,
                        token_file=secure_cluster.secret("admin.token"))
    other = tmp_path / "other"
    subprocess.run(["bash", os.path.join(REPO, "deploy", "make-certs.sh"), str(other),
                    "--workers", "0"], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    creds = secure_cluster.credentials("admin")
    creds.update(tls_cert=str(other / "user.crt"), tls_key=str(other / "user.key"))
    with pytest.raises(tessera.Unauthenticated,
                       match="refused this client's TLS certificate"):
        tessera.connect(secure_cluster.address, connect_timeout=3.0, **creds)


def test_environment_supplies_the_credentials(secure_cluster, monkeypatch):
    creds = secure_cluster.credentials("admin")
    monkeypatch.setenv("TESSERA_TLS_CA", creds["tls_ca"])
    monkeypatch.setenv("TESSERA_TLS_CERT", creds["tls_cert"])
    monkeypatch.setenv("TESSERA_TLS_KEY", creds["tls_key"])
    monkeypatch.setenv("TESSERA_TOKEN_FILE", creds["token_file"])
    with tessera.connect(secure_cluster.address) as c:
        assert len([w for w in c.workers() if w.alive]) == 2
