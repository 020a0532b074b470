#!/usr/bin/env python3
"""`check` speed without checkouts: the 4 supported releases, and N upstream commits (target <= 5 s).

The N commits are real upstream: the latest N sglang releases, one commit each, in a release
history built like the default one (separate cache, built once; a re-run reads its tags, no
network). Older releases predate DSV4, so
the series does not apply there; the timing is what matters here: each rev is replayed in a
temporary index, entry by entry.
  python ci/bench/bench_check.py [--commits 50] [--out ci/bench/results/check.json]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from benchlib import machine, write_json
from packaging.version import Version

from c128patch.git import Git
from c128patch.ops.check import check_revs
from c128patch.series.manifest import default_series_root, load_series
from c128patch.upstream.cache import cache_dir
from c128patch.upstream.releases import ReleaseHistory, release_version
from c128patch.upstream.target import Target

TARGET_S = 5.0  # check over the N commits


def built_releases(history: Path, n: int) -> list[str] | None:
    """The releases of an already built history of ``n`` (its tags), so that a re-run needs no network."""
    if not history.is_dir():
        return None
    tags = Git(git_dir=history).out("tag", "--list", "v*").split()
    versions = [v for v in (release_version(t) for t in tags) if v and not Version(v).is_prerelease]
    return sorted(versions, key=Version)[-n:] if len(versions) >= n else None


def latest_releases(n: int) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "sglang"],
                         capture_output=True, text=True).stdout
    line = next(l for l in out.splitlines() if l.startswith("Available versions:"))
    versions = [v.strip() for v in line.split(":", 1)[1].split(",")]
    final = [v for v in versions if not Version(v).is_prerelease]
    return sorted(final, key=Version)[-n:]


def timed_checks(series, git: Git, revs: list[str]) -> tuple[float, int, int]:
    """(seconds, revs that apply, git processes started)."""
    commits = [Target(r, git.rev_parse(r)) for r in revs]
    calls, raw = [0], Git._raw

    def counting(self, *a, **k):
        calls[0] += 1
        return raw(self, *a, **k)

    Git._raw = counting
    try:
        start = time.perf_counter()
        results = check_revs(series, git, commits)
        took = time.perf_counter() - start
    finally:
        Git._raw = raw
    return took, sum(r.ok for r in results), calls[0]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commits", type=int, default=50)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    series = load_series(default_series_root())
    four = ["v0.5.20", "v0.5.21", "v0.5.22", "v0.5.23"]
    t4, ok4, calls4 = timed_checks(series, Git(git_dir=ReleaseHistory().ensure()), four)
    big = ReleaseHistory(cache_dir() / f"sglang-releases-{args.commits}.git")
    versions = built_releases(big.root, args.commits) or latest_releases(args.commits)
    build_start = time.perf_counter()
    big.ensure(versions)
    build_s = time.perf_counter() - build_start
    revs = [f"v{v}" for v in versions]
    tn, okn, callsn = timed_checks(series, Git(git_dir=big.root), revs)
    row = {"series_entries": len(series.entries), "four_releases_s": t4, "four_releases_ok": ok4,
           "four_releases_git_calls_per_rev": calls4 / len(four),
           "commits": len(revs), "commits_s": tn, "commits_ok": okn, "range": f"{revs[0]}..{revs[-1]}",
           "git_calls_per_rev": callsn / len(revs), "history_build_s_once": build_s, "target_s": TARGET_S,
           "within_target": tn <= TARGET_S, "load_average": [round(x, 1) for x in os.getloadavg()],
           "machine": machine()}
    print(f"{'what':40} {'seconds':>8}  ok")
    print(f"{'check, 4 releases 0.5.20-0.5.23':40} {t4:8.3f}  {ok4}/4")
    print(f"{'check, ' + str(len(revs)) + ' commits ' + row['range']:40} {tn:8.3f}  {okn}/{len(revs)}  "
          f"(target <= {TARGET_S:g} s)")
    print(f"git calls per rev: {row['four_releases_git_calls_per_rev']:.0f} (4 releases), "
          f"{row['git_calls_per_rev']:.0f} "
          f"({len(revs)} commits); load average {row['load_average']}")
    write_json(args.out, row, revs=four)
    return 0


if __name__ == "__main__":
    sys.exit(main())
