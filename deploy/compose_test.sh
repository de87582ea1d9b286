#!/usr/bin/env bash
# deploy/compose.sh as a user meets it: ports (data ports too) move with
# TESSERA_PORT, a bad port is refused, and where the compose at hand cannot
# run a host-network file (Debian 12's podman-compose) `up` fails loudly,
# naming deploy/cluster-up.sh, and starts nothing.
# Prints "compose_test: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/test_lib.sh
source scripts/test_lib.sh

moved=$(TESSERA_PORT=9100 deploy/compose.sh config)
check "coordinator on the moved port" grep -q -- "--listen=127.0.0.1:9100" <<<"$moved"
check "w3 on port+4" grep -q -- "--listen=127.0.0.1:9104" <<<"$moved"
check "w3's metrics on port+1004" grep -q -- "--metrics_listen=127.0.0.1:10104" <<<"$moved"
check "workers' data ports on port+11..port+14" \
  test "$(grep -o -- "--data_listen=[0-9.:]*" <<<"$moved" | tr '\n' ' ')" = \
  "--data_listen=127.0.0.1:9111 --data_listen=127.0.0.1:9112 --data_listen=127.0.0.1:9113 --data_listen=127.0.0.1:9114 "
check "workers dial the moved coordinator" \
  test "$(grep -c -- "--coordinator=127.0.0.1:9100" <<<"$moved")" -eq 4
check "no port of the default left" test "$(grep -c "127.0.0.1:70[0-9][0-9]" <<<"$moved")" -eq 0
TESSERA_PORT=80 deploy/compose.sh config >/dev/null 2>&1
check "port 80 refused (exit 2)" test $? -eq 2

version=$(podman-compose version 2>/dev/null)
if ! docker compose version >/dev/null 2>&1 && grep -q 'version  *1\.0\.[0-3]$' <<<"$version"; then
  err=$(TESSERA_SECRETS=/nonexistent deploy/compose.sh up 2>&1 >/dev/null)
  status=$?
  check "up exits 1 ($status)" test "$status" -eq 1
  check "up names cluster-up.sh: $err" grep -q "deploy/cluster-up.sh 4 --secure" <<<"$err"
  check "nothing started" test -z "$(podman ps -a --filter label=io.tessera.cluster=tessera --format '{{.Names}}' 2>/dev/null)"
else
  echo "no podman-compose 1.0.0-1.0.3 here: the refusal is not exercised"
fi

finish compose_test
