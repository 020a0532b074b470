#!/usr/bin/env python3
"""Write `c128patch matrix --markdown` into README.md between its matrix markers.

    python ci/refresh_matrix.py [--check]

Run after new evidence is collected (ci/gpu/collect_results.py, ci/compile_kernels.py --record)
or after a series change made some of it stale. --check exits 1 if README.md is not current
(tests/test_evidence.py checks the same).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BEGIN, END = "<!-- matrix:begin -->\n", "<!-- matrix:end -->"


def current_matrix() -> str:
    return subprocess.run([sys.executable, "-m", "c128patch", "matrix", "--markdown"], check=True,
                          capture_output=True, text=True, cwd=REPO).stdout


def with_matrix(text: str, matrix: str) -> str:
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + matrix + text[end:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    text = README.read_text()
    new = with_matrix(text, current_matrix())
    if args.check:
        if new != text:
            print("README.md's matrix is not current: run python ci/refresh_matrix.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(new)
    print(f"{README}: matrix refreshed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
