#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ with clang (ASan + UBSan), outside
# Bazel: protoc output, tessera's library sources and each *_fuzzer.cc are
# compiled once into objects under fuzz/out/obj/ (rebuilt only when the
# source or a header it includes changed, from clang's -MMD files) and
# linked against Debian's gRPC, Protobuf, Abseil and spdlog.
#
#   fuzz/build.sh                 build every target into fuzz/out/
#   FUZZ_JOBS=4 fuzz/build.sh     more parallel compiles (default 2)
#   FUZZ_UBSAN=all fuzz/build.sh  UBSan on every source, not only the
#                                 parsers (for long runs by hand)
set -euo pipefail
shopt -s nullglob
cd "$(dirname "$0")/.."

OUT=fuzz/out
OBJ=$OUT/obj
GEN=$OUT/gen
JOBS="${FUZZ_JOBS:-2}"
CXX="${CXX:-clang++}"
mkdir -p "$OBJ" "$GEN/proto"

SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
# UBSan adds half again to a compile. The parsers (core/), the RPC field
# conversion and the targets take it; the service glue around them (gRPC
# handlers, stores, transports, generated code) is checked by ASan alone,
# unless FUZZ_UBSAN=all. Linking with $SAN brings both runtimes either way.
GLUE_SAN="-fsanitize=address -fno-omit-frame-pointer"
[ "${FUZZ_UBSAN:-}" = all ] && GLUE_SAN=$SAN
# Line tables are enough for a symbolized crash report, and build faster
# than full debug info.
# spdlog's defines as third_party/BUILD has them (its implementation from
# libspdlog.so, not compiled again in every source that logs).
CXXFLAGS="-std=c++17 -gline-tables-only -DSPDLOG_COMPILED_LIB -DSPDLOG_FMT_EXTERNAL -DSPDLOG_SHARED_LIB -I. -I$GEN -w"
# Objects built with other flags are built again (the .d checks below see
# only sources and headers).
flags="$CXX $CXXFLAGS | $SAN | $GLUE_SAN"
if [ "$(cat "$OBJ/.flags" 2>/dev/null)" != "$flags" ]; then
  rm -f "$OBJ"/*.o "$OBJ"/*.o.d
  echo "$flags" >"$OBJ/.flags"
fi

# Abseil libraries: the list Bazel links (third_party/BUILD).
ABSL=$(sed -n '/^ABSL_LIBS = \[/,/^\]/p' third_party/BUILD | grep -o '"[a-z_0-9]*"' | tr -d '"' |
  sed 's/^/-labsl_/' | tr '\n' ' ')
# shellcheck disable=SC2206,SC2207,SC2054
# grpc++_reflection: rpc/server registers server reflection.
LIBS=($(pkg-config --libs grpc++ protobuf ucx) -lgrpc++_reflection
  -Wl,--start-group $ABSL -Wl,--end-group -lspdlog -lfmt -lz -lpthread -lrt)

# 1. Protobuf / gRPC code for every proto/*.proto.
for src in proto/*.proto; do
  base=$GEN/${src%.proto}
  if [ -f "$base.pb.cc" ] && [ "$base.pb.cc" -nt "$src" ]; then continue; fi
  echo "protoc $src"
  if grep -q '^service ' "$src"; then
    protoc -I. --cpp_out="$GEN" --grpc_out="$GEN" \
      --plugin=protoc-gen-grpc="$(command -v grpc_cpp_plugin)" "$src"
  else
    protoc -I. --cpp_out="$GEN" "$src"
  fi
done

# etcd's v3 API (the coordinator's etcd store), from Debian's protos as
# third_party/etcd/BUILD makes them.
ETCD=/usr/share/gocode/src/go.etcd.io/etcd
mkdir -p "$GEN/src/third_party/etcd"
for pair in kv:mvcc/mvccpb/kv auth:auth/authpb/auth rpc:etcdserver/etcdserverpb/rpc; do
  name=${pair%%:*}
  src=$ETCD/${pair#*:}.proto
  out=$GEN/third_party/etcd/$name.pb.cc
  if [ -f "$out" ] && [ "$out" -nt "$src" ]; then continue; fi
  python3 third_party/etcd/strip_proto.py "$src" "$GEN/src/third_party/etcd/$name.proto"
done
if [ ! -f "$GEN/third_party/etcd/rpc.pb.cc" ]; then
  echo "protoc etcd"
  protoc -I"$GEN/src" --cpp_out="$GEN" --grpc_out="$GEN" \
    --plugin=protoc-gen-grpc="$(command -v grpc_cpp_plugin)" \
    "$GEN"/src/third_party/etcd/{kv,auth,rpc}.proto
fi

# 2. Library sources: every .cc of these packages but tests, mains and the
# daemons' flags and process objects (the fuzzers drive the parts the
# daemons are made of, with no flags, metrics port or signals), and the
# served worker that tests serve a WorkerNode with.
LIB_SRCS=()
for f in core/*.cc rpc/*.cc transport/*.cc worker/*.cc coordinator/*.cc "$GEN"/proto/*.cc \
  "$GEN"/third_party/etcd/*.cc worker/testing/served_worker.cc; do
  case "$f" in *_test.cc | */main.cc | *_flags.cc | *_daemon.cc) continue ;; esac
  case "$f" in *cuda* | *nccl*) continue ;; esac  # no CUDA toolkit here; host paths only
  LIB_SRCS+=("$f")
done
TARGETS=()
for f in fuzz/*_fuzzer.cc; do TARGETS+=("$(basename "$f" .cc)"); done

obj_of() { echo "$OBJ/$(echo "$1" | sed "s|^$GEN/||; s|/|_|g; s|\.cc$|.o|")"; }

# Compiles $1 into $2 unless $2 is newer than everything in its .d file.
# shellcheck disable=SC2317  # run by xargs below
compile() {
  local src=$1 obj=$2 dep
  if [ -f "$obj" ] && [ -f "$obj.d" ]; then
    local stale=0
    for dep in $(sed 's/^[^:]*://; s/\\$//' "$obj.d"); do
      if [ ! -e "$dep" ] || [ "$dep" -nt "$obj" ]; then stale=1; break; fi
    done
    [ "$stale" = 0 ] && return 0
  fi
  echo "compile $src"
  # shellcheck disable=SC2086
  local tmp=$obj.$$.tmp  # unique: two builds may run at once
  # The parsers a fuzzer spends its time in (core/) and the targets are
  # optimized; the service glue around them (gRPC handlers, stores) builds
  # at -O0, in half the time, where the fuzzers' time goes to libgrpc.
  local opt=-O0 san=$GLUE_SAN
  case "$src" in core/* | fuzz/*) opt=-O1 san=$SAN ;; rpc/convert.cc) san=$SAN ;; esac
  if $CXX $CXXFLAGS $opt $san -fsanitize=fuzzer-no-link -MMD -MF "$obj.d" -c "$src" -o "$tmp"; then
    mv "$tmp" "$obj"
  else
    rm -f "$obj" "$tmp"  # never link a stale object
    return 1
  fi
}
export -f compile
export CXX CXXFLAGS SAN GLUE_SAN

pairs=()
for src in "${LIB_SRCS[@]}" "${TARGETS[@]/#/fuzz/}" fuzz/make_seeds; do
  case "$src" in fuzz/*_fuzzer | fuzz/make_seeds) src=$src.cc ;; esac
  pairs+=("$src" "$(obj_of "$src")")
done
# A failed compile does not stop the others: targets that do not need the
# object still link (the pure-core ones link core/ only).
printf '%s\n' "${pairs[@]}" | xargs -d '\n' -n 2 -P "$JOBS" bash -c 'compile "$1" "$2"' _ ||
  echo "some sources failed to compile (see above)"

LIB_OBJS=()
CORE_OBJS=()
for src in "${LIB_SRCS[@]}"; do
  LIB_OBJS+=("$(obj_of "$src")")
  case "$src" in core/*) CORE_OBJS+=("$(obj_of "$src")") ;; esac
done
status=0

# 3. Link each target, JOBS at a time; lld where it is installed (five
# times faster than ld.bfd on these ASan binaries).
LDFLAGS=""
if command -v ld.lld >/dev/null; then LDFLAGS="-fuse-ld=lld"; fi
failed_links=$OUT/failed_links
rm -f "$failed_links"
# shellcheck disable=SC2317  # run in the background below
link() {
  local bin=$1
  shift
  echo "link $bin"
  # Linked aside and renamed: a running fuzzer keeps its binary.
  # shellcheck disable=SC2086
  if $CXX -fsanitize=fuzzer $SAN $LDFLAGS -o "$bin.$$.tmp" "$@" "${LIBS[@]}"; then
    mv "$bin.$$.tmp" "$bin"
  else
    rm -f "$bin.$$.tmp"
    echo "$bin" >>"$failed_links"
  fi
}
for t in "${TARGETS[@]}"; do
  bin=$OUT/$t
  case "$t" in
    # Targets that run the transports or the daemons' code link it all.
    worker_* | coordinator_* | shm_* | pull_* | ucx_*) objs=("$(obj_of "fuzz/$t.cc")" "${LIB_OBJS[@]}") ;;
    # Tensor metadata from the wire or the data dir: core plus its conversion.
    metadata_*) objs=("$(obj_of "fuzz/$t.cc")" "${CORE_OBJS[@]}" "$(obj_of rpc/convert.cc)")
      for src in "$GEN"/proto/*.pb.cc; do objs+=("$(obj_of "$src")"); done ;;
    *) objs=("$(obj_of "fuzz/$t.cc")" "${CORE_OBJS[@]}") ;;
  esac
  need=0
  [ -f "$bin" ] || need=1
  for o in "${objs[@]}"; do
    if [ ! -f "$o" ]; then need=missing; break; fi
    if [ "$o" -nt "$bin" ]; then need=1; fi
  done
  if [ "$need" = missing ]; then
    echo "cannot link $t: $o did not compile"
    rm -f "$bin"
    status=1
  elif [ "$need" = 1 ]; then
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
    link "$bin" "${objs[@]}" &
  fi
done
wait
if [ -s "$failed_links" ]; then status=1; fi
# The seed generator (a plain program; see make_seeds.cc).
seeds_objs=("$(obj_of fuzz/make_seeds.cc)" "${CORE_OBJS[@]}")
for src in "$GEN"/proto/*.pb.cc rpc/convert.cc; do seeds_objs+=("$(obj_of "$src")"); done
if [ ! -f "$OUT/make_seeds" ] || [ "${seeds_objs[0]}" -nt "$OUT/make_seeds" ]; then
  echo "link $OUT/make_seeds"
  # shellcheck disable=SC2086
  $CXX $SAN $LDFLAGS -fsanitize=fuzzer-no-link -o "$OUT/make_seeds" "${seeds_objs[@]}" "${LIBS[@]}" ||
    status=1
fi
[ "$status" = 0 ] && echo "built: ${TARGETS[*]} in $OUT/"
exit "$status"
