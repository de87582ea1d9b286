"""Runs check.py on many broken copies of the manifests in one process (for
check_test.sh): importing python3-kubernetes takes most of a check's time,
so each case pays it once here instead of once per run.

    python3 check_cases.py --renderer=R CASES.tsv

CASES.tsv: one case per line, NAME<TAB>DIR<TAB>EXPECTED. Each DIR is checked
with its secrets.example.yaml, as `check.py DIR DIR/secrets.example.yaml`;
the case passes when the check fails with a message containing EXPECTED.
Prints one verdict line per case, "ok NAME (R)" or "FAIL NAME (R): why".
"""

import argparse
import contextlib
import io
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cases")
    ap.add_argument("--renderer", choices=("auto", "kubectl", "builtin"), required=True)
    args = ap.parse_args()
    r = args.renderer
    with open(args.cases) as f:
        for line in f:
            name, d, expected = line.rstrip("\n").split("\t")
            out = io.StringIO()
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                    status = check.main(["--renderer", r, d, os.path.join(d, "secrets.example.yaml")])
            except SystemExit as e:
                status = e.code
            except Exception as e:  # a crash of the checker is a failed case
                status = None
                out.write(f"check.py raised {type(e).__name__}: {e}")
            text = out.getvalue()
            if status == 0:
                print(f"FAIL {name} ({r}): check.py passed a broken manifest")
            elif status is None:
                print(f"FAIL {name} ({r}): {text}")
            elif expected not in text:
                print(f"FAIL {name} ({r}): failed, but without '{expected}': {text}")
            else:
                print(f"ok {name} ({r})")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
