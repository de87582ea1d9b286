#!/usr/bin/env bash
# Starts or stops a local tessera cluster on 127.0.0.1: one coordinator and
# N workers (host memory), logs and pid files in $TESSERA_RUN_DIR.
#
#   deploy/local_cluster.sh start [NUM_WORKERS] [--secure]   # default 4 workers
#   deploy/local_cluster.sh env                              # the CLI's env lines again
#   deploy/local_cluster.sh stop
#
# --secure: mutual TLS and tokens (CLI.md "Security"). The certificates and
# tokens are made once into $TESSERA_RUN_DIR/secrets (deploy/make-certs.sh)
# and reused by later starts; the coordinator runs with --tls_* and --tokens,
# worker wI with its own certificate and token (principal wI). start prints
# the line that points the CLI at them (user certificate, admin token):
#   export TESSERA_COORDINATOR=... TESSERA_TLS_CA=... TESSERA_TLS_CERT=... \
#          TESSERA_TLS_KEY=... TESSERA_TOKEN_FILE=.../admin.token
# (writer.token and reader.token beside it for the write and read roles).
# Without --secure the daemons run in protected mode: plaintext, no tokens,
# loopback only.
#
# Ports: coordinator $TESSERA_PORT (default 7070), worker i on port+1+i.
# Extra coordinator flags: $TESSERA_COORDINATOR_FLAGS; worker flags: $TESSERA_WORKER_FLAGS.
set -euo pipefail
cd "$(dirname "$0")/.."

RUN_DIR="${TESSERA_RUN_DIR:-/tmp/tessera-local}"
PORT="${TESSERA_PORT:-7070}"
BIN="${TESSERA_BIN_DIR:-bazel-bin}"
COORDINATOR="127.0.0.1:${PORT}"
SECRETS="$RUN_DIR/secrets"

# The CLI's environment for the secured cluster (absolute paths), as
# NAME=VALUE words in the array CLI_ENV.
cli_env() {
  local s
  s="$(cd "$SECRETS" && pwd)"
  CLI_ENV=("TESSERA_COORDINATOR=$COORDINATOR" "TESSERA_TLS_CA=$s/ca.crt" "TESSERA_TLS_CERT=$s/user.crt"
    "TESSERA_TLS_KEY=$s/user.key" "TESSERA_TOKEN_FILE=$s/admin.token")
}
env_line() {
  local words=() w
  cli_env
  for w in "${CLI_ENV[@]}"; do words+=("${w%%=*}=$(printf '%q' "${w#*=}")"); done
  echo "export ${words[*]}"
}

start() {
  local n=4 secure="" arg
  for arg in "$@"; do
    case "$arg" in
      --secure) secure=1 ;;
      *[!0-9]* | "" | 0) echo "usage: $0 start [NUM_WORKERS] [--secure]" >&2; exit 2 ;;
      *) n="$arg" ;;
    esac
  done
  mkdir -p "$RUN_DIR"
  if [ -f "$RUN_DIR/coordinator.pid" ] && kill -0 "$(cat "$RUN_DIR/coordinator.pid")" 2>/dev/null; then
    echo "a local cluster is already running (pid $(cat "$RUN_DIR/coordinator.pid")); stop it first" >&2
    exit 1
  fi
  local coordinator_tls=()
  # The readiness check below talks to this cluster only as it is set up,
  # whatever TESSERA_TLS_* and TESSERA_TOKEN_FILE this shell has.
  CLI_ENV=(-u TESSERA_TLS_CA -u TESSERA_TLS_CERT -u TESSERA_TLS_KEY -u TESSERA_TOKEN_FILE)
  rm -f "$RUN_DIR/secure"
  if [ -n "$secure" ]; then
    if [ ! -e "$SECRETS/ca.crt" ]; then
      deploy/make-certs.sh "$SECRETS" --workers "$n"
    elif [ ! -e "$SECRETS/w$((n - 1)).crt" ]; then
      echo "$SECRETS has certificates for fewer than $n workers; remove it to make new ones" >&2
      exit 1
    fi
    coordinator_tls=(--tls_ca="$SECRETS/ca.crt" --tls_cert="$SECRETS/coordinator.crt"
      --tls_key="$SECRETS/coordinator.key" --tokens="$SECRETS/tokens")
    cli_env
    touch "$RUN_DIR/secure"
  fi
  # shellcheck disable=SC2086
  "$BIN/coordinator/tessera-coordinator" --listen="$COORDINATOR" ${coordinator_tls[@]+"${coordinator_tls[@]}"} \
    ${TESSERA_COORDINATOR_FLAGS:-} >"$RUN_DIR/coordinator.log" 2>&1 &
  echo $! >"$RUN_DIR/coordinator.pid"
  for ((i = 0; i < n; i++)); do
    local worker_tls=()
    if [ -n "$secure" ]; then
      worker_tls=(--tls_ca="$SECRETS/ca.crt" --tls_cert="$SECRETS/w$i.crt" --tls_key="$SECRETS/w$i.key"
        --token_file="$SECRETS/w$i.token")
    fi
    # shellcheck disable=SC2086
    "$BIN/worker/tessera-worker" --coordinator="$COORDINATOR" --listen="127.0.0.1:$((PORT + 1 + i))" \
      --name="w$i" --rank="$i" ${worker_tls[@]+"${worker_tls[@]}"} ${TESSERA_WORKER_FLAGS:-} \
      >"$RUN_DIR/w$i.log" 2>&1 &
    echo $! >"$RUN_DIR/w$i.pid"
  done
  # Ready once every worker is listed alive (asked as the user the env line sets up).
  for _ in $(seq 1 200); do
    alive=$(env "${CLI_ENV[@]}" "$BIN/client/tessera" --coordinator="$COORDINATOR" workers --json 2>/dev/null |
      grep -o '"alive": true' | wc -l || true)
    if [ "$alive" -eq "$n" ]; then
      echo "local cluster up: coordinator $COORDINATOR, $n workers (logs in $RUN_DIR)"
      if [ -n "$secure" ]; then
        echo "secured (mutual TLS, tokens in $SECRETS); to use the CLI as admin:"
        env_line
      fi
      return 0
    fi
    for pidfile in "$RUN_DIR"/coordinator.pid "$RUN_DIR"/w*.pid; do
      if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        echo "$(basename "$pidfile" .pid) exited during start-up:" >&2
        tail -5 "$RUN_DIR/$(basename "$pidfile" .pid).log" >&2
        break 2
      fi
    done
    sleep 0.1
  done
  echo "the local cluster did not come up; see $RUN_DIR/*.log" >&2
  stop
  exit 1
}

# True while process $1 runs. An exited daemon stays a zombie until whoever
# adopted it reaps it (in some containers, seconds later): that is gone too.
running() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

# SIGTERM to the daemons of `pidfiles` at once, then up to 5 s for all.
stop_all() {
  local pids=() names=() pid pidfile failed=0
  for pidfile in "$@"; do
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    rm -f "$pidfile"
    kill -TERM "$pid" 2>/dev/null || continue
    pids+=("$pid")
    names+=("$(basename "$pidfile" .pid)")
  done
  for _ in $(seq 1 100); do
    local left=0
    for pid in ${pids[@]+"${pids[@]}"}; do running "$pid" && left=1; done
    [ $left = 0 ] && break
    sleep 0.05
  done
  for i in "${!pids[@]}"; do
    if running "${pids[$i]}"; then
      echo "${names[$i]} did not stop on SIGTERM" >&2
      failed=1
    fi
  done
  return $failed
}

stop() {
  local failed=0
  # Workers first, all at once (their shards go with them), then the
  # coordinator.
  stop_all "$RUN_DIR"/w*.pid || failed=1
  stop_all "$RUN_DIR"/coordinator.pid || failed=1
  echo "local cluster stopped"
  return $failed
}

case "${1:-}" in
  start) shift; start "$@" ;;
  env)
    if [ -f "$RUN_DIR/secure" ] && [ -e "$SECRETS/ca.crt" ]; then
      env_line
    else
      echo "export TESSERA_COORDINATOR=$COORDINATOR"
    fi
    ;;
  stop) stop ;;
  *) echo "usage: $0 start [NUM_WORKERS] [--secure] | env | stop" >&2; exit 2 ;;
esac
