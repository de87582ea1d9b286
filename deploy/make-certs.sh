#!/usr/bin/env bash
# Makes everything a secured tessera cluster needs (CLI.md "Security"): a
# private CA, certificates for the coordinator, the workers and a user
# (mutual TLS), and the tokens file with one random secret per principal;
# optionally etcd's own CA and certificates (--etcd).
#
#   deploy/make-certs.sh OUTDIR [--workers N] [--san HOST ...]
#                        [--coordinator-san HOST ...] [--worker-san HOST ...]
#                        [--worker-group NAME] [--etcd] [--etcd-san HOST ...]
#                        [--days D]
#
#   --workers N          per-worker certificates and principals w0..w{N-1}
#                        (default 4; 0 for none)
#   --san HOST           an extra name on every daemon's certificate (repeat)
#   --coordinator-san H  an extra name on the coordinator's certificate only
#   --worker-san H       an extra name on the workers' certificates only
#                        HOST is an IP address, a DNS name (a leading `*.` is
#                        a wildcard) or explicitly `DNS:...`/`IP:...`; `%n`
#                        in it stands for the certificate's name
#                        (`--san tessera-%n` gives tessera-coordinator,
#                        tessera-w0, ...)
#   --worker-group NAME  also one certificate NAME.crt shared by the workers
#                        NAME-0, NAME-1, ... (a StatefulSet), and the
#                        principal `NAME-*` (CLI.md: a worker principal whose
#                        name ends in `*` may register any worker named with
#                        that prefix)
#   --etcd               also etcd's files (below): a CA of etcd's own, so
#                        that no certificate of the cluster's CA (a worker's,
#                        the user's) opens etcd, whose prefix holds the
#                        cluster's secret
#   --etcd-san HOST      an extra name on etcd's member certificate (repeat;
#                        implies --etcd); HOST as for --san, without %n
#   --days D             validity of the leaf certificates (default
#                        $TESSERA_CERT_DAYS or 365; the CA gets 10 times that)
#
# OUTDIR (mode 0700; refused when it already holds a CA) then holds:
#
#   ca.crt ca.key                 the CA (EC P-256); keep ca.key offline
#   coordinator.crt/.key          CN tessera-coordinator
#   wI.crt/.key wI.token          worker wI: CN wI; principal `wI worker`
#   NAME.crt/.key NAME.token      the worker group (--worker-group)
#   user.crt/.key                 CN user, clientAuth only: for the CLI
#   admin.token writer.token reader.token   principals admin/writer/reader,
#                                 roles admin/write/read
#   tokens                        the coordinator's --tokens file
#
# and with --etcd:
#
#   etcd-ca.crt etcd-ca.key       etcd's own CA (EC P-256): etcd's
#                                 --trusted-ca-file and --peer-trusted-ca-file,
#                                 the coordinator's --etcd_ca
#   etcd-member.crt/.key          CN tessera-etcd, shared by the members:
#                                 --cert-file/--key-file and
#                                 --peer-cert-file/--peer-key-file (serverAuth
#                                 and clientAuth: members dial each other)
#   etcd-coordinator.crt/.key     CN tessera-coordinator, clientAuth only: the
#                                 coordinator's --etcd_cert/--etcd_key
#
# Every daemon certificate carries DNS:<its name>, DNS:localhost and
# IP:127.0.0.1 plus the extra names, and extendedKeyUsage serverAuth and
# clientAuth (daemons dial each other); etcd's member certificate carries
# DNS:tessera-etcd, DNS:localhost and IP:127.0.0.1 plus the --etcd-san names
# (the --san ones are not etcd's). Keys, token files and the tokens file are
# 0600; a token file holds just the secret (64 hex digits, no newline).
#
#   tessera-coordinator ... --tls_ca=OUTDIR/ca.crt --tls_cert=OUTDIR/coordinator.crt \
#       --tls_key=OUTDIR/coordinator.key --tokens=OUTDIR/tokens
#   tessera-worker ... --name=w0 --tls_ca=OUTDIR/ca.crt --tls_cert=OUTDIR/w0.crt \
#       --tls_key=OUTDIR/w0.key --token_file=OUTDIR/w0.token
#   export TESSERA_TLS_CA=OUTDIR/ca.crt TESSERA_TLS_CERT=OUTDIR/user.crt \
#       TESSERA_TLS_KEY=OUTDIR/user.key TESSERA_TOKEN_FILE=OUTDIR/admin.token
#   etcd ... --cert-file=OUTDIR/etcd-member.crt --key-file=OUTDIR/etcd-member.key \
#       --trusted-ca-file=OUTDIR/etcd-ca.crt --client-cert-auth (and --peer-* alike)
#   tessera-coordinator ... --metadata=etcd://... --etcd_ca=OUTDIR/etcd-ca.crt \
#       --etcd_cert=OUTDIR/etcd-coordinator.crt --etcd_key=OUTDIR/etcd-coordinator.key
#
# deploy/k8s/make-secrets.sh calls this and wraps the files as Secrets.
set -euo pipefail

usage() {
  cat >&2 <<EOF
usage: $0 OUTDIR [--workers N] [--san HOST ...] [--coordinator-san HOST ...]
         [--worker-san HOST ...] [--worker-group NAME] [--etcd] [--etcd-san HOST ...]
         [--days D]
EOF
  exit 2
}
die() { echo "make-certs: $*" >&2; exit 1; }

OUT=""
WORKERS=4
GROUP=""
DAYS="${TESSERA_CERT_DAYS:-365}"
ALL_SANS=()
COORDINATOR_SANS=()
WORKER_SANS=()
ETCD=""
ETCD_SANS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --workers) [ $# -ge 2 ] || usage; WORKERS="$2"; shift 2 ;;
    --workers=*) WORKERS="${1#*=}"; shift ;;
    --san) [ $# -ge 2 ] || usage; ALL_SANS+=("$2"); shift 2 ;;
    --san=*) ALL_SANS+=("${1#*=}"); shift ;;
    --coordinator-san) [ $# -ge 2 ] || usage; COORDINATOR_SANS+=("$2"); shift 2 ;;
    --coordinator-san=*) COORDINATOR_SANS+=("${1#*=}"); shift ;;
    --worker-san) [ $# -ge 2 ] || usage; WORKER_SANS+=("$2"); shift 2 ;;
    --worker-san=*) WORKER_SANS+=("${1#*=}"); shift ;;
    --worker-group) [ $# -ge 2 ] || usage; GROUP="$2"; shift 2 ;;
    --worker-group=*) GROUP="${1#*=}"; shift ;;
    --etcd) ETCD=1; shift ;;
    --etcd-san) [ $# -ge 2 ] || usage; ETCD=1; ETCD_SANS+=("$2"); shift 2 ;;
    --etcd-san=*) ETCD=1; ETCD_SANS+=("${1#*=}"); shift ;;
    --days) [ $# -ge 2 ] || usage; DAYS="$2"; shift 2 ;;
    --days=*) DAYS="${1#*=}"; shift ;;
    -h | --help) usage ;;
    -*) echo "make-certs: unknown option $1" >&2; usage ;;
    *) [ -z "$OUT" ] || usage; OUT="$1"; shift ;;
  esac
done
[ -n "$OUT" ] || usage
[[ "$WORKERS" =~ ^[0-9]+$ ]] || die "--workers takes a number, not '$WORKERS'"
[[ "$DAYS" =~ ^[1-9][0-9]*$ ]] || die "--days takes a positive number, not '$DAYS'"
if [ -n "$GROUP" ] && ! [[ "$GROUP" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]]; then
  die "--worker-group takes a name of letters, digits, '.', '_' and '-', not '$GROUP'"
fi
# etcd's files share OUTDIR with the worker group's.
ETCD_FILES=(etcd-ca etcd-member etcd-coordinator)
if [ -n "$ETCD" ] && [[ " ${ETCD_FILES[*]} " == *" $GROUP "* ]]; then
  die "--worker-group $GROUP would overwrite etcd's $GROUP.crt; name the group otherwise"
fi
command -v openssl >/dev/null || die "needs openssl (apt-get install openssl)"
if [ -e "$OUT/ca.key" ] || [ -e "$OUT/ca.crt" ]; then
  die "$OUT already holds a CA; refusing to overwrite it (remove the directory to start over)"
fi

umask 077
mkdir -p "$OUT"
chmod 0700 "$OUT"
# Made in a scratch directory inside OUTDIR and moved in at the end, so a
# failure leaves no half CA behind.
TMP=$(mktemp -d "$OUT/.make-certs.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# san NAME HOST...: a subjectAltName value, %n replaced by NAME.
san() {
  local name="$1" h out=""
  shift
  for h in "$@"; do
    h="${h//%n/$name}"
    if [[ "$h" =~ ^(DNS|IP): ]]; then
      :
    elif [[ "$h" =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ || "$h" == *:* ]]; then
      h="IP:$h"
    else
      h="DNS:$h"
    fi
    case ",$out," in *",$h,"*) continue ;; esac  # once each
    out="${out:+$out,}$h"
  done
  echo "$out"
}

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$TMP/$1.key" 2>/dev/null; }

# ca FILE CN: a CA certificate and key.
ca() {
  key "$1"
  openssl req -x509 -new -key "$TMP/$1.key" -subj "/CN=$2" -days "$((DAYS * 10))" \
    -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$TMP/$1.crt"
}

# leaf FILE CN EXTENDED_KEY_USAGE [SUBJECT_ALT_NAMES [CA]]   (CA default: ca)
leaf() {
  local file="$1" cn="$2" eku="$3" sans="${4:-}" issuer="${5:-ca}"
  key "$file"
  openssl req -new -key "$TMP/$file.key" -subj "/CN=$cn" -out "$TMP/$file.csr"
  printf '%s\n' "basicConstraints=critical,CA:FALSE" \
    "keyUsage=critical,digitalSignature" \
    "extendedKeyUsage=$eku" \
    "subjectKeyIdentifier=hash" "authorityKeyIdentifier=keyid" \
    ${sans:+"subjectAltName=$sans"} >"$TMP/$file.ext"
  openssl x509 -req -in "$TMP/$file.csr" -CA "$TMP/$issuer.crt" -CAkey "$TMP/$issuer.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days "$DAYS" -extfile "$TMP/$file.ext" \
    -out "$TMP/$file.crt" 2>/dev/null
  rm -f "$TMP/$file.csr" "$TMP/$file.ext"
}
daemon() {  # daemon FILE CN EXTRA_SANS...
  local file="$1" cn="$2"
  shift 2
  leaf "$file" "$cn" serverAuth,clientAuth \
    "$(san "$file" "DNS:$cn" DNS:localhost IP:127.0.0.1 ${ALL_SANS[@]+"${ALL_SANS[@]}"} "$@")"
}

ca ca tessera-ca

daemon coordinator tessera-coordinator ${COORDINATOR_SANS[@]+"${COORDINATOR_SANS[@]}"}
workers=()
for ((i = 0; i < WORKERS; i++)); do
  daemon "w$i" "w$i" ${WORKER_SANS[@]+"${WORKER_SANS[@]}"}
  workers+=("w$i")
done
if [ -n "$GROUP" ]; then
  daemon "$GROUP" "$GROUP" ${WORKER_SANS[@]+"${WORKER_SANS[@]}"}
fi
leaf user user clientAuth
if [ -n "$ETCD" ]; then
  ca etcd-ca tessera-etcd-ca
  leaf etcd-member tessera-etcd serverAuth,clientAuth \
    "$(san etcd-member DNS:tessera-etcd DNS:localhost IP:127.0.0.1 ${ETCD_SANS[@]+"${ETCD_SANS[@]}"})" etcd-ca
  leaf etcd-coordinator tessera-coordinator clientAuth "" etcd-ca
fi

secret() { openssl rand -hex 32 | tr -d '\n' >"$TMP/$1.token"; }
{
  echo "# NAME ROLE SECRET (made by deploy/make-certs.sh; keep it 0600)"
  for p in admin:admin writer:write reader:read; do
    secret "${p%%:*}"
    echo "${p%%:*} ${p#*:} $(cat "$TMP/${p%%:*}.token")"
  done
  for w in ${workers[@]+"${workers[@]}"}; do
    secret "$w"
    echo "$w worker $(cat "$TMP/$w.token")"
  done
  if [ -n "$GROUP" ]; then
    secret "$GROUP"
    echo "$GROUP-* worker $(cat "$TMP/$GROUP.token")"
  fi
} >"$TMP/tokens"

# Every certificate must verify against its CA before anything is handed out.
for crt in "$TMP"/*.crt; do
  name=$(basename "$crt" .crt)
  issuer=ca
  if [ -n "$ETCD" ] && [[ " ${ETCD_FILES[*]} " == *" $name "* ]]; then issuer=etcd-ca; fi
  [ "$name" = "$issuer" ] && continue
  openssl verify -CAfile "$TMP/$issuer.crt" "$crt" >/dev/null || die "$name.crt does not verify"
done

chmod 0600 "$TMP"/*.key "$TMP"/*.token "$TMP/tokens"
chmod 0644 "$TMP"/*.crt
mv "$TMP"/* "$OUT"/
echo "make-certs: $OUT: CA, coordinator, ${WORKERS} worker(s)${GROUP:+, worker group $GROUP (principal $GROUP-*)}, user${ETCD:+; for etcd a CA, a member and a coordinator client certificate}; tokens for admin, writer, reader and each worker"
