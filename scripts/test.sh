#!/usr/bin/env bash
# Installs what tessera needs, builds everything and runs every test.
# Prints a closing line "tests: N passed, M failed" counted from the test logs,
# after a "failed:" list naming each part that failed (the log's tail is often
# all a CI page keeps).
set -uo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh || exit 1

# What failed, one line each, printed again at the end; the exit status.
failures=()
rc=0
# How long each part took, printed at the end (where CI time goes).
times=()
mark=$(date +%s)
took() {
  local now
  now=$(date +%s)
  times+=("$1 $((now - mark)) s")
  mark=$now
}

BAZEL_FLAGS=(--jobs="${TESSERA_JOBS:-4}")
took setup
# The fuzzers' clang build (every library source again, under ASan) runs
# beside everything up to the fuzz runs at the lowest priority: it takes the
# cores the Bazel build leaves idle (its analysis, its last actions) and
# those the tests leave (they mostly wait on their daemons). Where the
# kernel schedules sessions as groups (autogroup), nice weighs only within
# a session: the build gets a session of its own, niced as a whole.
mkdir -p fuzz/out
setsid -w bash -c 'echo 19 >/proc/self/autogroup 2>/dev/null; exec nice -n 19 fuzz/build.sh' \
  >fuzz/out/build.log 2>&1 &
fuzz_build=$!
# In a session of its own it hears no Ctrl-C: stopped with the script
# however that ends (its process group; nothing once it has ended).
trap 'kill -- -"$fuzz_build" 2>/dev/null' EXIT
trap 'exit 130' INT TERM
bazel build "${BAZEL_FLAGS[@]}" //... || exit 1
took "bazel build"
bazel_log=$(mktemp)
results=$(mktemp -d)
# The tests Bazel runs (four at once on any machine: they wait on their
# daemons far more than they compute) in the background, with the Python
# tests and the deployment checks beside them: all use what the build above
# made (TESSERA_SKIP_BAZEL, as deploy/build-images.sh takes it: their scripts
# run no bazel build of their own, which would wait for this one's lock). Bazel's output is printed when it ends.
bazel_start=$(date +%s)
bazel test "${BAZEL_FLAGS[@]}" --local_test_jobs=4 --test_output=errors //... >"$bazel_log" 2>&1 &
bazel_test=$!
export TESSERA_SKIP_BAZEL=1

# The Python SDK's tests (pytest) against a real local cluster.
./client/python/run_tests.sh "$results/pytest.xml"
py_rc=$?
if [ "$py_rc" -ne 0 ]; then
  rc=$py_rc
  failures+=("pytest: exit $py_rc")
fi
took pytest

# Deployment: the Kubernetes manifests checked offline, and a real cluster of
# containers (skipped, not failed, where podman cannot run containers). Before
# the CUDA build below, which relinks the worker the image is made from.
deploy_passed=0
deploy_failed=0
# counted NAME COMMAND...: runs COMMAND and adds its closing
# "NAME: N passed, M failed" line to the totals (else one test, by exit status).
counted() {
  local name="$1" log status p f
  shift
  log=$(mktemp)
  "$@" 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
  read -r p f < <(sed -n "s/^$name: \([0-9]*\) passed, \([0-9]*\) failed.*/\1 \2/p" "$log" | tail -1)
  rm -f "$log"
  if [ -z "${p:-}" ]; then
    if [ "$status" -eq 0 ]; then p=1 f=0; else p=0 f=1; fi
  fi
  if [ "$status" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
  deploy_passed=$((deploy_passed + p))
  deploy_failed=$((deploy_failed + f))
  if [ "$status" -ne 0 ]; then
    rc=1
    failures+=("$name: exit $status, $f failed")
  fi
  took "$name"
}
counted "k8s check" /usr/bin/python3 deploy/k8s/check.py
counted check_test deploy/k8s/check_test.sh
counted local_cluster_test deploy/local_cluster_test.sh
counted compose_test deploy/compose_test.sh
counted wheel_test scripts/wheel_test.sh
counted sdk_install_test scripts/sdk_install_test.sh
counted container_test deploy/container_test.sh

wait "$bazel_test"
bazel_rc=$?
cat "$bazel_log"
bazel_failures=0
while IFS= read -r line; do
  failures+=("bazel test: $line")
  bazel_failures=$((bazel_failures + 1))
done < <(grep -E '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE)' "$bazel_log")
if [ "$bazel_rc" -ne 0 ]; then
  rc=$bazel_rc
  [ "$bazel_failures" -gt 0 ] || failures+=("bazel test: exit $bazel_rc (see its output above)")
fi
rm -f "$bazel_log"
# Its own time (it began with pytest), and the wait for it after the checks.
times+=("bazel test $(($(date +%s) - bazel_start)) s (beside the parts above)")
took "bazel test (the wait after them)"

# Every parser of outside input under libFuzzer, a short run each (run.sh
# builds again only what the background build did not finish; a failed
# build is reported there). Longer runs by hand: fuzz/run.sh 60.
wait "$fuzz_build"
took "fuzz build (the rest)"
# The GPU path must compile even without a GPU (CUDA headers and libraries
# from /usr/local/cuda). It builds beside the fuzz runs: each fuzzer runs for
# a fixed time, so the build costs them executions, not minutes. After the
# container test, as it relinks bazel-bin/worker/tessera-worker, which the
# image is made from. The GPU suite and bench are "manual" (they need a GPU
# to run) but are built here, so they compile in CI.
cuda_log=$(mktemp)
cuda_build=
if [ -d /usr/local/cuda/include ]; then
  bazel build "${BAZEL_FLAGS[@]}" --config=cuda //... //tests:gpu_test \
    //bench:gpu_bench >"$cuda_log" 2>&1 &
  cuda_build=$!
else
  echo "no /usr/local/cuda: skipping the --config=cuda build" >"$cuda_log"
fi
fuzz_log=$(mktemp)
fuzz/run.sh 5 2>&1 | tee "$fuzz_log"
if [ "${PIPESTATUS[0]}" -ne 0 ]; then
  rc=1
  while IFS= read -r line; do failures+=("fuzz: $line"); done < <(
    grep -E 'FAILED|fuzz build failed|ERROR' "$fuzz_log" | head -8)
  [ -s "$fuzz_log" ] || failures+=("fuzz: fuzz/run.sh failed with no output")
fi
rm -f "$fuzz_log"
took fuzz
if [ -n "$cuda_build" ] && ! wait "$cuda_build"; then
  rc=1
  failures+=("bazel build --config=cuda")
fi
cat "$cuda_log"
rm -f "$cuda_log"
took "cuda build (the wait after the fuzz runs)"

passed=0
failed=0
for xml in $(find -L bazel-testlogs/ -name test.xml 2>/dev/null) "$results"/*.xml; do
  [ -f "$xml" ] || continue
  t=$(grep -o '<testcase ' "$xml" | wc -l)
  # A test that crashed or ran out of time has an <error> instead.
  f=$(grep -cE '<(failure|error)[ >]' "$xml" || true)
  passed=$((passed + t - f))
  failed=$((failed + f))
done
passed=$((passed + deploy_passed))
failed=$((failed + deploy_failed))
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi
if [ "${#failures[@]}" -gt 0 ]; then
  echo "failed:"
  printf '  %s\n' "${failures[@]}"
fi
echo "times: $(IFS=,; echo "${times[*]}" | sed 's/,/, /g')"
echo "tests: ${passed} passed, ${failed} failed"
exit "$rc"
