#!/usr/bin/env bash
# Makes the Secrets deploy/k8s expects: deploy/make-certs.sh makes the CA, the
# certificates and the tokens (and etcd's CA and certificates); this wraps the
# coordinator's, the workers' and etcd's files as Secrets.
#
#   deploy/k8s/make-secrets.sh OUTDIR [NAMESPACE]     # NAMESPACE default: default
#   kubectl apply -n NAMESPACE -f OUTDIR/secrets.yaml
#   kubectl apply -n NAMESPACE -k deploy/k8s
#
# OUTDIR (created, mode 0700) then also holds what a user's CLI needs:
#   tessera --coordinator=... --tls_ca=OUTDIR/ca.crt --tls_cert=OUTDIR/user.crt \
#           --tls_key=OUTDIR/user.key --token_file=OUTDIR/admin.token workers
# (writer.token and reader.token for the write and read roles). Keep ca.key
# and etcd-ca.key offline; they sign new certificates.
#
# Names: the coordinator's certificate covers its Service
# (tessera-coordinator[.NAMESPACE[.svc[.CLUSTER_DOMAIN]]]); the workers share
# one certificate for their per-pod DNS names
# (*.tessera-worker.NAMESPACE.svc[.CLUSTER_DOMAIN]), which is what they
# advertise, and one principal `tessera-worker-*` (every pod of the
# StatefulSet is named tessera-worker-I). The certificate also names
# *.NAMESPACE.pod.CLUSTER_DOMAIN, the pods' A records (IP-WITH-DASHES...),
# which the workers of components/inference-daemonset advertise (a
# DaemonSet's pods have no per-pod name under a Service; they are named
# tessera-worker-inference-XXXXX, which the same principal registers).
# CLUSTER_DOMAIN is $TESSERA_CLUSTER_DOMAIN, default cluster.local.
#
# etcd has a CA of its own (OUTDIR/etcd-ca.crt, .key): etcd admits any client
# certificate of the CA it trusts, and the cluster's CA also signs the
# workers' and the user's. The members share one certificate (Secret
# tessera-etcd-tls: etcd-member.crt, serverAuth and clientAuth) naming each
# member tessera-etcd-I.tessera-etcd[.NAMESPACE[.svc[.CLUSTER_DOMAIN]]] for I
# below $TESSERA_ETCD_MEMBERS (default 3), *.tessera-etcd.NAMESPACE.svc,
# *.tessera-etcd.NAMESPACE.svc.CLUSTER_DOMAIN, tessera-etcd[.NAMESPACE...],
# localhost and 127.0.0.1 (etcdctl in a member's pod); the coordinators get a
# client certificate of that CA (Secret tessera-coordinator-etcd-tls:
# etcd-coordinator.crt, clientAuth only).
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
ETCD_MEMBERS="${TESSERA_ETCD_MEMBERS:-3}"
[[ "$ETCD_MEMBERS" =~ ^[1-9][0-9]?$ ]] || {
  echo "TESSERA_ETCD_MEMBERS takes a number of members, not '$ETCD_MEMBERS'" >&2
  exit 2
}
HERE="$(cd "$(dirname "$0")" && pwd)"

svc() { echo "$1" "$1.$NS" "$1.$NS.svc" "$1.$NS.svc.$DOMAIN"; }
coordinator_sans=()
for name in $(svc tessera-coordinator); do coordinator_sans+=(--coordinator-san "$name"); done
# Each coordinator pod by name (workers and the CLI dial them one by one);
# gRPC's wildcards need a dot after the first label, so the full names.
coordinator_sans+=(--coordinator-san "*.tessera-coordinator.$NS.svc"
  --coordinator-san "*.tessera-coordinator.$NS.svc.$DOMAIN")
# etcd's members: the coordinators (gRPC) dial them by their qualified names,
# which the wildcards cover. A member checks the certificate of a peer that
# connects against the peer's address, resolving the names it carries (a
# wildcard only by reverse DNS): hence each member by name too.
etcd_sans=()
for ((i = 0; i < ETCD_MEMBERS; i++)); do
  for name in $(svc "tessera-etcd-$i.tessera-etcd"); do etcd_sans+=(--etcd-san "$name"); done
done
for name in $(svc tessera-etcd); do etcd_sans+=(--etcd-san "$name"); done
etcd_sans+=(--etcd-san "*.tessera-etcd.$NS.svc" --etcd-san "*.tessera-etcd.$NS.svc.$DOMAIN")
"$HERE/../make-certs.sh" "$OUT" --workers 0 --worker-group tessera-worker \
  "${coordinator_sans[@]}" "${etcd_sans[@]}" \
  --worker-san "*.tessera-worker.$NS.svc" --worker-san "*.tessera-worker.$NS.svc.$DOMAIN" \
  --worker-san "*.$NS.pod.$DOMAIN" >/dev/null
(
  umask 077
  openssl rand -hex 32 | tr -d '\n' >"$OUT/tessera-drain.token"
  echo "tessera-drain admin $(cat "$OUT/tessera-drain.token")" >>"$OUT/tokens"
)

b64() { base64 -w0 <"$OUT/$1"; }
tls_secret() {  # tls_secret SECRET_NAME FILE [CA_FILE]
  cat <<EOF
---
apiVersion: v1
kind: Secret
metadata:
  name: $1
type: kubernetes.io/tls
data:
  ca.crt: $(b64 "${3:-ca}.crt")
  tls.crt: $(b64 "$2.crt")
  tls.key: $(b64 "$2.key")
EOF
}
(
  umask 077
  {
    tls_secret tessera-coordinator-tls coordinator
    tls_secret tessera-worker-tls tessera-worker
    tls_secret tessera-etcd-tls etcd-member etcd-ca
    tls_secret tessera-coordinator-etcd-tls etcd-coordinator etcd-ca
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
