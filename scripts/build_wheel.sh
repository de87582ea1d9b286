#!/usr/bin/env bash
# Builds dist/tessera-VERSION-cpXY-cpXY-linux_x86_64.whl: the Python SDK
# (import tessera) and the CLI (a `tessera` console script), for
#   /usr/bin/python3 -m venv --system-site-packages VENV   # numpy from Debian's python3-numpy
#   VENV/bin/pip install dist/tessera-*.whl       # no network needed
# Prints the wheel's path.
set -euo pipefail
cd "$(dirname "$0")/.."
# TESSERA_SKIP_BAZEL: built already (scripts/test.sh), run no bazel.
[ -n "${TESSERA_SKIP_BAZEL:-}" ] || bazel build //client/python:package //client:tessera >&2
version=$(sed -n 's/^inline constexpr char kVersion\[\] = "\(.*\)";/\1/p' ops/version.h)
/usr/bin/python3 scripts/make_wheel.py --package bazel-bin/client/python/tessera \
  --cli bazel-bin/client/tessera --version "$version" --out dist
