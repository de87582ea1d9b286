"""tessera.__version__ is the release the CLI and the daemons name."""
import os
import subprocess

import tessera
from conftest import BIN_DIR


def test_version_is_the_clis_and_the_daemons():
    assert tessera.__version__
    assert tessera.__wire_protocol__ == "tessera.v1"
    for binary in ("client/tessera", "worker/tessera-worker",
                   "coordinator/tessera-coordinator"):
        line = subprocess.run([os.path.join(BIN_DIR, binary), "--version"],
                              capture_output=True, text=True, check=True).stdout
        # "PROGRAM 0.2.0 (wire protocol tessera.v1)"
        assert line.split()[1] == tessera.__version__, line
        assert f"(wire protocol {tessera.__wire_protocol__})" in line, line
