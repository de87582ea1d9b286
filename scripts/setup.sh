#!/usr/bin/env bash
# Installs every Debian package tessera needs to build, test and run. Idempotent.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap
  g++ pkg-config cmake
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libfmt-dev libcpp-httplib-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-dev python3-numpy python3-pytest python3-venv python3-tqdm pybind11-dev
  clang lld libfuzzer-14-dev libclang-rt-14-dev
  podman runc debootstrap catatonit podman-compose python3-kubernetes openssl
  prometheus python3-grpcio curl
  libucx-dev ucx-utils nlohmann-json3-dev python3-torch
  etcd-server etcd-client golang-etcd-server-dev
)

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
