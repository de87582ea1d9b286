#!/usr/bin/env bash
# Stops the containerised cluster deploy/cluster-up.sh started: SIGTERM to the
# workers, then to the coordinator, each given TESSERA_STOP_TIMEOUT seconds
# (default 10) before podman kills it; prints every daemon's exit status and
# removes the containers. The coordinator's metadata volume stays (a later
# cluster-up continues the same cluster) unless --volumes is given. A
# --secure cluster's per-container copies of its certificates and tokens are
# removed; the originals in $TESSERA_SECRETS stay for the next cluster-up.
#
#   deploy/cluster-down.sh [--volumes]
#
# Exits 1 when a daemon did not exit 0 on SIGTERM (CLI.md: both daemons stop
# cleanly, exit 0). TESSERA_CLUSTER and TESSERA_PODMAN_ROOT as for cluster-up.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=deploy/podman_env.sh
source deploy/podman_env.sh

volumes=""
case "${1:-}" in
  "") ;;
  --volumes | -v) volumes=1 ;;
  *) echo "usage: $0 [--volumes]" >&2; exit 2 ;;
esac
CLUSTER="${TESSERA_CLUSTER:-tessera}"
STOP_TIMEOUT="${TESSERA_STOP_TIMEOUT:-10}"

names() {  # containers of this cluster with role $1
  "${PODMAN[@]}" ps -a --filter "label=io.tessera.cluster=$CLUSTER" \
    --filter "label=io.tessera.role=$1" --format '{{.Names}}'
}
workers=$(names worker)
coordinator=$(names coordinator)
secrets=""
for name in $coordinator $workers; do
  secrets=$("${PODMAN[@]}" inspect --format '{{index .Config.Labels "io.tessera.secrets"}}' "$name" 2>/dev/null || true)
  [ "$secrets" = "<no value>" ] && secrets=""
  [ -z "$secrets" ] || break
done
failed=0
for group in "$workers" "$coordinator"; do
  [ -n "$group" ] || continue
  # shellcheck disable=SC2086
  "${PODMAN[@]}" stop -t "$STOP_TIMEOUT" $group >/dev/null || failed=1
done
for name in $workers $coordinator; do
  code=$("${PODMAN[@]}" inspect --format '{{.State.ExitCode}}' "$name" 2>/dev/null || echo "?")
  if [ "$code" = 0 ]; then
    echo "$name exited 0"
  else
    echo "$name exited $code (expected 0 on SIGTERM); last log lines:" >&2
    "${PODMAN[@]}" logs --tail 5 "$name" >&2 2>&1 || true
    failed=1
  fi
  "${PODMAN[@]}" rm -f "$name" >/dev/null || failed=1
done
if [ -n "$secrets" ]; then
  deploy/container-secrets.sh --remove "$secrets" || failed=1
fi
if [ -n "$volumes" ] && "${PODMAN[@]}" volume exists "$CLUSTER-data"; then
  "${PODMAN[@]}" volume rm "$CLUSTER-data" >/dev/null || failed=1
  echo "removed volume $CLUSTER-data"
fi
echo "cluster '$CLUSTER' stopped"
exit "$failed"
