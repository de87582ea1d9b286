#!/usr/bin/env bash
# Installs the Debian packages tessera needs. Idempotent.
#   scripts/setup.sh          everything: build, every test, fuzzing, benchmarks, deployment
#   scripts/setup.sh --run    only what building the daemons and the CLI and running
#                             deploy/demo.sh need (the README's run command)
set -euo pipefail

# Building //:tessera (etcd's protos come from golang-etcd-server-dev; Bazel
# compiles with clang, .bazelrc) and running the demo.
RUN_PACKAGES=(
  bazel-bootstrap
  clang g++ pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libfmt-dev libcpp-httplib-dev
  libucx-dev nlohmann-json3-dev
  golang-etcd-server-dev
  python3 python3-numpy openssl
)
# Tests, the Python SDK, fuzzing, benchmarks, containers, etcd, Kubernetes checks.
TEST_PACKAGES=(
  cmake
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-dev python3-pytest python3-venv python3-tqdm pybind11-dev
  lld libfuzzer-14-dev libclang-rt-14-dev
  podman runc debootstrap catatonit podman-compose python3-kubernetes
  prometheus python3-grpcio curl
  ucx-utils python3-torch
  etcd-server etcd-client
)

case "${1:-}" in
  "") PACKAGES=("${RUN_PACKAGES[@]}" "${TEST_PACKAGES[@]}") ;;
  --run) PACKAGES=("${RUN_PACKAGES[@]}") ;;
  *) echo "usage: $0 [--run]" >&2; exit 2 ;;
esac

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
