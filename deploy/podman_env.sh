# shellcheck shell=bash
# Sourced by the deploy/ container scripts: how podman runs on these machines.
#
# * runtime runc (Debian's default crun fails here: "cgroups in hybrid mode
#   not supported") and default rlimits no higher than this shell's hard
#   limits (a VM without CAP_SYS_RESOURCE cannot raise them), written into a
#   containers.conf that CONTAINERS_CONF points at. A CONTAINERS_CONF the
#   caller already set is kept.
# * TESSERA_PODMAN_ROOT=DIR: a private image and container store
#   (--root DIR/root --runroot DIR/runroot) for CI runs, leaving the user's
#   default store alone.
#
# Defines: PODMAN (an array: podman and its store flags), TESSERA_IMAGE
# (localhost/tessera), tessera_image_version, podman_can_run.

TESSERA_IMAGE="${TESSERA_IMAGE:-localhost/tessera}"
TESSERA_STATE_DIR="${TESSERA_STATE_DIR:-${TESSERA_PODMAN_ROOT:-${TMPDIR:-/tmp}/tessera-podman-$(id -u)}}"

_tessera_hard_limit() {  # prints min(hard limit, cap); "unlimited" counts as the cap
  local v="$1" cap="$2"
  if [ "$v" = "unlimited" ] || [ "$v" -gt "$cap" ]; then echo "$cap"; else echo "$v"; fi
}

if [ -z "${CONTAINERS_CONF:-}" ]; then
  mkdir -p "$TESSERA_STATE_DIR"
  _nofile=$(_tessera_hard_limit "$(ulimit -Hn)" 65536)
  _nproc=$(_tessera_hard_limit "$(ulimit -Hu)" 32768)
  cat >"$TESSERA_STATE_DIR/containers.conf.tmp" <<EOF
# Written by deploy/podman_env.sh.
[containers]
default_ulimits = ["nofile=${_nofile}:${_nofile}", "nproc=${_nproc}:${_nproc}"]

[engine]
runtime = "runc"
EOF
  mv "$TESSERA_STATE_DIR/containers.conf.tmp" "$TESSERA_STATE_DIR/containers.conf"
  export CONTAINERS_CONF="$TESSERA_STATE_DIR/containers.conf"
  unset _nofile _nproc
fi

PODMAN=(podman)
if [ -n "${TESSERA_PODMAN_ROOT:-}" ]; then
  mkdir -p "$TESSERA_PODMAN_ROOT/root" "$TESSERA_PODMAN_ROOT/runroot"
  PODMAN+=(--root "$TESSERA_PODMAN_ROOT/root" --runroot "$TESSERA_PODMAN_ROOT/runroot")
fi

# The image tag for this checkout: $TESSERA_VERSION, else git's short commit
# (with -dirty when the tree has changes), else "dev".
tessera_image_version() {
  if [ -n "${TESSERA_VERSION:-}" ]; then echo "$TESSERA_VERSION"; return; fi
  git describe --tags --always --dirty 2>/dev/null || echo dev
}

# True when podman can start a container from IMAGE here; otherwise prints why
# to stderr.
podman_can_run() {
  local image="$1" out
  if ! command -v podman >/dev/null 2>&1; then
    echo "podman is not installed (scripts/setup.sh installs it)" >&2
    return 1
  fi
  if ! out=$("${PODMAN[@]}" run --rm --network host "$image" true 2>&1); then
    echo "podman cannot run a container here: $out" >&2
    return 1
  fi
}
