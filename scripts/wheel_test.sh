#!/usr/bin/env bash
# The wheel as a user installs it: scripts/build_wheel.sh, a fresh venv
# (numpy from Debian through --system-site-packages), `pip install --no-index`
# of the wheel, then, from outside the source tree against a local cluster,
# the `tessera` command and `import tessera` doing real work.
# Prints "wheel_test: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

# shellcheck source=scripts/test_lib.sh
source scripts/test_lib.sh

private_workspace

wheel=$(scripts/build_wheel.sh 2>/dev/null | tail -1)
check "wheel built ($wheel)" test -f "$wheel"
check "fresh venv" /usr/bin/python3 -m venv --system-site-packages "$work/venv"
check "pip install --no-index" "$work/venv/bin/pip" install -q --no-index "$wheel"
check "tessera --version from the venv" "$work/venv/bin/tessera" --version
check "tessera.__version__ is the CLI's" bash -c "[ \"\$('$work/venv/bin/python' -c \
  'import tessera; print(tessera.__version__)')\" = \"\$('$work/venv/bin/tessera' --version | cut -d' ' -f2)\" ]"

check "local cluster" deploy/local_cluster.sh start 2
address="127.0.0.1:$TESSERA_PORT"
cd "$work"  # nothing of the source tree on the path
check "tessera create" "$work/venv/bin/tessera" --coordinator="$address" create wheel_t \
  --shape=6,4 --dtype=int32 --chunk_dim=0 --placements=rank:0,rank:1 --init=arange
check "tessera get into a pipe" bash -c "'$work/venv/bin/tessera' --coordinator=$address \
  get wheel_t --output=- 2>/dev/null | wc -c | grep -qx 224"
check "import tessera (from the venv) and read" "$work/venv/bin/python" - "$address" "$work/venv" <<'PYEOF'
import sys
import numpy as np
import tessera
assert tessera.__file__.startswith(sys.argv[2]), tessera.__file__
c = tessera.connect(sys.argv[1])
a = c.get("wheel_t")
assert (a == np.arange(24, dtype=np.int32).reshape(6, 4)).all(), a
c.put("wheel_p", np.ones((4, 2), dtype=np.float32), chunk_dim=0, placements=["rank:1"])
assert c.get("wheel_p").sum() == 8
PYEOF
cd "$repo"

finish wheel_test
