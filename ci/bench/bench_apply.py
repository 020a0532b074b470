#!/usr/bin/env python3
"""apply vs raw git (worktree add + am -3 of the same files) on the real 0.5.23 tree, and check timing.

One run, side by side, median of --reps. Prints a table and writes JSON (--out).
  python ci/bench/bench_apply.py [--reps 5] [--out ci/bench/results/apply.json]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import machine, write_json

from c128patch.git import Git
from c128patch.ops.check import check_rev
from c128patch.series.manifest import default_series_root, load_series
from c128patch.series.plan import plan
from c128patch.upstream.releases import ReleaseHistory

RELEASES = ("v0.5.20", "v0.5.21", "v0.5.22", "v0.5.23")


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def raw_git(repo: Path, dest: Path, series, commit: str) -> None:
    """What a maintainer would type: a worktree, then git am -3 and a commit per overlay."""
    git = Git(git_dir=repo)
    git.run("worktree", "add", "--quiet", "-b", f"raw-{dest.name}", str(dest), "v0.5.23")
    wt = Git(worktree=dest)
    for item in plan(series, git, commit):
        if item.patch is not None:
            wt.run("am", "-3", "--quiet", str(item.path))
        else:
            target = dest / item.entry.target
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(item.path, target)
            wt.run("add", item.entry.target)
            wt.run("commit", "--quiet", "-m", f"add {item.entry.target}")


def ours(repo: Path, dest: Path, series_root: Path) -> None:
    subprocess.run([sys.executable, "-m", "c128patch", "apply", "--sglang-rev", "v0.5.23", "--repo", str(repo),
                    "--tree", str(dest), "--series", str(series_root), "--json"], check=True, capture_output=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    series = load_series(default_series_root())
    releases = ReleaseHistory().ensure()
    work = Path(tempfile.mkdtemp(prefix="bench-apply-"))
    try:
        # A bare clone stands for the user's mirror; both sides read the same objects.
        repo = work / "mirror.git"
        subprocess.run(["git", "clone", "--quiet", "--bare", str(releases), str(repo)], check=True)
        commit = Git(git_dir=repo).rev_parse("v0.5.23")
        raw, mine = [], []
        for i in range(args.reps):  # interleaved, so drift in the machine hits both alike
            raw.append(timed(lambda: raw_git(repo, work / f"raw{i}", series, commit)))
            mine.append(timed(lambda: ours(str(repo), work / f"ours{i}", series.root)))
        git = Git(git_dir=repo)
        commits = [(r, git.rev_parse(r)) for r in RELEASES]
        checks = []
        for _ in range(args.reps):
            start = time.perf_counter()
            results = [check_rev(series, git, r, c) for r, c in commits]
            checks.append(time.perf_counter() - start)
        assert all(r.ok for r in results), [r.to_json() for r in results if not r.ok]
        cli_check = timed(lambda: subprocess.run(
            [sys.executable, "-m", "c128patch", "check", *[a for r in RELEASES for a in ("--sglang-rev", r)],
             "--repo", str(repo), "--series", str(series.root), "--json"], check=True, capture_output=True))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    row = {
        "entries": len(series.entries),
        "reps": args.reps,
        "raw_git_s": statistics.median(raw),
        "apply_s": statistics.median(mine),
        "ratio": statistics.median(mine) / statistics.median(raw),
        "check_4_releases_s": statistics.median(checks),
        "check_4_releases_cli_s": cli_check,
        "machine": machine(),
    }
    print(f"{'what':44} {'seconds':>8}")
    print(f"{'raw: git worktree add + git am -3 (' + str(row['entries']) + ' entries)':44} {row['raw_git_s']:8.3f}")
    print(f"{'c128patch apply --sglang-rev v0.5.23':44} {row['apply_s']:8.3f}")
    print(f"{'ratio apply / raw (target <= 1.5)':44} {row['ratio']:8.2f}")
    print(f"{'check, 4 releases (in process)':44} {row['check_4_releases_s']:8.3f}")
    print(f"{'c128patch check, 4 releases (whole CLI)':44} {row['check_4_releases_cli_s']:8.3f}")
    write_json(args.out, row, revs=RELEASES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
