#!/usr/bin/env bash
# deploy/local_cluster.sh as a user runs it, on ports and a run directory of
# its own: start 4 workers, the cluster answers with all of them alive,
# each with a data port (workers --json data_address), and stop takes the 5
# daemons down at once, within 3 s, leaving none running. Then start --ha
# with 2 workers (3 etcd members, 2 coordinators), plain and with --secure:
# a tensor created through TESSERA_COORDINATOR as env prints it, both
# workers with a data port, the leading coordinator killed (-9), and within
# 30 s a create through the same TESSERA_COORDINATOR succeeds and ls lists
# both tensors; stop leaves no etcd member, coordinator or worker of the
# run.
# Prints "local_cluster_test: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/test_lib.sh
source scripts/test_lib.sh

private_workspace

check "start 4 workers" deploy/local_cluster.sh start 4
pids=$(cat "$TESSERA_RUN_DIR"/*.pid 2>/dev/null)
list=$(bazel-bin/client/tessera --coordinator="127.0.0.1:$TESSERA_PORT" workers --json)
alive=$(grep -o '"alive": true' <<<"$list" | wc -l)
check "4 workers alive (got $alive)" test "$alive" -eq 4
# data_ports N: workers --json lists N workers with a non-empty data_address.
data_ports() {
  local got
  got=$(grep -o '"data_address": "[^"][^"]*"' <<<"$list" | wc -l)
  [ "$got" -eq "$1" ] || { echo "workers with a data_address: $got of $1: $list" >&2; return 1; }
}
check "4 workers with a data_address" data_ports 4
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

# --ha.
create() {
  bazel-bin/client/tessera create "$1" --shape=4,4 --dtype=float32 --chunk_dim=0 \
    --placements=rank:0,rank:1 >"$work/create.out" 2>&1
}
# leads NAME: coordinator NAME (its pid file's name) logged that it leads.
leads() {
  local log
  log=$(cat "$TESSERA_RUN_DIR/$1.log" 2>/dev/null || true)
  grep -qF "leading etcd prefix" <<<"$log"
}
# lists NAME...: `tessera ls` lists every NAME.
lists() {
  local listed name
  listed=$(bazel-bin/client/tessera ls 2>&1) || return 1
  for name in "$@"; do
    grep -qw -- "$name" <<<"$listed" || { echo "tessera ls: $listed" >&2; return 1; }
  done
}
# ha_case [--secure]: start --ha with 2 workers, create a tensor through
# TESSERA_COORDINATOR as env prints it, kill -9 the leading coordinator,
# create another within 30 s through the same TESSERA_COORDINATOR, ls lists
# both; stop leaves no daemon of the run.
ha_case() {
  local how="--ha${1:+ $1}" pids env_line want leader="" other="" start created elapsed_ms left leftover
  check "start $how, 2 workers" deploy/local_cluster.sh start 2 --ha "$@"
  pids=$(cat "$TESSERA_RUN_DIR"/*.pid 2>/dev/null)
  check "$how: 7 daemons started (3 etcd, 2 coordinators, 2 workers)" test "$(echo "$pids" | wc -w)" -eq 7
  env_line=$(deploy/local_cluster.sh env)
  want="export TESSERA_COORDINATOR=127.0.0.1:$TESSERA_PORT,127.0.0.1:$((TESSERA_PORT + 50))"
  check "$how: env names both coordinators ($env_line)" test "${env_line%% TESSERA_TLS_CA=*}" = "$want"
  eval "$env_line"
  check "$how: create ha1" create ha1
  list=$(bazel-bin/client/tessera workers --json 2>&1)
  check "$how: 2 workers with a data_address" data_ports 2
  if leads coordinator && ! leads coordinator2; then leader=coordinator other=coordinator2; fi
  if leads coordinator2 && ! leads coordinator; then leader=coordinator2 other=coordinator; fi
  check "$how: one coordinator leads (${leader:-none or both})" test -n "$leader"
  if [ -n "$leader" ]; then
    kill -9 "$(cat "$TESSERA_RUN_DIR/$leader.pid")"
    start=$(date +%s%N)
    created=""
    while [ $((($(date +%s%N) - start) / 1000000)) -lt 30000 ]; do
      if create ha2; then
        created=1
        break
      fi
      sleep 0.2
    done
    elapsed_ms=$((($(date +%s%N) - start) / 1000000))
    echo "$how: create after kill -9 of the leading $leader: ${elapsed_ms} ms"
    [ -n "$created" ] || cat "$work/create.out" >&2
    check "$how: a create through the same TESSERA_COORDINATOR within 30 s of kill -9 of the leader (${elapsed_ms} ms)" \
      test -n "$created"
    check "$how: $other leads now" leads "$other"
    check "$how: ls lists ha1 and ha2" lists ha1 ha2
  fi
  check "$how: stop" deploy/local_cluster.sh stop
  left=0
  for pid in $pids; do running "$pid" && left=$((left + 1)); done
  check "$how: no daemon of the run left running ($left)" test "$left" -eq 0
  # Also by command line: an etcd member on the run's data, or a daemon
  # given the run's coordinator or etcd addresses.
  leftover=$(pgrep -af -- "$TESSERA_RUN_DIR/etcd/|127\.0\.0\.1:$TESSERA_PORT,|127\.0\.0\.1:$((TESSERA_PORT + 100))" || true)
  check "$how: no etcd, coordinator or worker process of the run left: ${leftover:-none}" test -z "$leftover"
  check "$how: pid files gone" test -z "$(ls "$TESSERA_RUN_DIR"/*.pid 2>/dev/null)"
  unset TESSERA_COORDINATOR TESSERA_TLS_CA TESSERA_TLS_CERT TESSERA_TLS_KEY TESSERA_TOKEN_FILE
}
ha_case
# With --secure: TLS and tokens to the daemons, TLS with a CA of its own to
# etcd.
ha_case --secure

finish local_cluster_test
