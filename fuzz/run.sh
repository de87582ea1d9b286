#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 20) on a fresh copy of
# its seed corpus (fuzz/corpus/<target>/), one per core at a time
# (FUZZ_JOBS), and prints
# per target: execs, exec/s, coverage (libFuzzer's cov: edges and ft:
# features) and whether it crashed. Exits non-zero if any target crashed,
# leaked, timed out or ran out of memory; its reproducer and log stay in
# fuzz/out/artifacts/<target>/ and fuzz/out/logs/<target>.log. Leak checks
# skip gRPC's own thread-pool bookkeeping (fuzz/lsan.supp), and are off for
# worker_request_fuzzer (see below).
#
#   fuzz/run.sh [SECONDS]           build (incrementally) and run all
#   FUZZ_TARGETS="npy_fuzzer" fuzz/run.sh 60
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

SECONDS_EACH="${1:-20}"
OUT=fuzz/out
mkdir -p "$OUT"
fuzz/build.sh >"$OUT/build.log" 2>&1 || { cat "$OUT/build.log"; echo "fuzz build failed"; exit 1; }

targets="${FUZZ_TARGETS:-$(cd fuzz && ls *_fuzzer.cc | sed 's/\.cc$//')}"
# One target's run; its exit status goes to logs/TARGET.rc.
run_target() {
  local t=$1 work=$OUT/work/$1 art=$OUT/artifacts/$1 log=$OUT/logs/$1.log leaks=1
  rm -rf "$work" "$art"
  mkdir -p "$work" "$art" "$OUT/logs"
  cp fuzz/corpus/"$t"/* "$work"/ 2>/dev/null || true
  # worker_request_fuzzer runs real gRPC servers and streams: libgrpc's
  # background threads free call state after an input ends, and Debian's
  # 1.51 drops a few error strings on races, which per-input leak checks
  # report at random. Its leak checks are off; the other targets keep them.
  [ "$t" = worker_request_fuzzer ] && leaks=0
  LSAN_OPTIONS="suppressions=$PWD/fuzz/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}" \
    "$OUT/$t" -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -timeout=10 \
    -detect_leaks="$leaks" -print_final_stats=1 -artifact_prefix="$art/" "$work" >"$log" 2>&1
  echo $? >"$OUT/logs/$t.rc"
}

# The targets run FUZZ_JOBS at a time (default: one per core), each on a
# core of its own for its SECONDS; the results are printed in order.
jobs_at_once="${FUZZ_JOBS:-$(nproc)}"
mkdir -p "$OUT/logs"
for t in $targets; do
  rm -f "$OUT/logs/$t.rc"
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_at_once" ]; do wait -n; done
  run_target "$t" &
done
wait

failed=0
printf '%-28s %12s %8s %7s %7s  %s\n' target execs exec/s cov ft result
for t in $targets; do
  art=$OUT/artifacts/$t
  log=$OUT/logs/$t.log
  rc=$(cat "$OUT/logs/$t.rc" 2>/dev/null || echo 255)
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*')
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*')
  result=ok
  if [ "$rc" -ne 0 ] || [ -n "$(ls -A "$art")" ]; then
    result="FAILED (rc $rc): $(ls "$art" | head -3 | sed "s|^|$art/|" | tr '\n' ' ')log $log"
    failed=1
  fi
  printf '%-28s %12s %8s %7s %7s  %s\n' "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "$result"
  if [ "$result" != ok ]; then
    grep -m1 -A12 -E '^==[0-9]+==ERROR|runtime error|FUZZ INVARIANT|ERROR: libFuzzer' "$log" | head -20
  fi
done
if [ "$failed" -ne 0 ]; then
  echo "fuzz: FAILED"
  exit 1
fi
echo "fuzz: all targets ran ${SECONDS_EACH}s without a crash"
