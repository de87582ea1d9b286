#!/usr/bin/env bash
# Builds the tessera image, localhost/tessera:VERSION and :latest, from the
# binaries Bazel produced (no compiling inside the image), and prints its size.
#
#   deploy/build-images.sh
#
# Steps: (1) the base image localhost/debian:bookworm, made with debootstrap
# from the mirror apt already uses when it is missing (no registry needed;
# ~45 s the first time, then cached); (2) the three binaries, built with
# `bazel build` when missing or built for the other variant; (3) a build
# context with just those binaries (+ CUDA runtime libraries for the GPU
# variant) and `podman build --isolation chroot --network host`.
#
# Environment:
#   TESSERA_VARIANT=cpu|cuda   cuda: binaries from `bazel build --config=cuda`,
#                              tags VERSION-cuda and latest-cuda (see Containerfile)
#   TESSERA_BASE=IMAGE         base image (default localhost/debian:bookworm;
#                              elsewhere e.g. debian:bookworm)
#   TESSERA_VERSION=V          image tag (default: git describe --always --dirty)
#   TESSERA_PODMAN_ROOT=DIR    private podman store (CI); see deploy/podman_env.sh
#   TESSERA_BIN_DIR=DIR        where the binaries are (default bazel-bin)
#   TESSERA_SKIP_BAZEL=1       never run bazel; fail if binaries are missing
#
# Prints, last, "image REF SIZE".
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=deploy/podman_env.sh
source deploy/podman_env.sh

VARIANT="${TESSERA_VARIANT:-cpu}"
BASE="${TESSERA_BASE:-localhost/debian:bookworm}"
BIN="${TESSERA_BIN_DIR:-bazel-bin}"
VERSION="$(tessera_image_version)"
SUFFIX=""
case "$VARIANT" in
  cpu) ;;
  cuda) SUFFIX="-cuda" ;;
  *) echo "TESSERA_VARIANT must be cpu or cuda, not '$VARIANT'" >&2; exit 2 ;;
esac
TAG="$TESSERA_IMAGE:$VERSION$SUFFIX"
LATEST="$TESSERA_IMAGE:latest$SUFFIX"
BINARIES=(coordinator/tessera-coordinator worker/tessera-worker client/tessera)
START=$(date +%s.%N)

log() { printf 'build-images: %s\n' "$*" >&2; }
elapsed() { awk -v s="$START" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }'; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/tessera-build.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# ---- (1) the base image -----------------------------------------------------
debian_mirror() {
  local uri=""
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    uri=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources)
  fi
  if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
    uri=$(awk '$1 == "deb" && $3 ~ /^bookworm$/ { print $2; exit }' /etc/apt/sources.list)
  fi
  echo "${uri:-http://deb.debian.org/debian}"
}

make_debian_base() {
  if [ "$(id -u)" -ne 0 ]; then
    log "making $BASE needs root (debootstrap); run this once as root, or pass TESSERA_BASE=debian:bookworm where a registry is reachable"
    exit 1
  fi
  command -v debootstrap >/dev/null || { log "debootstrap is missing (scripts/setup.sh installs it)"; exit 1; }
  local mirror rootfs="$TMP/rootfs"
  mirror=$(debian_mirror)
  log "making $BASE with debootstrap from $mirror (first time only, about a minute)"
  debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$TMP/debootstrap.log" 2>&1 || {
    tail -20 "$TMP/debootstrap.log" >&2
    log "debootstrap failed (full log above)"
    exit 1
  }
  # The same suites as this host (updates, security), so images get fixes.
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    cp /etc/apt/sources.list.d/debian.sources "$rootfs/etc/apt/sources.list.d/debian.sources"
    rm -f "$rootfs/etc/apt/sources.list"
  fi
  # No manuals, docs or translations (about a third of a minbase; license
  # files stay), now or in later installs.
  printf '%s\n' 'path-exclude=/usr/share/doc/*' 'path-include=/usr/share/doc/*/copyright' \
    'path-exclude=/usr/share/man/*' 'path-exclude=/usr/share/info/*' \
    'path-exclude=/usr/share/locale/*' 'path-exclude=/usr/share/lintian/*' \
    >"$rootfs/etc/dpkg/dpkg.cfg.d/tessera-slim"
  find "$rootfs/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
  rm -rf "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/* \
    "$rootfs"/usr/share/lintian/* "$rootfs"/var/cache/apt/archives/*.deb \
    "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log
  tar -C "$rootfs" -c . | "${PODMAN[@]}" import --quiet --change 'CMD ["/bin/bash"]' - "$BASE" >/dev/null
  rm -rf "$rootfs"
}

if ! "${PODMAN[@]}" image exists "$BASE"; then
  if [ "$BASE" = "localhost/debian:bookworm" ]; then
    make_debian_base
  else
    log "pulling $BASE"
    "${PODMAN[@]}" pull "$BASE" >/dev/null
  fi
fi

# ---- (2) the binaries ---------------------------------------------------------
is_cuda_build() { grep -q 'libcudart' <<<"$(ldd "$BIN/worker/tessera-worker" 2>/dev/null)"; }
need_build=""
for b in "${BINARIES[@]}"; do [ -x "$BIN/$b" ] || need_build="missing $BIN/$b"; done
if [ -z "$need_build" ]; then
  if [ "$VARIANT" = cuda ] && ! is_cuda_build; then need_build="the worker is not a --config=cuda build"; fi
  if [ "$VARIANT" = cpu ] && is_cuda_build; then need_build="the worker is a --config=cuda build"; fi
fi
if [ -n "$need_build" ]; then
  if [ -n "${TESSERA_SKIP_BAZEL:-}" ]; then log "$need_build, and TESSERA_SKIP_BAZEL is set"; exit 1; fi
  log "$need_build: building the binaries with bazel"
  flags=()
  [ "$VARIANT" = cuda ] && flags+=(--config=cuda)
  bazel build "${flags[@]}" //coordinator:tessera-coordinator //worker:tessera-worker //client:tessera
fi

# ---- (3) the build context and the image --------------------------------------
# The Debian packages that hold the binaries' libraries (libc6 is in every
# base), and for the GPU variant the CUDA libraries to bundle.
mkdir -p "$TMP/context/usr-local/bin"
declare -A needed=()  # library path -> the binary that needs it
for b in "${BINARIES[@]}"; do
  name=$(basename "$b")
  cp -L "$BIN/$b" "$TMP/context/usr-local/bin/$name"
  chmod 0755 "$TMP/context/usr-local/bin/$name"
  while read -r lib path; do
    case "$path" in
      /usr/local/cuda/*)
        if [ "$VARIANT" = cuda ]; then
          mkdir -p "$TMP/context/usr-local/cuda/lib64"
          cp -L "$path" "$TMP/context/usr-local/cuda/lib64/$lib"
        fi ;;
      /*) needed[$path]="$name" ;;
      *) log "$name needs $lib, which this host does not have (ldd: not found)"; exit 1 ;;
    esac
  done < <(ldd "$TMP/context/usr-local/bin/$name" | awk '$2 == "=>" { print $1, $3 }')
done
# One dpkg query for every spelling of every path (/lib or /usr/lib, links
# resolved): dpkg knows each file under the name its package ships.
spellings() { local r; r=$(readlink -f "$1"); printf '%s\n' "$1" "$r" "${1#/usr}" "/usr$1" "${r#/usr}" "/usr$r"; }
declare -A owner=()
while IFS= read -r line; do
  [[ "$line" == *": /"* ]] || continue
  owner[${line##*: }]=${line%%:*}
done < <(for p in "${!needed[@]}"; do spellings "$p"; done | sort -u | xargs dpkg -S 2>/dev/null)
packages=()
for p in "${!needed[@]}"; do
  pkg=""
  while read -r s; do pkg=${owner[$s]:-}; [ -z "$pkg" ] || break; done < <(spellings "$p")
  if [ -z "$pkg" ]; then
    log "${needed[$p]} needs $p, which no Debian package holds: cannot put it in the image"
    exit 1
  fi
  packages+=("$pkg")
done
RUNTIME_PACKAGES=$(printf '%s\n' "${packages[@]}" | grep -vx 'libc6' | sort -u | tr '\n' ' ')
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
SOURCE="${TESSERA_SOURCE:-$(git config --get remote.origin.url 2>/dev/null || true)}"

# The labels go in as --label too: buildah 1.28 takes a LABEL step from its
# cache even when the build arguments it uses changed.
log "building $TAG from $BASE (variant $VARIANT; packages: $RUNTIME_PACKAGES)"
"${PODMAN[@]}" build --isolation chroot --network host \
  -f deploy/Containerfile \
  --build-arg BASE="$BASE" \
  --build-arg VARIANT="$VARIANT" \
  --build-arg RUNTIME_PACKAGES="$RUNTIME_PACKAGES" \
  --build-arg VERSION="$VERSION" \
  --build-arg REVISION="$REVISION" \
  --build-arg SOURCE="$SOURCE" \
  --label org.opencontainers.image.version="$VERSION" \
  --label org.opencontainers.image.revision="$REVISION" \
  --label org.opencontainers.image.source="$SOURCE" \
  --label io.tessera.variant="$VARIANT" \
  -t "$TAG" -t "$LATEST" \
  "$TMP/context" >"$TMP/build.log" 2>&1 || {
  tail -40 "$TMP/build.log" >&2
  log "podman build failed (last lines above)"
  exit 1
}

size=$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$TAG")
base_size=$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$BASE")
log "done in $(elapsed) s"
awk -v t="$TAG" -v s="$size" -v b="$base_size" -v base="$BASE" \
  'BEGIN { printf "image %s %.1f MB (base %s %.1f MB)\n", t, s / 1e6, base, b / 1e6 }'
