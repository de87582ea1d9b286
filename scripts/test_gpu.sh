#!/usr/bin/env bash
# The GPU suite: builds --config=cuda, then
#  1. tests/gpu_test: a coordinator and two workers whose shards live on
#     cuda:0 (two workers share one GPU), driven through the C++ SDK: put /
#     get / region / rows over every transport, reshard and regional update,
#     CUDA IPC (GetIntoDevice, MapDevice and the export hold), device memory
#     in `workers`, all byte-exact against host arrays;
#  2. scripts/gpu_check.py: the same kind of cluster through the Python SDK,
#     byte-exact against numpy;
#  3. with --bench, bench/gpu_bench (figures 12-13).
# Without a usable GPU it says why and exits 0.
#   scripts/test_gpu.sh [--bench]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "test_gpu: no GPU on this machine (nvidia-smi finds none); nothing to run"
  exit 0
fi
if [ ! -d /usr/local/cuda ]; then
  echo "test_gpu: a GPU but no CUDA toolkit at /usr/local/cuda; nothing to run"
  exit 0
fi

bazel build --config=cuda //coordinator:tessera-coordinator \
  //worker:tessera-worker //client/python:all //tests:gpu_test \
  //bench:gpu_bench || exit 1

TESSERA_BIN_DIR="$PWD/bazel-bin" bazel-bin/tests/gpu_test || {
  echo "test_gpu: tests/gpu_test FAILED"
  exit 1
}
if [ "${1:-}" = "--bench" ]; then
  TESSERA_BIN_DIR="$PWD/bazel-bin" bazel-bin/bench/gpu_bench || exit 1
fi

dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT

# A free port below the ephemeral range, which ports bound to 0 (the
# workers' data ports) and outgoing connections draw from (one of those
# where there is no room below it).
port() {
  /usr/bin/python3 -c '
import random, socket
below = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
candidates = [random.randrange(10000, below) for _ in range(1000)] if below > 11024 else []
for p in candidates + [0]:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", p))
        except OSError:
            continue
        print(s.getsockname()[1])
        break'
}
coordinator="127.0.0.1:$(port)"
bazel-bin/coordinator/tessera-coordinator --listen="$coordinator" \
  >"$dir/coordinator.log" 2>&1 &
pids+=($!)
for i in 0 1; do
  bazel-bin/worker/tessera-worker --coordinator="$coordinator" \
    --listen="127.0.0.1:$(port)" --name="gpu$i" --rank="$i" --device=cuda:0 \
    >"$dir/worker$i.log" 2>&1 &
  pids+=($!)
done

PYTHONPATH="$PWD/bazel-bin/client/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH
for _ in $(seq 100); do
  /usr/bin/python3 -c "import sys, tessera; c = tessera.connect('$coordinator'); sys.exit(0 if sum(w.alive for w in c.workers()) == 2 else 1)" \
    2>/dev/null && break
  sleep 0.1
done
if /usr/bin/python3 scripts/gpu_check.py "$coordinator"; then
  echo "test_gpu: passed"
else
  echo "test_gpu: FAILED; logs:"
  tail -n 20 "$dir"/*.log
  exit 1
fi
