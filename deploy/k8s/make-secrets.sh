#!/usr/bin/env bash
# Makes the Secrets deploy/k8s expects: deploy/make-certs.sh makes the CA, the
# certificates and the tokens; this wraps the coordinator's and the workers'
# files as Secrets.
#
#   deploy/k8s/make-secrets.sh OUTDIR [NAMESPACE]     # NAMESPACE default: default
#   kubectl apply -n NAMESPACE -f OUTDIR/secrets.yaml
#   kubectl apply -n NAMESPACE -k deploy/k8s
#
# OUTDIR (created, mode 0700) then also holds what a user's CLI needs:
#   tessera --coordinator=... --tls_ca=OUTDIR/ca.crt --tls_cert=OUTDIR/user.crt \
#           --tls_key=OUTDIR/user.key --token_file=OUTDIR/admin.token workers
# (writer.token and reader.token for the write and read roles). Keep ca.key
# offline; it signs new certificates.
#
# Names: the coordinator's certificate covers its Service
# (tessera-coordinator[.NAMESPACE[.svc[.CLUSTER_DOMAIN]]]); the workers share
# one certificate for their per-pod DNS names
# (*.tessera-worker.NAMESPACE.svc[.CLUSTER_DOMAIN]), which is what they
# advertise, and one principal `tessera-worker-*` (every pod of the
# StatefulSet is named tessera-worker-I). CLUSTER_DOMAIN is
# $TESSERA_CLUSTER_DOMAIN, default cluster.local.
#
# One more principal, `tessera-drain` (role admin; OUTDIR/tessera-drain.token):
# the workers' preStop hook drains its worker with it (`tessera worker
# drain`), and a worker's new pod undoes that drain.
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 OUTDIR [NAMESPACE]" >&2
  exit 2
fi
OUT="$1"
NS="${2:-default}"
DOMAIN="${TESSERA_CLUSTER_DOMAIN:-cluster.local}"
HERE="$(cd "$(dirname "$0")" && pwd)"

svc() { echo "$1" "$1.$NS" "$1.$NS.svc" "$1.$NS.svc.$DOMAIN"; }
coordinator_sans=()
for name in $(svc tessera-coordinator); do coordinator_sans+=(--coordinator-san "$name"); done
# Each coordinator pod by name (workers and the CLI dial them one by one);
# gRPC's wildcards need a dot after the first label, so the full names.
coordinator_sans+=(--coordinator-san "*.tessera-coordinator.$NS.svc"
  --coordinator-san "*.tessera-coordinator.$NS.svc.$DOMAIN")
"$HERE/../make-certs.sh" "$OUT" --workers 0 --worker-group tessera-worker \
  "${coordinator_sans[@]}" \
  --worker-san "*.tessera-worker.$NS.svc" --worker-san "*.tessera-worker.$NS.svc.$DOMAIN" >/dev/null
(
  umask 077
  openssl rand -hex 32 | tr -d '\n' >"$OUT/tessera-drain.token"
  echo "tessera-drain admin $(cat "$OUT/tessera-drain.token")" >>"$OUT/tokens"
)

b64() { base64 -w0 <"$OUT/$1"; }
tls_secret() {  # tls_secret SECRET_NAME FILE
  cat <<EOF
---
apiVersion: v1
kind: Secret
metadata:
  name: $1
type: kubernetes.io/tls
data:
  ca.crt: $(b64 ca.crt)
  tls.crt: $(b64 "$2.crt")
  tls.key: $(b64 "$2.key")
EOF
}
(
  umask 077
  {
    tls_secret tessera-coordinator-tls coordinator
    tls_secret tessera-worker-tls tessera-worker
    cat <<EOF
---
apiVersion: v1
kind: Secret
metadata:
  name: tessera-coordinator-tokens
type: Opaque
data:
  tokens: $(b64 tokens)
---
apiVersion: v1
kind: Secret
metadata:
  name: tessera-worker-token
type: Opaque
data:
  token: $(b64 tessera-worker.token)
---
apiVersion: v1
kind: Secret
metadata:
  name: tessera-drain-token
type: Opaque
data:
  token: $(b64 tessera-drain.token)
EOF
  } >"$OUT/secrets.yaml"
)
echo "wrote $OUT/secrets.yaml (namespace $NS) and the client's files; next: kubectl apply -n $NS -f $OUT/secrets.yaml"
