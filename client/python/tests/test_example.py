"""The example script runs against the cluster and verifies what it fetched."""

import os
import subprocess
import sys

import tessera

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "fetch_rows.py")


def test_fetch_rows_example(cluster):
    env = dict(os.environ)
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(tessera.__file__)))
    env["PYTHONPATH"] = package_dir + os.pathsep + env.get("PYTHONPATH", "")
    env["TESSERA_COORDINATOR"] = cluster.address
    result = subprocess.run(
        [sys.executable, EXAMPLE, "--demo", "--rows=1000", "--dim=32", "--batch=50",
         "--requests=40", "--threads=4"],
        env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "served 40 requests of 50 rows" in result.stdout
    assert "rows verified" in result.stdout


def test_fetch_rows_example_missing_tensor(cluster):
    env = dict(os.environ)
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(tessera.__file__)))
    env["PYTHONPATH"] = package_dir + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run(
        [sys.executable, EXAMPLE, f"--coordinator={cluster.address}", "--tensor=absent"],
        env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "error: tensor 'absent' not found" in result.stderr
