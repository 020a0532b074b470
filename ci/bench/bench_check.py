#!/usr/bin/env python3
"""`check` (no checkout) on the 4 supported releases vs raw git (per rev: a temporary index, read-tree,
then git apply --cached -3 of each patch the plan chose), N paired runs, interleaved; target: at most
raw's CPU (issue 35). With --commits N, a release history of the latest N real upstream releases
(a separate cache, built once from PyPI; a re-run reads its tags), also over those (target <= 5 s);
--commits 0 skips them (no network).
  python ci/bench/bench_check.py [--runs 3] [--commits 50] [--out ci/bench/results/check.json]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import append, interleaved, parser, ratio, table, target
from packaging.version import Version

from c128patch.git import Git
from c128patch.ops.check import check_revs
from c128patch.series.manifest import default_series_root, load_series
from c128patch.series.plan import plan
from c128patch.upstream.releases import ReleaseHistory, cache_dir, release_version
from c128patch.upstream.source import Target

FOUR = ("v0.5.20", "v0.5.21", "v0.5.22", "v0.5.23")
TARGET_S = 5.0  # check over the N real commits


def raw_check(git: Git, plans: dict[str, list]) -> None:
    """Each rev into a temporary index, then each planned patch with git apply --cached -3."""
    for commit, items in plans.items():
        with tempfile.TemporaryDirectory() as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            git.run("read-tree", commit, env=env)
            for item in items:
                if item.patch is not None:
                    git.run("apply", "--cached", "-3", str(item.path), env=env)


def ours_check(series, git: Git, commits: dict[str, str]) -> tuple[int, float]:
    """(revs that apply, git processes per rev)."""
    calls, raw = [0], Git._raw

    def counting(self, *a, **k):
        calls[0] += 1
        return raw(self, *a, **k)

    Git._raw = counting
    try:
        ok = sum(r.ok for r in check_revs(series, git, [Target(r, c) for r, c in commits.items()]))
    finally:
        Git._raw = raw
    return ok, round(calls[0] / len(commits), 1)


def real_releases(n: int) -> tuple[Git, list[str]]:
    """A release history of the latest ``n`` real releases (built once from PyPI, then its tags)."""
    history = ReleaseHistory(cache_dir() / f"sglang-releases-{n}.git")
    tags = Git(git_dir=history.root).out("tag", "--list", "v*").split() if history.root.is_dir() else []
    if len(tags) < n:
        out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "sglang"], capture_output=True,
                             text=True).stdout
        tags = next(l for l in out.splitlines() if l.startswith("Available versions:")).split(":", 1)[1].split(",")
    versions = sorted({v for v in map(release_version, tags) if v and not Version(v).is_prerelease}, key=Version)[-n:]
    history.ensure(versions)
    return Git(git_dir=history.root), [f"v{v}" for v in versions]


def main() -> int:
    ap = parser("check")
    ap.add_argument("--commits", type=int, default=50)
    args = ap.parse_args()
    series = load_series(default_series_root())
    git = Git(git_dir=ReleaseHistory().ensure())
    commits = {rev: git.rev_parse(rev) for rev in FOUR}
    plans = {c: plan(series, git, c) for c in commits.values()}
    cases = {"raw: read-tree + git apply --cached -3, 4 releases": lambda i: raw_check(git, plans),
             "check, 4 releases (in process)": lambda i: ours_check(series, git, commits)}
    big = real_releases(args.commits) if args.commits else None
    if big:
        cases[f"check, {args.commits} real upstream releases"] = lambda i: ours_check(
            series, big[0], {r: big[0].rev_parse(r) for r in big[1]})
    figures, last = interleaved(cases, args.runs)
    raw, ours, *more = figures
    r = ratio(figures, ours, raw)
    targets = [target("check / raw, 4 releases", r["cpu"], 1.0, "cpu")]
    record = {"runs": args.runs, "series_entries": len(series.entries), "figures": figures,
              "ratios": {"check / raw": r},
              "targets": targets, "four_releases_s": figures[ours]["wall"]["median"], "four_releases_ok": last[ours][0],
              "four_releases_git_calls_per_rev": last[ours][1]}
    if more:
        seconds = figures[more[0]]["wall"]["median"]
        targets.append(target(f"check over {args.commits} real commits (s)", seconds, TARGET_S))
        record.update(commits=args.commits, commits_s=seconds, commits_ok=last[more[0]][0], target_s=TARGET_S,
                      git_calls_per_rev=last[more[0]][1], range=f"{big[1][0]}..{big[1][-1]}",
                      within_target=seconds <= TARGET_S)
    table(figures)
    # README's check figures need the real commits: without them the top level keeps the last run that had them
    record = append(args.out, record, revs=FOUR, headline=bool(more))
    return int(record["missed"])


if __name__ == "__main__":
    raise SystemExit(main())
