#!/usr/bin/env python3
"""status on an unchanged patched tree (the real series applied to v0.5.23, its proof recorded by apply): CPU time
(user + sys of the child and its git calls) of `c128patch status` and `status --json` reading the recorded proof,
beside `status --prove` (the replay status did every time before), `c128patch --help` (the CLI's start-up) and raw
git's floor, `git status --porcelain` + `git rev-parse HEAD HEAD^{tree}` (N runs, interleaved, at least 11);
target: `status --json` <= 0.15 s CPU median (issue 35), exit 1 over it.
  python ci/bench/bench_status.py [--runs 11] [--out ci/bench/results/status.json]
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import append, c128patch, interleaved, mirror, parser, ratio, table, target

TARGET_S = 0.15
# the console script pip installs beside this Python, as a user types it (else `-m c128patch`: runpy's cost)
SCRIPT = Path(sys.executable).with_name("c128patch")
CLI = [str(SCRIPT)] if SCRIPT.is_file() else [sys.executable, "-m", "c128patch"]


def child(tree: Path, *args: str) -> None:
    subprocess.run(args, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def main() -> int:
    args = parser("status", runs=11).parse_args()
    if args.runs < 11:
        raise SystemExit("--runs: at least 11")
    work = Path(tempfile.mkdtemp(prefix="bench-status-"))
    try:
        tree = work / "sglang"
        c128patch("apply", "--sglang-rev", "v0.5.23", "--repo", str(mirror(work)), "--tree", str(tree))
        proof = c128patch("status", "--tree", str(tree))  # the proof apply recorded holds: nothing is replayed
        if '"proof": "recorded"' not in proof.stdout:
            raise SystemExit("status did not read the proof apply recorded")
        cases = {
            "raw: git status --porcelain + git rev-parse HEAD HEAD^{tree}":
                lambda i: (child(tree, "git", "status", "--porcelain"),
                           child(tree, "git", "rev-parse", "HEAD", "HEAD^{tree}")),
            "c128patch --help (the CLI's start-up alone)": lambda i: child(tree, *CLI, "--help"),
            "c128patch status --json (recorded proof)": lambda i: child(tree, *CLI, "status", "--json"),
            "c128patch status (recorded proof)": lambda i: child(tree, *CLI, "status"),
            "c128patch status --prove --json (the series replayed)":
                lambda i: child(tree, *CLI, "status", "--prove", "--json"),
        }
        for fn in cases.values():  # warm the bytecode and file caches
            fn(-1)
        figures, _ = interleaved(cases, args.runs, children_only=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    raw, _, ours, text, proved = figures
    table(figures)
    record = {"runs": args.runs, "figures": figures,
              "ratios": {"status --json / raw git": ratio(figures, ours, raw),
                         "status --json / status --prove --json": ratio(figures, ours, proved)},
              "targets": [target("status --json, recorded proof (s)", figures[ours]["cpu"]["median"], TARGET_S, "cpu"),
                          target("status, recorded proof (s)", figures[text]["cpu"]["median"], TARGET_S, "cpu")]}
    return int(append(args.out, record, revs=("v0.5.23",))["missed"])


if __name__ == "__main__":
    raise SystemExit(main())
