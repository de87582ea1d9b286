#!/usr/bin/env bash
# Makes the Secrets deploy/k8s expects: a private CA, certificates for the
# coordinator, the workers and one client (mutual TLS), and random tokens.
#
#   deploy/k8s/make-secrets.sh OUTDIR [NAMESPACE]     # NAMESPACE default: default
#   kubectl apply -n NAMESPACE -f OUTDIR/secrets.yaml
#   kubectl apply -n NAMESPACE -k deploy/k8s
#
# OUTDIR (created, mode 0700) then also holds what a user's CLI needs:
#   tessera --coordinator=... --tls_ca=OUTDIR/ca.crt --tls_cert=OUTDIR/client.crt \
#           --tls_key=OUTDIR/client.key --token_file=OUTDIR/admin.token workers
# Keep ca.key offline; it signs new certificates.
#
# Certificate names: the coordinator's covers its Service
# (tessera-coordinator[.NAMESPACE[.svc[.cluster.local]]]); the workers' covers
# their per-pod DNS names (*.tessera-worker.NAMESPACE.svc...). Workers
# advertise their pod IP (--advertise), which no certificate made ahead of
# time can name: see README.md "Probes and TLS".
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 OUTDIR [NAMESPACE]" >&2
  exit 2
fi
OUT="$1"
NS="${2:-default}"
DAYS="${TESSERA_CERT_DAYS:-365}"
command -v openssl >/dev/null || { echo "needs openssl" >&2; exit 1; }
if [ -e "$OUT/ca.key" ]; then
  echo "$OUT already holds a CA; refusing to overwrite it" >&2
  exit 1
fi
mkdir -p "$OUT"
chmod 0700 "$OUT"
cd "$OUT"
umask 077

openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ca.key 2>/dev/null
openssl req -x509 -new -key ca.key -subj "/CN=tessera-ca" -days "$((DAYS * 10))" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out ca.crt

# leaf NAME CN SUBJECT_ALT_NAMES
leaf() {
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key" 2>/dev/null
  openssl req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr"
  printf '%s\n' "basicConstraints=critical,CA:FALSE" \
    "keyUsage=critical,digitalSignature,keyEncipherment" \
    "extendedKeyUsage=serverAuth,clientAuth" ${3:+"subjectAltName=$3"} >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days "$DAYS" \
    -extfile "$1.ext" -out "$1.crt" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
svc() { echo "DNS:$1,DNS:$1.$NS,DNS:$1.$NS.svc,DNS:$1.$NS.svc.cluster.local"; }
leaf coordinator tessera-coordinator "$(svc tessera-coordinator),DNS:localhost,IP:127.0.0.1"
leaf worker tessera-worker "$(svc tessera-worker),DNS:*.tessera-worker.$NS.svc,DNS:*.tessera-worker.$NS.svc.cluster.local"
leaf client tessera-client ""
rm -f ca.srl

secret() { openssl rand -hex 32 | tr -d "\n"; }  # no newline: the file is the secret
secret >worker.token
secret >admin.token
{
  echo "# NAME ROLE SECRET (made by deploy/k8s/make-secrets.sh)"
  echo "workers worker $(cat worker.token)"
  echo "admin admin $(cat admin.token)"
} >tokens

b64() { base64 -w0 <"$1"; }
tls_secret() {
  cat <<EOF
---
apiVersion: v1
kind: Secret
metadata:
  name: tessera-$1-tls
type: kubernetes.io/tls
data:
  ca.crt: $(b64 ca.crt)
  tls.crt: $(b64 "$1.crt")
  tls.key: $(b64 "$1.key")
EOF
}
{
  tls_secret coordinator
  tls_secret worker
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
  token: $(b64 worker.token)
EOF
} >secrets.yaml
echo "wrote $OUT/secrets.yaml (namespace $NS) and the client's files; next: kubectl apply -n $NS -f $OUT/secrets.yaml"
