#!/usr/bin/env bash
# Starts or stops a local tessera cluster on 127.0.0.1: one coordinator and
# N workers (host memory), logs and pid files in $TESSERA_RUN_DIR.
#
#   deploy/local_cluster.sh start [NUM_WORKERS] [--secure] [--ha]   # default 4 workers
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
# --ha: the highly available coordinator (CLI.md "Highly available
# coordinator"): three etcd members ($TESSERA_ETCD_BIN_DIR/etcd, default
# /usr/bin; data and logs in $TESSERA_RUN_DIR/etcd) and two coordinators
# keeping the metadata there, one leading, the other standing by; the
# workers and the CLI get both addresses (TESSERA_COORDINATOR=A1,A2, printed
# by start and env). Each start makes a new etcd cluster (the previous
# one's data goes), as a coordinator without --ha keeps its metadata only in
# memory. With --secure too, etcd speaks TLS and admits only clients with a
# certificate of a CA of its own ($TESSERA_RUN_DIR/secrets/etcd, made by
# deploy/make-certs.sh), which only the coordinators hold: etcd keeps the
# cluster's secret.
#
# Ports: coordinator $TESSERA_PORT (default 7070), worker i on port+1+i
# (its data port, for shard bytes over TCP, one the system picks: start
# prints them);
# with --ha the second coordinator on port+50, etcd member i on port+100+i
# (clients) and port+110+i (peers).
# Extra coordinator flags: $TESSERA_COORDINATOR_FLAGS; worker flags: $TESSERA_WORKER_FLAGS.
set -euo pipefail
cd "$(dirname "$0")/.."

RUN_DIR="${TESSERA_RUN_DIR:-/tmp/tessera-local}"
PORT="${TESSERA_PORT:-7070}"
BIN="${TESSERA_BIN_DIR:-bazel-bin}"
ETCD_BIN="${TESSERA_ETCD_BIN_DIR:-/usr/bin}"
COORDINATOR="127.0.0.1:${PORT}"
SECRETS="$RUN_DIR/secrets"
ETCD_SECRETS="$SECRETS/etcd"
SECOND_COORDINATOR="127.0.0.1:$((PORT + 50))"
ETCD_ENDPOINTS="127.0.0.1:$((PORT + 100)),127.0.0.1:$((PORT + 101)),127.0.0.1:$((PORT + 102))"
# Every coordinator address, as the workers and the CLI take them.
COORDINATORS="$COORDINATOR"
if [ -f "$RUN_DIR/ha" ]; then COORDINATORS="$COORDINATOR,$SECOND_COORDINATOR"; fi

# The CLI's environment for the secured cluster (absolute paths), as
# NAME=VALUE words in the array CLI_ENV.
cli_env() {
  local s
  s="$(cd "$SECRETS" && pwd)"
  CLI_ENV=("TESSERA_COORDINATOR=$COORDINATORS" "TESSERA_TLS_CA=$s/ca.crt" "TESSERA_TLS_CERT=$s/user.crt"
    "TESSERA_TLS_KEY=$s/user.key" "TESSERA_TOKEN_FILE=$s/admin.token")
}
env_line() {
  local words=() w v
  cli_env
  for w in "${CLI_ENV[@]}"; do
    v=${w#*=}
    # Quoted only where the shell needs it (printf %q also escapes the
    # commas between coordinator addresses).
    [[ "$v" =~ ^[A-Za-z0-9_./:,@+=-]*$ ]] || v=$(printf '%q' "$v")
    words+=("${w%%=*}=$v")
  done
  echo "export ${words[*]}"
}

# The log of daemon NAME (as its pid file is named).
log_of() {
  case "$1" in
    etcd*) echo "$RUN_DIR/etcd/$1.log" ;;
    *) echo "$RUN_DIR/$1.log" ;;
  esac
}

# True, after printing the end of its log, when a daemon of the pid files
# given has exited.
exited() {
  local pidfile name
  for pidfile in "$@"; do
    [ -f "$pidfile" ] || continue
    if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      name=$(basename "$pidfile" .pid)
      echo "$name exited during start-up:" >&2
      tail -5 "$(log_of "$name")" >&2
      return 0
    fi
  done
  return 1
}

# --ha: three etcd members, a new etcd cluster (the previous run's data
# goes), ready once every member answers `etcdctl endpoint health`. With
# --secure ($1 not empty), TLS between members and to clients, which must
# present a certificate of $ETCD_SECRETS's CA.
start_etcd() {
  local i bin peers="" scheme=http endpoints="" tls=() ctl_tls=()
  if [ -n "$1" ]; then
    scheme=https
    tls=(--cert-file="$ETCD_SECRETS/coordinator.crt" --key-file="$ETCD_SECRETS/coordinator.key"
      --trusted-ca-file="$ETCD_SECRETS/ca.crt" --client-cert-auth
      --peer-cert-file="$ETCD_SECRETS/coordinator.crt" --peer-key-file="$ETCD_SECRETS/coordinator.key"
      --peer-trusted-ca-file="$ETCD_SECRETS/ca.crt" --peer-client-cert-auth)
    ctl_tls=(--cacert="$ETCD_SECRETS/ca.crt" --cert="$ETCD_SECRETS/coordinator.crt"
      --key="$ETCD_SECRETS/coordinator.key")
  fi
  for bin in "$ETCD_BIN/etcd" "$ETCD_BIN/etcdctl"; do
    if [ ! -x "$bin" ]; then
      echo "--ha needs $bin (Debian: apt-get install etcd-server etcd-client)" >&2
      return 1
    fi
  done
  for i in 0 1 2; do
    peers+="${peers:+,}etcd$i=$scheme://127.0.0.1:$((PORT + 110 + i))"
    endpoints+="${endpoints:+,}$scheme://127.0.0.1:$((PORT + 100 + i))"
  done
  rm -rf "$RUN_DIR/etcd"
  mkdir -m 0700 "$RUN_DIR/etcd"
  for i in 0 1 2; do
    "$ETCD_BIN/etcd" --name="etcd$i" --data-dir="$RUN_DIR/etcd/etcd$i" \
      --listen-client-urls="$scheme://127.0.0.1:$((PORT + 100 + i))" \
      --advertise-client-urls="$scheme://127.0.0.1:$((PORT + 100 + i))" \
      --listen-peer-urls="$scheme://127.0.0.1:$((PORT + 110 + i))" \
      --initial-advertise-peer-urls="$scheme://127.0.0.1:$((PORT + 110 + i))" \
      --initial-cluster="$peers" --initial-cluster-state=new --initial-cluster-token="tessera-local-$PORT" \
      ${tls[@]+"${tls[@]}"} --logger=zap --log-outputs=stderr >"$RUN_DIR/etcd/etcd$i.log" 2>&1 &
    echo $! >"$RUN_DIR/etcd$i.pid"
  done
  for _ in $(seq 1 100); do
    if ETCDCTL_API=3 "$ETCD_BIN/etcdctl" --endpoints="$endpoints" ${ctl_tls[@]+"${ctl_tls[@]}"} \
      --dial-timeout=1s --command-timeout=2s endpoint health >/dev/null 2>&1; then
      return 0
    fi
    exited "$RUN_DIR"/etcd*.pid && return 1
    sleep 0.2
  done
  echo "etcd did not become healthy; see $RUN_DIR/etcd/*.log" >&2
  return 1
}

start() {
  local n=4 secure="" ha="" arg pidfile
  for arg in "$@"; do
    case "$arg" in
      --secure) secure=1 ;;
      --ha) ha=1 ;;
      *[!0-9]* | "" | 0) echo "usage: $0 start [NUM_WORKERS] [--secure] [--ha]" >&2; exit 2 ;;
      *) n="$arg" ;;
    esac
  done
  if [ -n "$ha" ] && [ "$n" -gt 48 ]; then
    echo "--ha takes at most 48 workers (the second coordinator listens on port+50)" >&2
    exit 2
  fi
  mkdir -p "$RUN_DIR"
  # A daemon of an earlier start still running: refuse. Pid files of those
  # gone would read as daemons that exited during this start-up.
  for pidfile in "$RUN_DIR"/coordinator*.pid "$RUN_DIR"/etcd*.pid "$RUN_DIR"/w*.pid; do
    [ -f "$pidfile" ] || continue
    if kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      echo "a local cluster is already running ($(basename "$pidfile" .pid), pid $(cat "$pidfile")); stop it first" >&2
      exit 1
    fi
    rm -f "$pidfile"
  done
  local coordinator_tls=() metadata=() first_ha=()
  # The readiness check below talks to this cluster only as it is set up,
  # whatever TESSERA_TLS_* and TESSERA_TOKEN_FILE this shell has.
  CLI_ENV=(-u TESSERA_TLS_CA -u TESSERA_TLS_CERT -u TESSERA_TLS_KEY -u TESSERA_TOKEN_FILE)
  rm -f "$RUN_DIR/secure" "$RUN_DIR/ha"
  COORDINATORS="$COORDINATOR"
  if [ -n "$ha" ]; then COORDINATORS="$COORDINATOR,$SECOND_COORDINATOR"; fi
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
  if [ -n "$ha" ]; then
    touch "$RUN_DIR/ha"
    metadata=(--metadata="etcd://$ETCD_ENDPOINTS/tessera")
    if [ -n "$secure" ]; then
      # A CA of etcd's own: a certificate of the cluster's (a worker's, the
      # user's) must not open etcd, which holds the cluster's secret.
      if [ ! -e "$ETCD_SECRETS/ca.crt" ]; then
        deploy/make-certs.sh "$ETCD_SECRETS" --workers 0 >/dev/null
      fi
      metadata+=(--etcd_ca="$ETCD_SECRETS/ca.crt" --etcd_cert="$ETCD_SECRETS/coordinator.crt"
        --etcd_key="$ETCD_SECRETS/coordinator.key")
    fi
    if ! start_etcd "$secure"; then
      stop
      exit 1
    fi
    first_ha=("${metadata[@]}" --advertise="$COORDINATOR")
  fi
  # shellcheck disable=SC2086
  "$BIN/coordinator/tessera-coordinator" --listen="$COORDINATOR" ${first_ha[@]+"${first_ha[@]}"} \
    ${coordinator_tls[@]+"${coordinator_tls[@]}"} ${TESSERA_COORDINATOR_FLAGS:-} >"$RUN_DIR/coordinator.log" 2>&1 &
  echo $! >"$RUN_DIR/coordinator.pid"
  if [ -n "$ha" ]; then
    # The second stands by (answering with the leader's address) while the
    # first leads.
    # shellcheck disable=SC2086
    "$BIN/coordinator/tessera-coordinator" --listen="$SECOND_COORDINATOR" \
      "${metadata[@]}" --advertise="$SECOND_COORDINATOR" ${coordinator_tls[@]+"${coordinator_tls[@]}"} \
      ${TESSERA_COORDINATOR_FLAGS:-} >"$RUN_DIR/coordinator2.log" 2>&1 &
    echo $! >"$RUN_DIR/coordinator2.pid"
  fi
  for ((i = 0; i < n; i++)); do
    local worker_tls=()
    if [ -n "$secure" ]; then
      worker_tls=(--tls_ca="$SECRETS/ca.crt" --tls_cert="$SECRETS/w$i.crt" --tls_key="$SECRETS/w$i.key"
        --token_file="$SECRETS/w$i.token")
    fi
    # shellcheck disable=SC2086
    "$BIN/worker/tessera-worker" --coordinator="$COORDINATORS" --listen="127.0.0.1:$((PORT + 1 + i))" \
      --name="w$i" --rank="$i" ${worker_tls[@]+"${worker_tls[@]}"} ${TESSERA_WORKER_FLAGS:-} \
      >"$RUN_DIR/w$i.log" 2>&1 &
    echo $! >"$RUN_DIR/w$i.pid"
  done
  # Ready once every worker is listed alive (asked as the user the env line sets up).
  local list data
  for _ in $(seq 1 200); do
    list=$(env "${CLI_ENV[@]}" "$BIN/client/tessera" --coordinator="$COORDINATORS" workers --json 2>/dev/null || true)
    alive=$(grep -o '"alive": true' <<<"$list" | wc -l || true)
    if [ "$alive" -eq "$n" ]; then
      if [ -n "$ha" ]; then
        echo "local cluster up: coordinators $COORDINATOR and $SECOND_COORDINATOR (metadata in etcd" \
          "$ETCD_ENDPOINTS), $n workers (logs in $RUN_DIR)"
      else
        echo "local cluster up: coordinator $COORDINATOR, $n workers (logs in $RUN_DIR)"
      fi
      # "w0 127.0.0.1:PORT, w1 ...": each worker's data_address (none: --data_listen=off).
      data=$(sed 's/}, {/}\n{/g' <<<"$list" |
        sed -n 's/.*"name": "\([^"]*\)".*"data_address": "\([^"][^"]*\)".*/\1 \2/p' | paste -sd , - |
        sed 's/,/, /g')
      echo "data ports: ${data:-none}"
      if [ -n "$secure" ]; then
        echo "secured (mutual TLS, tokens in $SECRETS); to use the CLI as admin:"
        env_line
      elif [ -n "$ha" ]; then
        echo "to use the CLI:"
        echo "export TESSERA_COORDINATOR=$COORDINATORS"
      fi
      return 0
    fi
    exited "$RUN_DIR"/coordinator*.pid "$RUN_DIR"/w*.pid "$RUN_DIR"/etcd*.pid && break
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
  local failed=0 pidfile
  # Workers first, all at once (their shards go with them), then the
  # coordinators, then etcd (--ha), which they write to until they exit.
  stop_all "$RUN_DIR"/w*.pid || failed=1
  stop_all "$RUN_DIR"/coordinator*.pid || failed=1
  # etcd members one at a time: a leader told to stop hands its leadership
  # to a member still running, at once, where one that is stopping too
  # keeps it waiting for up to 7 s.
  for pidfile in "$RUN_DIR"/etcd*.pid; do
    stop_all "$pidfile" || failed=1
  done
  echo "local cluster stopped"
  return $failed
}

case "${1:-}" in
  start) shift; start "$@" ;;
  env)
    if [ -f "$RUN_DIR/secure" ] && [ -e "$SECRETS/ca.crt" ]; then
      env_line
    else
      echo "export TESSERA_COORDINATOR=$COORDINATORS"
    fi
    ;;
  stop) stop ;;
  *) echo "usage: $0 start [NUM_WORKERS] [--secure] [--ha] | env | stop" >&2; exit 2 ;;
esac
