#!/usr/bin/env python3
"""Stage `smoke --upstream-suite` for the H200, one folder per release (git-ignored under .gpu/):

  .gpu/upstream-suite/<rev>/patched          the release + the series (c128patch apply): what the tests import
  .gpu/upstream-suite/<rev>/upstream         the same files of the unpatched release
  .gpu/upstream-suite/<rev>/upstream-tests   the selected upstream test files (never committed here)

  python ci/gpu/stage_upstream_suite.py --tests PATH [--rev v0.5.23 ...] [--dest .gpu/upstream-suite]

PATH: the test/ folder of an sglang checkout (or a folder laid out like one). Each release is
applied with the real `c128patch apply` and staged with the real `c128patch smoke --stage`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RELEASES = ("v0.5.20", "v0.5.21", "v0.5.22", "v0.5.23")


def c128patch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "c128patch", *args], capture_output=True, text=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tests", type=Path, required=True)
    ap.add_argument("--rev", action="append", choices=RELEASES)
    ap.add_argument("--dest", type=Path, default=REPO / ".gpu" / "upstream-suite")
    args = ap.parse_args()
    total = 0
    for rev in args.rev or RELEASES:
        with tempfile.TemporaryDirectory() as tmp:
            tree = Path(tmp) / "sglang"
            for step in (("apply", "--sglang-rev", rev, "--tree", str(tree)),
                         ("smoke", "--tier", "kernel", "--tree", str(tree), "--upstream-suite", str(args.tests),
                          "--stage", str(args.dest / rev), "--json")):
                proc = c128patch(*step)
                if proc.returncode != 0:
                    print(f"{rev}: c128patch {step[0]} failed:\n{proc.stderr or proc.stdout}", file=sys.stderr)
                    return 1
        staged = json.loads(proc.stdout)["staged"]
        size = sum(v["bytes"] for v in staged.values())
        total += size
        print(f"{rev}: " + ", ".join(f"{k} {v['files']} files" for k, v in staged.items()) + f", {size / 1e6:.1f} MB")
    print(f"{args.dest}: {total / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
