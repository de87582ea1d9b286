#!/usr/bin/env python3
"""Packs the Python SDK and the CLI into a wheel, with the standard library
only (no network, no build backend): the `tessera` package (__init__.py,
py.typed, the _tessera extension and its stub) plus the CLI binary, run by a
`tessera` console script.

    make_wheel.py --package DIR --cli BINARY --version V --out DIR

The wheel is tagged for this interpreter and platform (cpXY-cpXY-linux_x86_64):
its extension and CLI link Debian's shared gRPC, Abseil, protobuf and UCX, so
it installs where those runtime libraries are (the machine it was built on,
or one set up by scripts/setup.sh).
"""
import argparse
import base64
import hashlib
import os
import sys
import sysconfig
import zipfile

CLI_SHIM = '''"""The `tessera` command: the CLI binary shipped in this package."""
import os
import sys


def main() -> None:
    binary = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "tessera")
    os.execv(binary, [binary] + sys.argv[1:])
'''

# The extension's own names are reached through the typed package; the stub
# says so, so that type checkers do not flag the import.
EXTENSION_STUB = '''from typing import Any

def __getattr__(name: str) -> Any: ...
'''


def digest(data: bytes) -> str:
    raw = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--package", required=True)
    parser.add_argument("--cli", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    tag = f"{py}-{py}-{platform}"
    name = f"tessera-{args.version}"
    info = f"{name}.dist-info"
    files = []  # (path in the wheel, bytes, executable)
    for entry in sorted(os.listdir(args.package)):
        with open(os.path.join(args.package, entry), "rb") as f:
            files.append((f"tessera/{entry}", f.read(), False))
    files.append(("tessera/_tessera.pyi", EXTENSION_STUB.encode(), False))
    files.append(("tessera/_cli.py", CLI_SHIM.encode(), False))
    with open(args.cli, "rb") as f:
        files.append(("tessera/bin/tessera", f.read(), True))
    metadata = "\n".join([
        "Metadata-Version: 2.1",
        "Name: tessera",
        f"Version: {args.version}",
        "Summary: Sharded tensors as a cluster service: the Python SDK and the tessera CLI",
        "Requires-Python: >=3.9",
        "Requires-Dist: numpy",
        "",
    ])
    files.append((f"{info}/METADATA", metadata.encode(), False))
    wheel = "\n".join([
        "Wheel-Version: 1.0",
        "Generator: tessera scripts/make_wheel.py",
        "Root-Is-Purelib: false",
        f"Tag: {tag}",
        "",
    ])
    files.append((f"{info}/WHEEL", wheel.encode(), False))
    files.append((f"{info}/entry_points.txt",
                  b"[console_scripts]\ntessera = tessera._cli:main\n", False))
    files.append((f"{info}/top_level.txt", b"tessera\n", False))
    record = "".join(f"{path},{digest(data)},{len(data)}\n" for path, data, _ in files)
    record += f"{info}/RECORD,,\n"
    files.append((f"{info}/RECORD", record.encode(), False))

    os.makedirs(args.out, exist_ok=True)
    out = os.path.join(args.out, f"{name}-{tag}.whl")
    tmp = out + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as whl:
        for path, data, executable in files:
            item = zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0))
            item.compress_type = zipfile.ZIP_DEFLATED
            item.external_attr = (0o100755 if executable else 0o100644) << 16
            whl.writestr(item, data)
    os.replace(tmp, out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
