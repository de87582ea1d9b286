#!/usr/bin/env bash
# Builds the Python SDK and the daemons, then runs the Python tests against a
# real local cluster (started by tests/conftest.py from bazel-bin/).
#   client/python/run_tests.sh [JUNIT_XML]
# Exits non-zero if the build or any test fails. Uses /usr/bin/python3 (Debian's
# numpy and pytest), not whatever python3 is first on PATH.
set -uo pipefail
cd "$(dirname "$0")/../.."

junit="${1:-${TMPDIR:-/tmp}/tessera_python_tests.xml}"
mkdir -p "$(dirname "$junit")"

# TESSERA_SKIP_BAZEL (scripts/test.sh, after its build of //...): nothing
# to build, and a bazel command would wait for the tests Bazel runs
# meanwhile.
if [ -z "${TESSERA_SKIP_BAZEL:-}" ]; then
  bazel build --jobs="${TESSERA_JOBS:-4}" //client/python:all \
    //client:libtruncate_after_map.so \
    //coordinator:tessera-coordinator //worker:tessera-worker || exit 1
fi

PYTHONPATH="$PWD/bazel-bin/client/python${PYTHONPATH:+:$PYTHONPATH}" \
  /usr/bin/python3 -m pytest -q -p no:cacheprovider client/python/tests \
  --junitxml="$junit"
