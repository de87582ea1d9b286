#!/usr/bin/env bash
# Prepares the certificates and tokens of a secured containerised cluster
# (deploy/cluster-up.sh --secure, deploy/compose.yaml): makes them with
# deploy/make-certs.sh into SECRETS_DIR unless it holds them already, then
# copies each daemon's own files into SECRETS_DIR/containers/NAME, owned by
# the image's user (uid 10001), read-only (files 0400, directories 0500):
#
#   containers/coordinator/  ca.crt tls.crt tls.key tokens
#   containers/wI/           ca.crt tls.crt tls.key token      (worker wI)
#   containers/client/       ca.crt tls.crt tls.key admin.token writer.token reader.token
#
# Each is mounted read-only at /etc/tessera in its container. The tokens file
# stays 0400, as the coordinator requires (no group or other access), and is
# still readable by the daemon because uid 10001 owns the copy; SECRETS_DIR
# is 0700, so on the host only its owner reaches the copies. A container sees
# only its own key and token, never ca.key.
#
#   deploy/container-secrets.sh SECRETS_DIR [NUM_WORKERS]      # default 4
#   deploy/container-secrets.sh --remove SECRETS_DIR           # drop the copies
#
# Certificates name the host part clients dial (127.0.0.1, localhost) and the
# container names ($TESSERA_CLUSTER-coordinator, $TESSERA_CLUSTER-wI; cluster
# default tessera). Rootless podman: the copies are chowned inside podman's
# user namespace (podman unshare).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=deploy/podman_env.sh
source deploy/podman_env.sh

UID_IN_IMAGE=10001
CLUSTER="${TESSERA_CLUSTER:-tessera}"

# as_container_root CMD...: runs CMD as root over files owned by the image's
# user: directly when we are root, else inside podman's user namespace.
as_container_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else "${PODMAN[@]}" unshare "$@"; fi
}

if [ "${1:-}" = --remove ]; then
  [ $# -eq 2 ] || { echo "usage: $0 --remove SECRETS_DIR" >&2; exit 2; }
  [ ! -e "$2/containers" ] || as_container_root rm -rf "$2/containers"
  exit 0
fi
if [ $# -lt 1 ] || [ $# -gt 2 ] || ! [[ "${2:-4}" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 SECRETS_DIR [NUM_WORKERS] | --remove SECRETS_DIR" >&2
  exit 2
fi
S="$1"
N="${2:-4}"

if [ ! -e "$S/ca.crt" ]; then
  deploy/make-certs.sh "$S" --workers "$N" --san "$CLUSTER-%n" >&2
fi
for f in ca.crt coordinator.crt coordinator.key tokens user.crt user.key admin.token \
  writer.token reader.token "w$((N - 1)).crt"; do
  [ -e "$S/$f" ] || { echo "$S has no $f (certificates for fewer than $N workers?); remove it to make new ones" >&2; exit 1; }
done

C="$S/containers"
[ ! -e "$C" ] || as_container_root rm -rf "$C"
(
  umask 077
  mkdir -p "$C"
  # stage NAME SRC:DEST...: copies SECRETS_DIR/SRC to containers/NAME/DEST.
  stage() {
    local name="$1" pair
    shift
    mkdir -p "$C/$name"
    for pair in "$@"; do cp "$S/${pair%%:*}" "$C/$name/${pair#*:}"; done
  }
  stage coordinator ca.crt:ca.crt coordinator.crt:tls.crt coordinator.key:tls.key tokens:tokens
  for ((i = 0; i < N; i++)); do
    stage "w$i" ca.crt:ca.crt "w$i.crt:tls.crt" "w$i.key:tls.key" "w$i.token:token"
  done
  stage client ca.crt:ca.crt user.crt:tls.crt user.key:tls.key admin.token:admin.token \
    writer.token:writer.token reader.token:reader.token
  find "$C" -mindepth 1 -type f -exec chmod 0400 {} +
  find "$C" -mindepth 1 -type d -exec chmod 0500 {} +
)
as_container_root chown -R "$UID_IN_IMAGE:$UID_IN_IMAGE" "$C"
echo "$C"
