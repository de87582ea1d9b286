#!/usr/bin/env bash
# deploy/local_cluster.sh as a user runs it, on ports and a run directory of
# its own: start 4 workers, the cluster answers with all of them alive, and
# stop takes the 5 daemons down at once, within 3 s, leaving none running.
# Prints "local_cluster_test: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/test_lib.sh
source scripts/test_lib.sh

private_workspace

check "start 4 workers" deploy/local_cluster.sh start 4
pids=$(cat "$TESSERA_RUN_DIR"/*.pid 2>/dev/null)
alive=$(bazel-bin/client/tessera --coordinator="127.0.0.1:$TESSERA_PORT" workers --json |
  grep -o '"alive": true' | wc -l)
check "4 workers alive (got $alive)" test "$alive" -eq 4
check "5 daemons started" test "$(echo "$pids" | wc -w)" -eq 5

start=$(date +%s%N)
check "stop" deploy/local_cluster.sh stop
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
echo "stop took ${elapsed_ms} ms"
check "stop within 3 s (took ${elapsed_ms} ms)" test "$elapsed_ms" -le 3000
left=0
for pid in $pids; do running "$pid" && left=$((left + 1)); done
check "no daemon left running ($left)" test "$left" -eq 0
check "pid files gone" test -z "$(ls "$TESSERA_RUN_DIR"/*.pid 2>/dev/null)"

finish local_cluster_test
