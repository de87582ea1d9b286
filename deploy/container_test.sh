#!/usr/bin/env bash
# A real container test: builds the image (deploy/build-images.sh), starts a
# secured coordinator and 3 workers as containers on free loopback ports
# (deploy/cluster-up.sh --secure: mutual TLS and tokens from
# deploy/make-certs.sh), drives the demo's steps with the CLI from a client
# container with the admin token (create, put, get, region and shard gets,
# reshard, a coordinator restart on its volume, rm), checks that a CLI without
# a token or a certificate is unauthenticated and that the read role may get
# but not create or rm, compares the bytes on the host with numpy,
# checks every daemon's grpc.health.v1 status over TLS (and that plaintext is
# refused) and /metrics (promtool) and
# has a real Prometheus scrape them and answer queries, stops
# everything (deploy/cluster-down.sh: every daemon must exit 0 on SIGTERM) and
# checks nothing it created is left.
#
#   deploy/container_test.sh
#
# Prints one line per step, the timings (whether the Debian base had to be
# made, the slow part of a cold run), and last "container_test: N passed,
# M failed". Exits 1 when a
# step failed. Where podman cannot run containers at all it says why, counts
# nothing and exits 0. The images stay (they are build-images.sh's output and
# make the next run warm); TESSERA_PODMAN_ROOT=DIR keeps everything in a
# private store instead (deploy/podman_env.sh).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=deploy/podman_env.sh
source deploy/podman_env.sh

PY=/usr/bin/python3
N_WORKERS=3
START=$SECONDS
export TESSERA_CLUSTER="tessera-ctest-$$"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tessera-container-test.XXXXXX")
chmod 0777 "$WORK"  # the client container (uid 10001) writes its outputs here
mkdir -p "$WORK/logs"
# Certificates and tokens (cluster-up.sh --secure makes them here, 0700).
export TESSERA_SECRETS="$WORK/secrets"
CLI="${TESSERA_CLI:-bazel-bin/client/tessera}"
passed=0
failed=0
timings=()

now() { date +%s.%N; }
since() { awk -v s="$1" -v e="$(now)" 'BEGIN { printf "%.1f", e - s }'; }

summary() {
  local t
  t=$(printf '%s, ' "${timings[@]}")
  t=${t%, }
  echo "container_test: timings: ${t:-none}; whole run $((SECONDS - START)) s"
  echo "container_test: $passed passed, $failed failed"
}

skip() {
  echo "container_test: skipped: $*"
  echo "container_test: 0 passed, 0 failed (podman cannot run containers here)"
  rm -rf "$WORK"
  exit 0
}

cleanup() {
  local ids
  ids=$("${PODMAN[@]}" ps -aq --filter "label=io.tessera.cluster=$TESSERA_CLUSTER" 2>/dev/null)
  # shellcheck disable=SC2086
  [ -z "$ids" ] || "${PODMAN[@]}" rm -f $ids >/dev/null 2>&1
  "${PODMAN[@]}" volume rm -f "$TESSERA_CLUSTER-data" >/dev/null 2>&1
  deploy/container-secrets.sh --remove "$TESSERA_SECRETS" >/dev/null 2>&1
  rm -rf "$WORK"
}
trap cleanup EXIT

# step NAME COMMAND...: runs COMMAND, its output in $WORK/logs/NAME.log;
# prints ok/FAIL with the time taken (and the log's tail on failure).
step() {
  local name="$1" t0 rc
  shift
  t0=$(now)
  "$@" >"$WORK/logs/$name.log" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "  ok   $name ($(since "$t0") s)"
    passed=$((passed + 1))
  else
    echo "  FAIL $name (exit $rc, $(since "$t0") s):"
    tail -15 "$WORK/logs/$name.log" | sed 's/^/         /'
    failed=$((failed + 1))
  fi
  return "$rc"
}

# ---- can podman run containers here? -------------------------------------------
command -v podman >/dev/null || skip "podman is not installed (scripts/setup.sh installs podman runc debootstrap catatonit)"
command -v runc >/dev/null || skip "runc is not installed (scripts/setup.sh installs it)"
out=$("${PODMAN[@]}" info 2>&1) || skip "podman info fails: $(tail -3 <<<"$out")"
BASE="${TESSERA_BASE:-localhost/debian:bookworm}"
if ! "${PODMAN[@]}" image exists "$BASE" && [ "$BASE" = localhost/debian:bookworm ]; then
  [ "$(id -u)" -eq 0 ] || skip "no $BASE yet and making it needs root (debootstrap)"
  command -v debootstrap >/dev/null || skip "no $BASE yet and no debootstrap to make it"
fi

if "${PODMAN[@]}" image exists "$BASE"; then
  podman_can_run "$BASE" 2>"$WORK/why" || skip "$(cat "$WORK/why")"
fi

# ---- the image ---------------------------------------------------------------------
VERSION=$(tessera_image_version)
IMAGE="$TESSERA_IMAGE:$VERSION"
base_state="base cached"
"${PODMAN[@]}" image exists "$BASE" || base_state="base made"
t0=$(now)
if ! step build-image deploy/build-images.sh; then
  # Say "cannot run containers" only when that is the reason.
  if "${PODMAN[@]}" image exists "$BASE" && ! podman_can_run "$BASE" 2>"$WORK/why"; then
    failed=0
    skip "$(cat "$WORK/why")"
  fi
  summary
  exit 1
fi
timings+=("build-images $(since "$t0") s ($base_state)")
grep '^image ' "$WORK/logs/build-image.log" | sed 's/^/         /'
export TESSERA_IMAGE_REF="$IMAGE"

image_user() { [ "$("${PODMAN[@]}" run --rm "$IMAGE" id -u)" = 10001 ]; }
image_labels() {
  local labels
  labels=$("${PODMAN[@]}" image inspect --format '{{json .Labels}}' "$IMAGE")
  for key in title version revision; do
    grep -q "\"org.opencontainers.image.$key\":\"[^\"]" <<<"$labels" || { echo "no $key label: $labels"; return 1; }
  done
  grep -q "\"org.opencontainers.image.version\":\"$VERSION\"" <<<"$labels"
}
step image-runs-as-uid-10001 image_user
step image-has-oci-labels image_labels

# ---- a cluster on free loopback ports -------------------------------------------
free_port_base() {  # N+2 consecutive free ports on 127.0.0.1, the data ports 11 up, and N+2 more 1000 up (metrics, Prometheus)
  $PY - "$((N_WORKERS + 1))" <<'PYEOF'
import random, socket, sys
n = int(sys.argv[1])
for _ in range(200):
    base = random.randrange(20000, 60000 - n)
    socks = []
    try:
        # gRPC, the workers' data ports (cluster-up.sh: port + 11 on), metrics
        for p in [*range(base, base + n + 1), *range(base + 11, base + 11 + n),
                  *range(base + 1000, base + 1001 + n)]:
            s = socket.socket()
            s.bind(("127.0.0.1", p))
            socks.append(s)
    except OSError:
        continue
    finally:
        for s in socks:
            s.close()
    print(base)
    sys.exit(0)
sys.exit("no free ports")
PYEOF
}
TESSERA_PORT=$(free_port_base) || { echo "container_test: no free loopback ports"; exit 1; }
export TESSERA_PORT
COORDINATOR="127.0.0.1:$TESSERA_PORT"
t0=$(now)
if step cluster-up deploy/cluster-up.sh "$N_WORKERS" --secure; then
  timings+=("cluster-up $(since "$t0") s")
  sed 's/^/         /' "$WORK/logs/cluster-up.log"
fi

# The CLI from a client container: non-root, read-only root, $WORK at /work,
# the user's certificate and the tokens (cluster-up's copies owned by the
# image's user) at /etc/tessera. tessera_as WHO: WHO is admin, writer or
# reader (its token), no-token (certificate, no token) or no-cert (the CA and
# the admin token, no client certificate); tessera is tessera_as admin.
tessera_as() {
  local who="$1" env=(-e TESSERA_TLS_CA=/etc/tessera/ca.crt)
  shift
  case "$who" in
    no-cert) env+=(-e TESSERA_TOKEN_FILE=/etc/tessera/admin.token) ;;
    no-token) env+=(-e TESSERA_TLS_CERT=/etc/tessera/tls.crt -e TESSERA_TLS_KEY=/etc/tessera/tls.key) ;;
    *) env+=(-e TESSERA_TLS_CERT=/etc/tessera/tls.crt -e TESSERA_TLS_KEY=/etc/tessera/tls.key
      -e "TESSERA_TOKEN_FILE=/etc/tessera/$who.token") ;;
  esac
  "${PODMAN[@]}" run --rm --network host --read-only --cap-drop ALL \
    --security-opt no-new-privileges -v "$WORK:/work" -w /work \
    -v "$TESSERA_SECRETS/containers/client:/etc/tessera:ro" "${env[@]}" "$IMAGE" \
    tessera --coordinator="$COORDINATOR" "$@"
}
tessera() { tessera_as admin "$@"; }
# fails_with WORDS WHO ARGS...: the CLI as WHO exits 1 with WORDS in its error.
fails_with() {
  local words="$1" out rc
  shift
  out=$(tessera_as "$@" 2>&1)
  rc=$?
  echo "exit $rc: $out"
  [ "$rc" -eq 1 ] && grep -q "^error: .*$words" <<<"$out"
}
# The line cluster-up printed points the host's CLI at the cluster.
host_cli_env_line() {
  local line
  line=$(grep '^export TESSERA_COORDINATOR=' "$WORK/logs/cluster-up.log") ||
    { echo "cluster-up printed no export line"; return 1; }
  [ -x "$CLI" ] || { echo "no host CLI at $CLI: only the line is checked"; return 0; }
  (
    unset TESSERA_TLS_CA TESSERA_TLS_CERT TESSERA_TLS_KEY TESSERA_TOKEN_FILE
    eval "$line"
    "$CLI" workers
  )
}
# same FILE_A FILE_B: the two .npy files hold the same array (shape, dtype, bytes).
same() {
  $PY - "$WORK/$1" "$WORK/$2" <<'PYEOF'
import sys, numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
print(a.shape, a.dtype, "vs", b.shape, b.dtype)
sys.exit(0 if a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b) else 1)
PYEOF
}
workers_alive() { [ "$(tessera workers --json | grep -o '"alive": *true' | wc -l)" -eq "$N_WORKERS" ]; }
make_input() {
  $PY - "$WORK" <<'PYEOF'
import sys, numpy as np
d = sys.argv[1]
src = np.random.default_rng(0).standard_normal((1000, 64), dtype=np.float32)
np.save(f"{d}/src.npy", src)
np.save(f"{d}/want_region.npy", src[100:300, 8:24])
np.save(f"{d}/want_arange.npy", np.arange(48 * 10, dtype=np.int32).reshape(48, 10))
PYEOF
}
want_shard() {  # the shard's box as `describe --json` lists it, cut from the source
  tessera describe emb --json >"$WORK/describe.json" &&
    $PY - "$WORK" <<'PYEOF'
import json, sys, numpy as np
d = sys.argv[1]
meta = json.load(open(f"{d}/describe.json"))
box = meta["shards"][1]
off, size = box["offsets"], box["sizes"]
src = np.load(f"{d}/src.npy")
np.save(f"{d}/want_shard.npy", src[tuple(slice(o, o + s) for o, s in zip(off, size))])
PYEOF
}
restart_coordinator() {
  "${PODMAN[@]}" restart -t 10 "$TESSERA_CLUSTER-coordinator" >/dev/null || return 1
  for _ in $(seq 1 100); do workers_alive 2>/dev/null && break; sleep 0.3; done
  tessera describe emb
}
# deploy/compose.yaml describes the cluster cluster-up.sh --secure started:
# the same commands (ports shifted from 7070 to this run's), volume, secrets
# mounts, init, read-only root, no capabilities, no-new-privileges, host
# network.
compose_matches() {
  local names=("$TESSERA_CLUSTER-coordinator")
  for ((i = 0; i < N_WORKERS; i++)); do names+=("$TESSERA_CLUSTER-w$i"); done
  "${PODMAN[@]}" inspect "${names[@]}" >"$WORK/inspect.json" || return 1
  $PY - deploy/compose.yaml "$WORK/inspect.json" "$TESSERA_PORT" "$TESSERA_CLUSTER" "$TESSERA_SECRETS" <<'PYEOF'
import json, re, sys, yaml
compose = yaml.safe_load(open(sys.argv[1]))
running = {c["Name"]: c for c in json.load(open(sys.argv[2]))}
port, cluster, secrets = int(sys.argv[3]), sys.argv[4], sys.argv[5]
bad = []
for service, spec in compose["services"].items():
    name = spec["container_name"].replace("tessera", cluster, 1)
    if name not in running:
        continue  # compose has 4 workers, this run fewer
    c = running.pop(name)
    # gRPC ports 70xx and metrics ports 80xx (gRPC + 1000) move with the run.
    want = [re.sub(r"127\.0\.0\.1:([78]0\d\d)",
                   lambda m: f"127.0.0.1:{int(m[1]) - 7070 + port}", a)
            for a in spec["command"]]
    if c["Config"]["Cmd"] != want:
        bad.append(f"{service}: compose runs {want}, cluster-up ran {c['Config']['Cmd']}")
    hc = c["HostConfig"]
    checks = {
        "network_mode host": hc.get("NetworkMode") == "host" and spec.get("network_mode") == "host",
        "init": hc.get("Init") is True and spec.get("init") is True,
        "read_only": hc.get("ReadonlyRootfs") is True and spec.get("read_only") is True,
        "cap_drop ALL": not c.get("EffectiveCaps") and spec.get("cap_drop") == ["ALL"],
        "no-new-privileges": "no-new-privileges" in (hc.get("SecurityOpt") or [])
                             and "no-new-privileges" in spec.get("security_opt", []),
    }
    labels = c["Config"].get("Labels") or {}
    for label in spec.get("labels") or []:
        k, v = label.split("=", 1)
        if k == "io.tessera.cluster":
            v = v.replace("tessera", cluster, 1)
        checks[f"label {k}={v}"] = labels.get(k) == v
    bad += [f"{service}: {k} differs" for k, ok in checks.items() if not ok]
    mounts = sorted([f"{m['Name'].replace(cluster, 'tessera', 1)}:{m['Destination']}"
                     for m in c.get("Mounts") or [] if m.get("Type") == "volume"] +
                    [f"{m['Source']}:{m['Destination']}" + ("" if m.get("RW") else ":ro")
                     for m in c.get("Mounts") or [] if m.get("Type") == "bind"])
    want_mounts = sorted(re.sub(r"^\$\{TESSERA_SECRETS[^}]*\}", secrets, v)
                         for v in spec.get("volumes") or [])
    if mounts != want_mounts:
        bad.append(f"{service}: volumes {mounts} vs compose {want_mounts}")
if running:
    bad.append(f"containers compose does not describe: {sorted(running)}")
print("\n".join(bad) or "compose.yaml matches the running cluster")
sys.exit(1 if bad else 0)
PYEOF
}
not_listed() { ! grep -q '"emb"' <<<"$(tessera ls --json)"; }

# CLI.md "Operations": every daemon answers grpc.health.v1 (a real gRPC
# client: python3-grpcio), serves /metrics that promtool accepts, and a real
# Prometheus scrapes them all and answers queries about the cluster.
# Over mutual TLS with the user's certificate; a plaintext caller is refused.
health_serving() {  # ADDRESS...
  $PY - "$TESSERA_SECRETS" "$@" <<'PYEOF'
import sys, grpc
d = sys.argv[1]
read = lambda name: open(f"{d}/{name}", "rb").read()
creds = grpc.ssl_channel_credentials(read("ca.crt"), read("user.key"), read("user.crt"))
for address in sys.argv[2:]:
    with grpc.secure_channel(address, creds) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        reply = check(b"", timeout=5)  # HealthCheckRequest{service: ""}
        # HealthCheckResponse{status: SERVING (1)} is the two bytes 08 01.
        print(address, reply.hex())
        if reply != b"\x08\x01":
            sys.exit(f"{address} is not SERVING: {reply.hex()}")
PYEOF
}
plaintext_refused() {  # ADDRESS...
  $PY - "$@" <<'PYEOF'
import sys, grpc
for address in sys.argv[1:]:
    with grpc.insecure_channel(address) as channel:
        try:
            channel.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=3)
        except grpc.RpcError as e:
            print(address, "refused a plaintext caller:", e.code())
            continue
        sys.exit(f"{address} answered a plaintext caller")
PYEOF
}
metrics_valid() {  # PORT
  local text
  text=$(curl -sf "http://127.0.0.1:$1/metrics") || { echo "no /metrics on port $1"; return 1; }
  grep -q '^tessera_rpc_requests_total{' <<<"$text" || { echo "no RPC counts on port $1"; return 1; }
  promtool check metrics <<<"$text"
}
PROM_PID=""
PROM_PORT=0
prometheus_up() {
  PROM_PORT=$((TESSERA_PORT + 1000 + N_WORKERS + 1))
  local targets="'127.0.0.1:$((TESSERA_PORT + 1000))'"
  for ((i = 0; i < N_WORKERS; i++)); do targets="$targets, '127.0.0.1:$((TESSERA_PORT + 1001 + i))'"; done
  printf '%s\n' "global: {scrape_interval: 1s, evaluation_interval: 1s}" \
    "scrape_configs:" \
    "  - job_name: tessera" \
    "    static_configs: [{targets: [$targets]}]" >"$WORK/prometheus.yml"
  promtool check config "$WORK/prometheus.yml" || return 1
  prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/prometheus" \
    --web.listen-address="127.0.0.1:$PROM_PORT" >"$WORK/logs/prometheus.out" 2>&1 &
  PROM_PID=$!
}
# Waits up to 30 s for the first value of PROMQL to equal EXPECTED.
prometheus_query() {  # PROMQL EXPECTED
  local deadline=$((SECONDS + 30)) got=""
  while [ "$SECONDS" -lt "$deadline" ]; do
    got=$(curl -sf --get "http://127.0.0.1:$PROM_PORT/api/v1/query" --data-urlencode "query=$1" |
      $PY -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "")' 2>/dev/null)
    [ "$got" = "$2" ] && { echo "$1 = $got"; return 0; }
    sleep 1
  done
  echo "$1: got '$got', want '$2'"
  return 1
}
prometheus_down() {
  [ -n "$PROM_PID" ] || return 1
  kill "$PROM_PID" && wait "$PROM_PID"
  local rc=$?
  PROM_PID=""
  [ "$rc" -eq 0 ] || [ "$rc" -eq 143 ]
}
# Prometheus' sum of the workers' bytes held equals what `workers` reports
# (both are read afresh each second: a retired version may be freed meanwhile).
prometheus_bytes_held() {
  local deadline=$((SECONDS + 30)) got="" want=""
  while [ "$SECONDS" -lt "$deadline" ]; do
    want=$(tessera workers --json | $PY -c 'import json,sys; print(sum(w["bytes_used"] for w in json.load(sys.stdin)))')
    got=$(curl -sf --get "http://127.0.0.1:$PROM_PORT/api/v1/query" --data-urlencode "query=sum(tessera_worker_bytes_held)" |
      $PY -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "")' 2>/dev/null)
    [ -n "$want" ] && [ "$want" != 0 ] && [ "$got" = "$want" ] && { echo "bytes held: $got"; return 0; }
    sleep 1
  done
  echo "Prometheus says the workers hold '$got' bytes, workers --json says '$want'"
  return 1
}
operations_steps() {
  local addresses=("$COORDINATOR")
  for ((i = 0; i < N_WORKERS; i++)); do addresses+=("127.0.0.1:$((TESSERA_PORT + 1 + i))"); done
  step health-serving-over-tls health_serving "${addresses[@]}"
  step plaintext-refused plaintext_refused "${addresses[@]}"
  step coordinator-metrics-valid metrics_valid $((TESSERA_PORT + 1000))
  step worker-metrics-valid metrics_valid $((TESSERA_PORT + 1001))
  step prometheus-starts prometheus_up
  step prometheus-scrapes-every-daemon prometheus_query 'count(up == 1)' "$((N_WORKERS + 1))"
  step prometheus-workers-alive prometheus_query 'tessera_workers_alive' "$N_WORKERS"
  step prometheus-bytes-held prometheus_bytes_held
  step prometheus-stops prometheus_down
}

step compose-yaml-matches-cluster-up compose_matches
step host-cli-env-line host_cli_env_line
step workers-alive-from-client-container workers_alive
# CLI.md "Security": no token or no certificate is unauthenticated; the read
# role may read but not create or rm.
step no-token-unauthenticated fails_with unauthenticated no-token ls
step no-cert-unauthenticated fails_with unauthenticated no-cert ls
step reader-create-permission-denied fails_with 'permission denied' reader \
  create denied --shape=4 --dtype=int32 --chunk_dim=0 --placements=rank:0
step make-input make_input
step create-arange tessera create ar --shape=48,10 --dtype=int32 --chunk_dim=0 \
  --placements=rank:0,rank:1,rank:2 --init=arange
step get-arange tessera get ar --output=/work/got_arange.npy
step arange-matches same got_arange.npy want_arange.npy
step reader-get tessera_as reader get ar --output=/work/got_arange_reader.npy
step reader-get-matches same got_arange_reader.npy want_arange.npy
step reader-rm-permission-denied fails_with 'permission denied' reader rm ar
step put tessera put emb --input=/work/src.npy --chunk_dim=0 --placements=rank:0,rank:1,rank:2
step describe want_shard
step get-whole tessera get emb --output=/work/got_full.npy
step whole-matches same got_full.npy src.npy
step get-region tessera get emb --region=100:300,8:24 --output=/work/got_region.npy
step region-matches same got_region.npy want_region.npy
step get-shard tessera get emb --shard=1 --output=/work/got_shard.npy
step shard-matches same got_shard.npy want_shard.npy
step reshard tessera reshard emb --chunk_dim=1 --placements=rank:2,rank:0,rank:1
step get-after-reshard tessera get emb --output=/work/got_resharded.npy
step resharded-matches same got_resharded.npy src.npy
step coordinator-restart-keeps-metadata restart_coordinator
step get-after-restart tessera get emb --region=100:300,8:24 --output=/work/got_region2.npy
step after-restart-matches same got_region2.npy want_region.npy
operations_steps
step rm tessera rm emb
step rm-removed not_listed

# ---- teardown ------------------------------------------------------------------------
step cluster-down-exit-0 deploy/cluster-down.sh --volumes
leftovers() {
  local left
  left=$("${PODMAN[@]}" ps -a --filter "label=io.tessera.cluster=$TESSERA_CLUSTER" --format '{{.Names}}')
  "${PODMAN[@]}" volume exists "$TESSERA_CLUSTER-data" && left="$left volume:$TESSERA_CLUSTER-data"
  [ -z "$left" ] || { echo "left behind: $left"; return 1; }
}
step nothing-left-behind leftovers

summary
[ "$failed" -eq 0 ]
