#!/usr/bin/env bash
# Starts a containerised tessera cluster on this host: one coordinator (its
# metadata on the volume CLUSTER-data) and N workers, as podman containers on
# the host network serving loopback ports; with --secure, the same cluster as
# deploy/compose.yaml (which has N=4). Returns once `tessera workers` lists
# every worker alive, printing the coordinator's address and a ready line.
#
#   deploy/build-images.sh                   # first: localhost/tessera:latest
#   deploy/cluster-up.sh [N] [--secure]      # default 4 workers
#   bazel-bin/client/tessera --coordinator=127.0.0.1:7070 workers
#   deploy/cluster-down.sh [--volumes]
#
# --secure: mutual TLS and tokens (CLI.md "Security"). The certificates and
# tokens are made once into $TESSERA_SECRETS (deploy/container-secrets.sh,
# which runs deploy/make-certs.sh) and reused by later starts; each daemon
# gets its own certificate, key and token mounted read-only at /etc/tessera.
# Prints the line that points the host's CLI at them (user certificate, admin
# token). Without it the daemons run in protected mode: plaintext, no tokens,
# loopback only.
#
# Ports: coordinator $TESSERA_PORT (default 7070), worker i on port+1+i and
# its data port (shard bytes over TCP) on port+11+i, as in compose.yaml
# (port+1+N+i with more than 10 workers); metrics on port+1000 and up.
# Environment:
#   TESSERA_CLUSTER=NAME        container/volume name prefix and label (default tessera)
#   TESSERA_PORT=P              coordinator port (default 7070)
#   TESSERA_IMAGE_REF=IMAGE     image (default localhost/tessera:latest)
#   TESSERA_CLI=PATH            host CLI for the readiness check (default
#                               bazel-bin/client/tessera; without one the
#                               check runs the CLI in a container)
#   TESSERA_COORDINATOR_FLAGS, TESSERA_WORKER_FLAGS   extra daemon flags
#   TESSERA_READY_TIMEOUT=S     how long to wait for the workers (default 60)
#   TESSERA_SECRETS=DIR         --secure: certificates and tokens (default
#                               $TESSERA_STATE_DIR/CLUSTER-secrets, see podman_env.sh)
#   TESSERA_PODMAN_ROOT=DIR     private podman store (see deploy/podman_env.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=deploy/podman_env.sh
source deploy/podman_env.sh

N=4
SECURE=""
for arg in "$@"; do
  case "$arg" in
    --secure) SECURE=1 ;;
    *)
      if ! [[ "$arg" =~ ^[1-9][0-9]*$ ]]; then
        echo "usage: $0 [NUM_WORKERS] [--secure]   (NUM_WORKERS a positive number, default 4)" >&2
        exit 2
      fi
      N="$arg"
      ;;
  esac
done
CLUSTER="${TESSERA_CLUSTER:-tessera}"
PORT="${TESSERA_PORT:-7070}"
IMAGE="${TESSERA_IMAGE_REF:-$TESSERA_IMAGE:latest}"
CLI="${TESSERA_CLI:-bazel-bin/client/tessera}"
COORDINATOR="127.0.0.1:$PORT"
DATA_PORT=$((PORT + 1 + (N > 10 ? N : 10)))  # worker 0's data port
TIMEOUT="${TESSERA_READY_TIMEOUT:-60}"

if [ -n "$("${PODMAN[@]}" ps -aq --filter "label=io.tessera.cluster=$CLUSTER")" ]; then
  echo "cluster '$CLUSTER' has containers already; stop it first: deploy/cluster-down.sh" >&2
  exit 1
fi
if ! "${PODMAN[@]}" image exists "$IMAGE"; then
  echo "no image $IMAGE; build it first: deploy/build-images.sh" >&2
  exit 1
fi

# The daemons as the Kubernetes manifests run them: non-root (the image's
# user), read-only root filesystem without the writable /tmp and /run podman
# would add (Kubernetes adds none either), no capabilities; --init forwards
# SIGTERM.
RUN=("${PODMAN[@]}" run -d --init --network host --read-only --read-only-tmpfs=false --cap-drop ALL
  --security-opt no-new-privileges --label "io.tessera.cluster=$CLUSTER")

# --secure: each daemon's own files at /etc/tessera (read-only, owned by the
# image's user; the tokens file 0400 as the coordinator requires).
TLS=(--tls_ca=/etc/tessera/ca.crt --tls_cert=/etc/tessera/tls.crt --tls_key=/etc/tessera/tls.key)
CLI_ENV=(-u TESSERA_TLS_CA -u TESSERA_TLS_CERT -u TESSERA_TLS_KEY -u TESSERA_TOKEN_FILE)
CLIENT_FLAGS=()
coordinator_secure=()
if [ -n "$SECURE" ]; then
  SECRETS="${TESSERA_SECRETS:-$TESSERA_STATE_DIR/$CLUSTER-secrets}"
  deploy/container-secrets.sh "$SECRETS" "$N" >/dev/null
  SECRETS="$(cd "$SECRETS" && pwd)"
  STAGED="$SECRETS/containers"
  RUN+=(--label "io.tessera.secrets=$SECRETS")
  coordinator_secure=(-v "$STAGED/coordinator:/etc/tessera:ro")
  CLI_ENV=("TESSERA_TLS_CA=$SECRETS/ca.crt" "TESSERA_TLS_CERT=$SECRETS/user.crt"
    "TESSERA_TLS_KEY=$SECRETS/user.key" "TESSERA_TOKEN_FILE=$SECRETS/admin.token")
  CLIENT_FLAGS=(-v "$STAGED/client:/etc/tessera:ro" -e TESSERA_TLS_CA=/etc/tessera/ca.crt
    -e TESSERA_TLS_CERT=/etc/tessera/tls.crt -e TESSERA_TLS_KEY=/etc/tessera/tls.key
    -e TESSERA_TOKEN_FILE=/etc/tessera/admin.token)
fi

"${PODMAN[@]}" volume exists "$CLUSTER-data" ||
  "${PODMAN[@]}" volume create --label "io.tessera.cluster=$CLUSTER" "$CLUSTER-data" >/dev/null
# shellcheck disable=SC2086
"${RUN[@]}" --name "$CLUSTER-coordinator" --label io.tessera.role=coordinator \
  -v "$CLUSTER-data:/var/lib/tessera" ${coordinator_secure[@]+"${coordinator_secure[@]}"} "$IMAGE" \
  tessera-coordinator --listen="$COORDINATOR" --data_dir=/var/lib/tessera \
  --metrics_listen="127.0.0.1:$((PORT + 1000))" \
  ${SECURE:+"${TLS[@]}" --tokens=/etc/tessera/tokens} ${TESSERA_COORDINATOR_FLAGS:-} >/dev/null
for ((i = 0; i < N; i++)); do
  worker_secure=()
  [ -z "$SECURE" ] || worker_secure=(-v "$STAGED/w$i:/etc/tessera:ro")
  # shellcheck disable=SC2086
  "${RUN[@]}" --name "$CLUSTER-w$i" --label io.tessera.role=worker \
    ${worker_secure[@]+"${worker_secure[@]}"} "$IMAGE" \
    tessera-worker --coordinator="$COORDINATOR" --listen="127.0.0.1:$((PORT + 1 + i))" \
    --data_listen="127.0.0.1:$((DATA_PORT + i))" --name="w$i" --rank="$i" \
    --metrics_listen="127.0.0.1:$((PORT + 1001 + i))" \
    ${SECURE:+"${TLS[@]}" --token_file=/etc/tessera/token} ${TESSERA_WORKER_FLAGS:-} >/dev/null
done
echo "coordinator: $COORDINATOR"
echo "metrics: http://127.0.0.1:$((PORT + 1000))/metrics (coordinator); ports $((PORT + 1001))-$((PORT + 1000 + N)) (workers)"
echo "workers' data ports: $DATA_PORT-$((DATA_PORT + N - 1))"

workers_json() {
  if [ -x "$CLI" ]; then
    env "${CLI_ENV[@]}" "$CLI" --coordinator="$COORDINATOR" workers --json 2>/dev/null
  else
    "${PODMAN[@]}" run --rm --network host ${CLIENT_FLAGS[@]+"${CLIENT_FLAGS[@]}"} "$IMAGE" \
      tessera --coordinator="$COORDINATOR" workers --json 2>/dev/null
  fi
}

deadline=$((SECONDS + TIMEOUT))
while ((SECONDS < deadline)); do
  alive=$(workers_json | grep -o '"alive": *true' | wc -l || true)
  if [ "$alive" -eq "$N" ]; then
    echo "cluster '$CLUSTER' ready: $N workers alive (containers $CLUSTER-coordinator, $CLUSTER-w0..w$((N - 1)))"
    if [ -n "$SECURE" ]; then
      echo "secured (mutual TLS, tokens in $SECRETS); to use the host's CLI as admin:"
      words=("TESSERA_COORDINATOR=$COORDINATOR" "${CLI_ENV[@]}")
      line="export"
      for w in "${words[@]}"; do line="$line ${w%%=*}=$(printf '%q' "${w#*=}")"; done
      echo "$line"
    fi
    exit 0
  fi
  exited=$("${PODMAN[@]}" ps -a --filter "label=io.tessera.cluster=$CLUSTER" --filter status=exited --format '{{.Names}}')
  [ -z "$exited" ] || { echo "containers exited during start-up: $exited" >&2; break; }
  sleep 0.2
done
echo "cluster '$CLUSTER' did not come up ($alive of $N workers alive); last log lines:" >&2
for name in $("${PODMAN[@]}" ps -a --filter "label=io.tessera.cluster=$CLUSTER" --format '{{.Names}}'); do
  echo "--- $name" >&2
  "${PODMAN[@]}" logs --tail 5 "$name" >&2 2>&1 || true
done
deploy/cluster-down.sh >/dev/null 2>&1 || true
exit 1
