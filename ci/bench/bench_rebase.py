#!/usr/bin/env python3
"""rebase vs raw git: moving the patched 0.5.22 branch onto v0.5.23, side by side in one run.

Both start from the same commits (``c128patch apply --sglang-rev v0.5.22`` in a clone of the release
history). Raw is what a maintainer would type: ``git rebase --onto v0.5.23 v0.5.22`` with rerere
trained on the same conflicts beforehand (resolved as the 0.5.23 series has them), and
``git rebase --continue`` at each stop rerere resolved. Ours is the whole ``c128patch rebase --onto
v0.5.23`` command: the series' 0.5.23 files replayed, merged-upstream checks and hints, the proof
against a fresh apply, the API contract on the new tip and the reports. Median of --reps,
interleaved; prints a table and writes JSON (--out). Target: ratio <= 1.5 (issue 29).
  python ci/bench/bench_rebase.py [--reps 3] [--out ci/bench/results/rebase.json]
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
from c128patch.series.manifest import default_series_root
from c128patch.upstream.releases import ReleaseHistory

RERERE = ("-c", "rerere.enabled=true", "-c", "rerere.autoupdate=true", "-c", "core.editor=true")
ENTRY = "C128patch-Entry"


def c128patch(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "c128patch", *args, "--json"], check=True, capture_output=True)


def applied(repo: Path, dest: Path, series: Path, rev: str) -> Git:
    c128patch("apply", "--sglang-rev", rev, "--repo", str(repo), "--tree", str(dest), "--series", str(series))
    return Git(worktree=dest)


def stopped_entry(git: Git) -> str:
    """The entry of the commit ``git rebase`` stopped at."""
    return git.out("log", "-1", f"--format=%(trailers:key={ENTRY},valueonly)", "REBASE_HEAD").strip()


def raw_rebase(git: Git, resolve=None) -> int:
    """git rebase --onto v0.5.23 v0.5.22, continuing at every stop; returns the number of stops.
    ``resolve(git)`` stages a resolution where rerere did not (training)."""
    proc = git.run(*RERERE, "rebase", "--onto", "v0.5.23", "v0.5.22", check=False)
    stops = 0
    while proc.returncode != 0:
        stops += 1
        if git.out("diff", "--name-only", "--diff-filter=U"):
            if resolve is None:
                raise SystemExit(f"rerere left conflicts: {git.out('diff', '--name-only', '--diff-filter=U')}")
            resolve(git)
        proc = git.run(*RERERE, "rebase", "--continue", check=False)
        if stops > 20:
            raise SystemExit(f"git rebase does not finish: {proc.stderr}")
    return stops


def trained_rr_cache(repo: Path, work: Path, series: Path) -> Path:
    """rerere's cache after one rebase whose conflicts were resolved as the 0.5.23 series has them."""
    reference = applied(repo, work / "reference", series, "v0.5.23")
    git = applied(repo, work / "training", series, "v0.5.22")

    def resolve(g: Git) -> None:
        entry = stopped_entry(g)
        commit = reference.out("log", "-1", "--format=%H", f"--grep=^{ENTRY}: {entry}$")
        for path in g.out("diff", "--name-only", "--diff-filter=U").split():
            (g.worktree / path).write_bytes(reference.blob(commit, path))
            g.run("add", "--", path)

    raw_rebase(git, resolve)
    return Path(git.out("rev-parse", "--absolute-git-dir")) / "rr-cache"


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    series = default_series_root()
    releases = ReleaseHistory().ensure()
    work = Path(tempfile.mkdtemp(prefix="bench-rebase-"))
    try:
        repo = work / "mirror.git"  # the user's mirror; both sides read the same objects
        subprocess.run(["git", "clone", "--quiet", "--bare", str(releases), str(repo)], check=True)
        rr_cache = trained_rr_cache(repo, work, series)
        raw, ours, stops = [], [], []
        for i in range(args.reps):  # interleaved, so drift in the machine hits both alike
            git = applied(repo, work / f"raw{i}", series, "v0.5.22")
            shutil.copytree(rr_cache, Path(git.out("rev-parse", "--absolute-git-dir")) / "rr-cache")
            seconds, n = timed(lambda: raw_rebase(git))
            raw.append(seconds)
            stops.append(n)
            tree = applied(repo, work / f"ours{i}", series, "v0.5.22").worktree
            ours.append(timed(lambda: c128patch("rebase", "--onto", "v0.5.23", "--tree", str(tree),
                                                "--series", str(series)))[0])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    row = {
        "rebase": "v0.5.22 -> v0.5.23",
        "reps": args.reps,
        "raw_git_rebase_rerere_s": statistics.median(raw),
        "raw_git_stops": statistics.median(stops),
        "rebase_s": statistics.median(ours),
        "ratio": statistics.median(ours) / statistics.median(raw),
        "machine": machine(),
    }
    print(f"{'what':58} {'seconds':>8}")
    print(f"{'raw: git rebase + trained rerere (' + str(row['raw_git_stops']) + ' stops, --continue each)':58} "
          f"{row['raw_git_rebase_rerere_s']:8.3f}")
    print(f"{'c128patch rebase --onto v0.5.23 (replay, proof, contract)':58} {row['rebase_s']:8.3f}")
    print(f"{'ratio rebase / raw (target <= 1.5)':58} {row['ratio']:8.2f}")
    write_json(args.out, row, revs=("v0.5.22", "v0.5.23"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
