#!/usr/bin/env python3
"""Writes etcd's v3 API protos (Debian's golang-etcd-server-dev) as plain
proto3 for protoc's C++ and gRPC plugins: gogoproto and google.api options
dropped (they only steer Go code and the HTTP gateway), imports renamed to
where they land in this tree. Usage: strip_proto.py IN OUT."""
import re
import sys

IMPORTS = {
    "etcd/mvcc/mvccpb/kv.proto": "third_party/etcd/kv.proto",
    "etcd/auth/authpb/auth.proto": "third_party/etcd/auth.proto",
}


def strip(text):
    text = re.sub(r'import "(gogoproto|google/api)/[^"]*";\n', "", text)
    text = re.sub(r"option \(gogoproto\.[a-z_]+\) = [a-z]+;\n", "", text)
    # option (google.api.http) = { ... }; spans lines, braces nested.
    while True:
        start = text.find("option (google.api.http) = {")
        if start < 0:
            break
        depth, at = 0, text.index("{", start)
        while True:
            depth += {"{": 1, "}": -1}.get(text[at], 0)
            at += 1
            if depth == 0:
                break
        text = text[:start] + text[at:].lstrip(";")
    text = re.sub(r"\s*\[\(gogoproto\.[^\]]*\]", "", text)
    for old, new in IMPORTS.items():
        text = text.replace('import "%s";' % old, 'import "%s";' % new)
    if "gogoproto" in text or "google.api" in text:
        raise SystemExit("an option this script does not know is left")
    return text


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        out = strip(f.read())
    with open(sys.argv[2], "w") as f:
        f.write(out)
