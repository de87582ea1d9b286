#!/usr/bin/env bash
# Installs the C++ SDK for programs built outside this workspace:
#   PREFIX/include/tessera/...            the public headers (client/tessera_client.h and what it includes)
#   PREFIX/lib/libtessera.so              the SDK (Debian's gRPC, Abseil, protobuf and UCX stay shared)
#   PREFIX/lib/pkgconfig/tessera.pc       g++ prog.cc $(pkg-config --cflags --libs tessera)
#   PREFIX/lib/cmake/tessera/tesseraConfig.cmake   find_package(tessera) -> tessera::tessera
#
#   scripts/install_sdk.sh PREFIX
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -ne 1 ] || [ -z "$1" ]; then
  echo "usage: $0 PREFIX" >&2
  exit 2
fi
mkdir -p "$1"
prefix=$(cd "$1" && pwd)
# TESSERA_SKIP_BAZEL: built already (scripts/test.sh), run no bazel.
[ -n "${TESSERA_SKIP_BAZEL:-}" ] || bazel build //client:libtessera.so >&2
version=$(sed -n 's/^inline constexpr char kVersion\[\] = "\(.*\)";/\1/p' ops/version.h)

# The headers: client/tessera_client.h and every header of this tree it
# includes, found by the compiler itself.
headers=$(echo '#include "client/tessera_client.h"' |
  g++ -std=c++17 -I. -MM -x c++ - | tr ' \\' '\n\n' | grep -E '^[a-z_]+/[a-z_/]+\.h$' | sort -u)
rm -rf "$prefix/include/tessera"
for h in $headers; do
  install -D -m 0644 "$h" "$prefix/include/tessera/$h"
done
install -D -m 0755 bazel-bin/client/libtessera.so "$prefix/lib/libtessera.so"

absl="absl_status absl_statusor absl_strings absl_synchronization absl_time absl_span absl_flat_hash_map absl_hash"
install -d "$prefix/lib/pkgconfig" "$prefix/lib/cmake/tessera"
cat >"$prefix/lib/pkgconfig/tessera.pc" <<PC
prefix=$prefix
includedir=\${prefix}/include/tessera
libdir=\${prefix}/lib

Name: tessera
Description: C++ SDK of tessera: sharded tensors as a cluster service
Version: $version
Requires: $absl
Cflags: -std=c++17 -I\${includedir}
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -ltessera
PC
cat >"$prefix/lib/cmake/tessera/tesseraConfig.cmake" <<'CMAKE'
# find_package(tessera) -> the imported target tessera::tessera.
include(CMakeFindDependencyMacro)
find_dependency(absl)
get_filename_component(_tessera_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET tessera::tessera)
  add_library(tessera::tessera SHARED IMPORTED)
  set_target_properties(tessera::tessera PROPERTIES
    IMPORTED_LOCATION "${_tessera_prefix}/lib/libtessera.so"
    INTERFACE_INCLUDE_DIRECTORIES "${_tessera_prefix}/include/tessera"
    INTERFACE_COMPILE_FEATURES cxx_std_17
    INTERFACE_LINK_LIBRARIES "absl::status;absl::statusor;absl::strings;absl::synchronization;absl::time;absl::span;absl::flat_hash_map;absl::hash")
endif()
CMAKE
cat >"$prefix/lib/cmake/tessera/tesseraConfigVersion.cmake" <<CMAKE
set(PACKAGE_VERSION "$version")
if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
endif()
CMAKE
echo "installed the tessera C++ SDK $version under $prefix"
