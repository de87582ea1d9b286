#!/usr/bin/env bash
# Runs deploy/compose.yaml (the secured 4-worker cluster) with whichever
# compose this host has, on the ports TESSERA_PORT picks, and fails loudly
# where that compose cannot run it rather than report success.
#
#   TESSERA_SECRETS=DIR deploy/compose.sh up      # after deploy/container-secrets.sh DIR 4
#   deploy/compose.sh down [-v]                   # -v: the metadata volume too
#   deploy/compose.sh config                      # the compose file, ports moved
#
# Ports: coordinator $TESSERA_PORT (default 7070), worker i on port+1+i,
# its data port on port+11+i, metrics on each gRPC port + 1000 (a copy of
# compose.yaml with the ports moved). Compose: `docker compose` if it runs,
# else podman-compose. Some podman-compose releases (Debian 12's 1.0.3) add
# their project network to every service even with network_mode: host;
# podman then refuses each container ("cannot set multiple networks"), yet
# podman-compose exits 0.
# Their dry run shows it, so `up` refuses before starting anything and
# names deploy/cluster-up.sh, which starts the same cluster with podman.
set -euo pipefail
cd "$(dirname "$0")/.."

PORT="${TESSERA_PORT:-7070}"
if ! [[ "$PORT" =~ ^[0-9]+$ ]] || [ "$PORT" -lt 1024 ] || [ "$PORT" -gt 55000 ]; then
  echo "error: TESSERA_PORT=$PORT: a port from 1024 to 55000" >&2
  exit 2
fi
case "${1:-}" in
  up | down | config) ;;
  *) echo "usage: TESSERA_SECRETS=DIR $0 up | $0 down [-v] | $0 config" >&2; exit 2 ;;
esac

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
file="$work/compose.yaml"
/usr/bin/python3 - deploy/compose.yaml "$PORT" >"$file" <<'PYEOF'
import re, sys
text, port = open(sys.argv[1]).read(), int(sys.argv[2])
print(re.sub(r"127\.0\.0\.1:([78]0\d\d)",
             lambda m: f"127.0.0.1:{int(m[1]) - 7070 + port}", text), end="")
PYEOF
if [ "$1" = config ]; then
  cat "$file"
  exit 0
fi

if docker compose version >/dev/null 2>&1; then
  compose=(docker compose -p tessera -f "$file")
elif command -v podman-compose >/dev/null 2>&1; then
  compose=(podman-compose -p tessera -f "$file")
else
  echo "error: neither docker compose nor podman-compose is installed; deploy/cluster-up.sh 4 --secure starts the same cluster with podman" >&2
  exit 1
fi

if [ "$1" = up ] && [ "${compose[0]}" = podman-compose ]; then
  plan=$("${compose[@]}" --dry-run up -d 2>&1) || { echo "$plan" >&2; exit 1; }
  # No `grep | grep -q` here: under pipefail, grep -q leaving early makes the
  # first grep die of SIGPIPE, and the check would pass by chance.
  runs=$(grep -E '^podman (run|create) ' <<<"$plan" || true)
  if grep -q -- '--network host' <<<"$runs" && grep -qE -- '--net [^ ]+ --network-alias' <<<"$runs"; then
    echo "error: $(podman-compose version 2>/dev/null | grep -i 'podman-compose' | head -1 | tr -d '\n'):" \
      "it adds a bridge network to host-network services, which podman refuses." \
      "Start the same cluster with deploy/cluster-up.sh 4 --secure (stop it with deploy/cluster-down.sh)" >&2
    exit 1
  fi
fi

if [ "$1" = up ]; then
  "${compose[@]}" up -d
else
  "${compose[@]}" "$@"
fi
if [ "$1" = up ]; then
  # A compose that exits 0 with containers refused is a failure here.
  runner=docker
  [ "${compose[0]}" = podman-compose ] && runner=podman
  running=$("$runner" ps --filter label=io.tessera.cluster=tessera --format '{{.Names}}' | wc -l)
  if [ "$running" -ne 5 ]; then
    echo "error: compose reported success but $running of 5 containers run" >&2
    exit 1
  fi
  echo "cluster up: coordinator 127.0.0.1:$PORT, workers on $((PORT + 1))-$((PORT + 4))," \
    "data ports $((PORT + 11))-$((PORT + 14))"
fi
