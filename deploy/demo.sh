#!/usr/bin/env bash
# The main job: a local cluster doing real work. Starts one coordinator and
# four workers on 127.0.0.1, scatters a generated 256 MiB float32 embedding
# table chunk-sharded on dim 0, fetches row ranges and a column block,
# reshards it rows -> columns, gathers the whole table, checks every byte
# against the source, and stops the cluster cleanly.
#
#   deploy/demo.sh [--secure]     # --secure: mutual TLS and tokens, the CLI as admin
set -euo pipefail
cd "$(dirname "$0")/.."

export TESSERA_RUN_DIR="${TESSERA_RUN_DIR:-$(mktemp -d /tmp/tessera-demo.XXXXXX)}"
export TESSERA_PORT="${TESSERA_PORT:-7070}"
export TESSERA_COORDINATOR="127.0.0.1:${TESSERA_PORT}"
PY=/usr/bin/python3
T="bazel-bin/client/tessera"
WORK="$TESSERA_RUN_DIR/data"
mkdir -p "$WORK"

SECURE=""
case "${1:-}" in
  "") ;;
  --secure) SECURE=--secure ;;
  *) echo "usage: $0 [--secure]" >&2; exit 2 ;;
esac

cleanup() { deploy/local_cluster.sh stop >/dev/null 2>&1 || true; }
trap cleanup EXIT

step() { printf '\n== %s\n' "$*"; }

step "starting a local cluster"
deploy/local_cluster.sh start 4 $SECURE
if [ -n "$SECURE" ]; then eval "$(deploy/local_cluster.sh env)"; fi
$T workers

ROWS=65536
COLS=1024
step "generating a ${ROWS}x${COLS} float32 embedding table (256 MiB)"
$PY - "$WORK/emb.npy" "$ROWS" "$COLS" <<'PYEOF'
import sys, numpy as np
rows, cols = int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(0)
np.save(sys.argv[1], rng.standard_normal((rows, cols), dtype=np.float32))
PYEOF

step "put: scatter it, chunked on dim 0 over 4 workers"
$T put emb --input="$WORK/emb.npy" --chunk_dim=0 --placements=rank:0,rank:1,rank:2,rank:3
$T describe emb

step "remote fetches: row ranges and a column block"
$T get emb --region=1000:1064 --output="$WORK/rows_a.npy"
$T get emb --region=-128: --output="$WORK/rows_b.npy"
$T get emb --region=16380:16390 --output="$WORK/rows_c.npy"
$T get emb --region=:,256:320 --output="$WORK/cols.npy"

step "reshard: rows -> columns (what moves between workers, what stays)"
$T reshard emb --chunk_dim=1 --placements=rank:0,rank:1,rank:2,rank:3

step "gather: the whole table back into this process"
$T get emb --output="$WORK/full.npy"

step "checking every byte against the source"
$PY - "$WORK" <<'PYEOF'
import sys, numpy as np
d = sys.argv[1]
src = np.load(f"{d}/emb.npy", mmap_mode="r")
checks = [
    ("rows 1000:1064", np.load(f"{d}/rows_a.npy"), src[1000:1064]),
    ("rows -128:", np.load(f"{d}/rows_b.npy"), src[-128:]),
    ("rows 16380:16390 (across two shards)", np.load(f"{d}/rows_c.npy"), src[16380:16390]),
    ("column block :,256:320", np.load(f"{d}/cols.npy"), src[:, 256:320]),
    ("whole table after the reshard", np.load(f"{d}/full.npy", mmap_mode="r"), src),
]
ok = True
for what, got, want in checks:
    same = got.shape == want.shape and got.dtype == want.dtype and np.array_equal(got, want)
    ok &= same
    print(f"  {what}: {got.shape} {got.dtype} {'equal' if same else 'DIFFERENT'}")
sys.exit(0 if ok else 1)
PYEOF

step "cleaning up"
$T rm emb
$T workers
trap - EXIT
deploy/local_cluster.sh stop
echo
echo "demo finished: every fetch matched the source"
