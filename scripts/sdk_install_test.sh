#!/usr/bin/env bash
# The C++ SDK outside Bazel, as a user builds against it:
# scripts/install_sdk.sh PREFIX, then a 20-line program compiled with plain
# g++ and `pkg-config --cflags --libs tessera`, and the same program through
# CMake's find_package(tessera), each run against a local cluster.
# Prints "sdk_install_test: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/test_lib.sh
source scripts/test_lib.sh

private_workspace

check "install_sdk.sh" scripts/install_sdk.sh "$work/prefix"
mkdir -p "$work/app"
cat >"$work/app/main.cc" <<'CC'
#include <cstdio>
#include <cstdlib>
#include "client/tessera_client.h"

int main(int argc, char** argv) {
  auto client = tessera::Client::Connect(argv[1]);
  if (!client.ok()) return std::printf("%s\n", client.status().ToString().c_str()), 1;
  const std::string name = argv[2];
  tessera::InitSpec init;
  init.kind = tessera::InitSpec::Kind::kArange;
  auto made = (*client)->Create(name, {6, 4}, tessera::DType::kInt32,
                                tessera::LayoutSpec::Chunk(0, {tessera::Placement{0, "", {}},
                                                               tessera::Placement{1, "", {}}}), init);
  if (!made.ok()) return std::printf("%s\n", made.status().ToString().c_str()), 1;
  auto rows = (*client)->Get(name, tessera::Box{{2, 0}, {2, 4}});
  if (!rows.ok()) return std::printf("%s\n", rows.status().ToString().c_str()), 1;
  const int32_t* v = reinterpret_cast<const int32_t*>(rows->data());
  for (int i = 0; i < 8; ++i) if (v[i] != 8 + i) return std::printf("bad %d\n", v[i]), 1;
  std::printf("rows 2-3 of %s: %d .. %d\n", name.c_str(), v[0], v[7]);
  return (*client)->Delete(name).ok() ? 0 : 1;
}
CC
export PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig"
# shellcheck disable=SC2046
check "g++ with pkg-config" g++ -O1 -o "$work/app/with_pkg_config" "$work/app/main.cc" \
  $(pkg-config --cflags --libs tessera)
check "local cluster" deploy/local_cluster.sh start 2
address="127.0.0.1:$TESSERA_PORT"
check "the pkg-config build runs" "$work/app/with_pkg_config" "$address" sdk_pc

if command -v cmake >/dev/null 2>&1; then
  cat >"$work/app/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.16)
project(tessera_app CXX)
find_package(tessera 0.1 REQUIRED)
add_executable(with_cmake main.cc)
target_link_libraries(with_cmake PRIVATE tessera::tessera)
CMAKE
  check "cmake configure" cmake -S "$work/app" -B "$work/app/build" \
    -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_RPATH="$work/prefix/lib" >/dev/null
  check "cmake build" cmake --build "$work/app/build" >/dev/null
  check "the CMake build runs" "$work/app/build/with_cmake" "$address" sdk_cmake
else
  echo "no cmake here: find_package(tessera) not exercised"
fi

finish sdk_install_test
