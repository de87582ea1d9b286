#!/usr/bin/env bash
# Installs what tessera needs, builds everything and runs every test.
# Prints a closing line "tests: N passed, M failed" counted from the test logs.
set -uo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh || exit 1

BAZEL_FLAGS=(--jobs="${TESSERA_JOBS:-4}")
bazel build "${BAZEL_FLAGS[@]}" //... || exit 1
bazel test "${BAZEL_FLAGS[@]}" --test_output=errors //...
rc=$?

# Every parser of outside input under libFuzzer, a short run each.
fuzz/run.sh 15 || rc=1

# The Python SDK's tests (pytest) against a real local cluster.
./client/python/run_tests.sh bazel-testlogs/client/python/pytest/test.xml
py_rc=$?
if [ "$py_rc" -ne 0 ]; then rc=$py_rc; fi

# The GPU path must compile even without a GPU (CUDA headers and libraries
# from /usr/local/cuda). Built last: it relinks bazel-bin/worker/tessera-worker.
if [ -d /usr/local/cuda/include ]; then
  bazel build "${BAZEL_FLAGS[@]}" --config=cuda //... || rc=1
else
  echo "no /usr/local/cuda: skipping the --config=cuda build"
fi

passed=0
failed=0
for xml in $(find -L bazel-testlogs/ -name test.xml 2>/dev/null); do
  t=$(grep -o '<testcase ' "$xml" | wc -l)
  f=$(grep -c '<failure' "$xml" || true)
  passed=$((passed + t - f))
  failed=$((failed + f))
done
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi
echo "tests: ${passed} passed, ${failed} failed"
exit "$rc"
