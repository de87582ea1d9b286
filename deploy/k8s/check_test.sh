#!/usr/bin/env bash
# Tests deploy/k8s/check.py: the base passes, and each broken copy of it fails
# with the rule's message. Prints "check_test: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")" || exit 1
PY=/usr/bin/python3
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tessera-k8s-check.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
passed=0
failed=0

ok() { echo "  ok   $*"; passed=$((passed + 1)); }
bad() { echo "  FAIL $*"; failed=$((failed + 1)); }

# Runs check.py on the base and the example Secrets as they are.
for renderer in auto builtin; do
  if out=$($PY check.py --renderer=$renderer . secrets.example.yaml 2>&1); then
    ok "the base passes ($renderer renderer)"
  else
    bad "the base fails ($renderer renderer): $out"
  fi
done

# broken NAME FILE "OLD|||NEW" EXPECTED
#   copies the base, replaces the first OLD by NEW in FILE, and expects
#   check.py to fail with a message containing EXPECTED.
broken() {
  local name="$1" file="$2" edit="$3" expected="$4" dir="$TMP/$1"
  mkdir -p "$dir"
  cp ./*.yaml "$dir/"
  if ! $PY - "$dir/$file" "$edit" <<'PYEOF'
import sys
path, edit = sys.argv[1], sys.argv[2]
old, new = edit.split("|||")
text = open(path).read()
if old not in text:
    sys.exit(f"the text to break is not in {path}: {old!r}")
open(path, "w").write(text.replace(old, new, 1))
PYEOF
  then
    bad "$name: could not break the manifest (the base changed?)"
    return
  fi
  for renderer in auto builtin; do
    if out=$($PY check.py --renderer=$renderer "$dir" "$dir/secrets.example.yaml" 2>&1); then
      bad "$name ($renderer): check.py passed a broken manifest"
    elif ! grep -qF -- "$expected" <<<"$out"; then
      bad "$name ($renderer): failed, but without '$expected': $out"
    else
      ok "$name ($renderer)"
    fi
  done
}

broken no-readiness-probe worker.yaml \
  '          readinessProbe:|||          x-readinessProbe:' 'no readinessProbe'
broken no-memory-limit coordinator.yaml \
  'limits: {cpu: "2", memory: 4Gi}|||limits: {cpu: "2"}' 'no resources.limits.memory'
broken secret-in-env worker.yaml \
  '            - name: POD_NAME|||            - name: WORKER_SECRET
              value: placeholder-worker-secret
            - name: POD_NAME' "holds a Secret's value in plain text"
broken secret-key-ref worker.yaml \
  '            - name: POD_NAME|||            - name: T
              valueFrom: {secretKeyRef: {name: tessera-worker-token, key: token}}
            - name: POD_NAME' 'mount Secrets as files'
broken runs-as-root coordinator.yaml \
  '        runAsNonRoot: true|||        runAsNonRoot: false' 'runAsNonRoot'
broken writable-root worker.yaml \
  'readOnlyRootFilesystem: true|||readOnlyRootFilesystem: false' 'readOnlyRootFilesystem'
# shellcheck disable=SC1003  # the backslashes are the text to find
broken insecure coordinator.yaml \
  '--listen=0.0.0.0:7070 \|||--listen=0.0.0.0:7070 --insecure \' '--insecure'
broken unknown-field worker.yaml \
  'podManagementPolicy: Parallel|||podManagementPolicy: Parallel
  replica: 3' 'unknown field'
broken wrong-type coordinator.yaml \
  'prometheus.io/port: "9090"|||prometheus.io/port: 9090' 'expected a string'
broken grpc-probe-without-port worker.yaml \
  'grpc: {port: 7071}|||grpc: {service: tessera}' 'required field missing'
broken missing-service worker.yaml \
  'serviceName: tessera-worker|||serviceName: tessera-workers' 'is not a Service'

# Secrets from make-secrets.sh are valid objects, and the base passes with them.
if command -v openssl >/dev/null; then
  if ! out=$(./make-secrets.sh "$TMP/secrets" test 2>&1); then
    bad "make-secrets.sh failed: $out"
  elif ! openssl verify -CAfile "$TMP/secrets/ca.crt" "$TMP/secrets/coordinator.crt" \
      "$TMP/secrets/worker.crt" "$TMP/secrets/client.crt" >/dev/null; then
    bad "make-secrets.sh: certificates do not verify against its CA"
  elif ! out=$($PY check.py . "$TMP/secrets/secrets.yaml" 2>&1); then
    bad "the base with make-secrets.sh's Secrets fails: $out"
  else
    ok "make-secrets.sh makes valid Secrets and certificates"
  fi
else
  echo "  skip make-secrets.sh (no openssl)"
fi

echo "check_test: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
