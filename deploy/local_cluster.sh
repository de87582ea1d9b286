#!/usr/bin/env bash
# Starts or stops a local tessera cluster on 127.0.0.1: one coordinator and
# N workers (host memory), logs and pid files in $TESSERA_RUN_DIR.
#
#   deploy/local_cluster.sh start [NUM_WORKERS]   # default 4
#   deploy/local_cluster.sh stop
#
# Ports: coordinator $TESSERA_PORT (default 7070), worker i on port+1+i.
# Extra coordinator flags: $TESSERA_COORDINATOR_FLAGS; worker flags: $TESSERA_WORKER_FLAGS.
set -euo pipefail
cd "$(dirname "$0")/.."

RUN_DIR="${TESSERA_RUN_DIR:-/tmp/tessera-local}"
PORT="${TESSERA_PORT:-7070}"
BIN="${TESSERA_BIN_DIR:-bazel-bin}"
COORDINATOR="127.0.0.1:${PORT}"

start() {
  local n="${1:-4}"
  mkdir -p "$RUN_DIR"
  if [ -f "$RUN_DIR/coordinator.pid" ] && kill -0 "$(cat "$RUN_DIR/coordinator.pid")" 2>/dev/null; then
    echo "a local cluster is already running (pid $(cat "$RUN_DIR/coordinator.pid")); stop it first" >&2
    exit 1
  fi
  # shellcheck disable=SC2086
  "$BIN/coordinator/tessera-coordinator" --listen="$COORDINATOR" ${TESSERA_COORDINATOR_FLAGS:-} \
    >"$RUN_DIR/coordinator.log" 2>&1 &
  echo $! >"$RUN_DIR/coordinator.pid"
  for ((i = 0; i < n; i++)); do
    # shellcheck disable=SC2086
    "$BIN/worker/tessera-worker" --coordinator="$COORDINATOR" --listen="127.0.0.1:$((PORT + 1 + i))" \
      --name="w$i" --rank="$i" ${TESSERA_WORKER_FLAGS:-} >"$RUN_DIR/w$i.log" 2>&1 &
    echo $! >"$RUN_DIR/w$i.pid"
  done
  # Ready once every worker is listed alive.
  for _ in $(seq 1 200); do
    alive=$("$BIN/client/tessera" --coordinator="$COORDINATOR" workers --json 2>/dev/null |
      grep -o '"alive": true' | wc -l || true)
    if [ "$alive" -eq "$n" ]; then
      echo "local cluster up: coordinator $COORDINATOR, $n workers (logs in $RUN_DIR)"
      return 0
    fi
    sleep 0.1
  done
  echo "the local cluster did not come up; see $RUN_DIR/*.log" >&2
  stop
  exit 1
}

stop() {
  local failed=0
  for pidfile in "$RUN_DIR"/w*.pid "$RUN_DIR"/coordinator.pid; do
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    if kill -TERM "$pid" 2>/dev/null; then
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
      if kill -0 "$pid" 2>/dev/null; then
        echo "$(basename "$pidfile" .pid) did not stop on SIGTERM" >&2
        failed=1
      fi
    fi
    rm -f "$pidfile"
  done
  echo "local cluster stopped"
  return $failed
}

case "${1:-}" in
  start) start "${2:-4}" ;;
  stop) stop ;;
  *) echo "usage: $0 start [NUM_WORKERS] | stop" >&2; exit 2 ;;
esac
