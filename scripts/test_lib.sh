# Sourced by the shell tests scripts/test.sh counts: a check that counts,
# their closing "NAME: N passed, M failed" line, and a local cluster of the
# test's own (run directory and ports), stopped and removed at exit.

passed=0
failed=0

# check WHAT COMMAND...: runs COMMAND, counts it passed or failed.
check() {
  local what="$1"
  shift
  if "$@"; then
    passed=$((passed + 1))
  else
    echo "FAILED: $what" >&2
    failed=$((failed + 1))
  fi
}

# finish NAME: the closing line; the exit status says whether all passed.
finish() {
  echo "$1: ${passed} passed, ${failed} failed"
  [ "$failed" -eq 0 ]
}

# True while process $1 runs (an exited one that no one reaped yet, a
# zombie, does not).
running() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

# A scratch directory ($work) and, for deploy/local_cluster.sh, a run
# directory and ports of this test's own; the cluster is stopped and both
# removed at exit.
private_workspace() {
  work=$(mktemp -d)
  TESSERA_RUN_DIR="$work/cluster"
  TESSERA_PORT=$((20000 + RANDOM % 20000))
  export TESSERA_RUN_DIR TESSERA_PORT
  trap 'deploy/local_cluster.sh stop >/dev/null 2>&1; rm -rf "$work"' EXIT
}
