#!/usr/bin/env bash
# The long crash harness: tests/crash_harness_test with many crash/restart
# cycles (kill -9 of the coordinator at random points, sometimes of a worker
# too), one run per seed, in each of its modes (metadata in --data_dir,
# workers on --store_dir, metadata in etcd). Prints each mode's summary line
# and exits non-zero if any run lost an acknowledged change or leaked bytes.
#
#   scripts/crash_harness.sh [CYCLES_PER_SEED=200] [SEEDS="1"]
#   e.g. scripts/crash_harness.sh 100 "1 2 3"
set -uo pipefail
cd "$(dirname "$0")/.."

cycles="${1:-200}"
seeds="${2:-1}"

bazel build --jobs="${TESSERA_JOBS:-2}" //tests:crash_harness_test \
  //coordinator:tessera-coordinator //worker:tessera-worker || exit 1

rc=0
for seed in $seeds; do
  tmp="$(mktemp -d)"
  log="$tmp/harness.log"
  TESSERA_BIN_DIR="$PWD/bazel-bin" TEST_TMPDIR="$tmp" \
    TESSERA_CRASH_CYCLES="$cycles" TESSERA_CRASH_SEED="$seed" \
    bazel-bin/tests/crash_harness_test >"$log" 2>&1
  status=$?
  grep -E "^crash harness" "$log" || tail -n 40 "$log"
  if [ "$status" -ne 0 ]; then
    rc=1
    echo "seed $seed FAILED; log and daemon logs in $tmp"
    grep -E "Failure|error|Expected|Which is" "$log" | head -n 40
  else
    rm -rf "$tmp"
  fi
done
exit "$rc"
