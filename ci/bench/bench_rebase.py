#!/usr/bin/env python3
"""rebase vs raw git: the patched 0.5.22 branch (``c128patch apply``, untimed) moved onto v0.5.23, N
paired runs interleaved. Raw: ``git rebase --onto v0.5.23 v0.5.22`` with rerere trained beforehand on
the same conflicts (resolved as the 0.5.23 series has them), ``--continue`` at each stop. Ours: the
whole ``c128patch rebase --onto v0.5.23`` (replay, merged-upstream checks, hints, the proof, the API
contract, the reports). Target: <= 1.5x raw in CPU (issue 35).
  python ci/bench/bench_rebase.py [--runs 3] [--out ci/bench/results/rebase.json]
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from benchlib import append, c128patch, interleaved, mirror, parser, ratio, table, target

from c128patch.git import Git
from c128patch.series.manifest import default_series_root

RERERE = ("-c", "rerere.enabled=true", "-c", "rerere.autoupdate=true", "-c", "core.editor=true")
ENTRY = "C128patch-Entry"
TARGET_CPU = 1.5


def applied(repo: Path, dest: Path, series: Path, rev: str) -> Git:
    c128patch("apply", "--sglang-rev", rev, "--repo", str(repo), "--tree", str(dest), "--series", str(series))
    return Git(worktree=dest)


def raw_rebase(git: Git, onto: str = "v0.5.23", upstream: str = "v0.5.22", resolve=None) -> int:
    """git rebase --onto ONTO UPSTREAM, continuing at every stop; returns the number of stops.
    ``resolve(git)`` stages a resolution where rerere did not (training)."""
    proc = git.run(*RERERE, "rebase", "--onto", onto, upstream, check=False)
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
        entry = g.out("log", "-1", f"--format=%(trailers:key={ENTRY},valueonly)", "REBASE_HEAD").strip()
        commit = reference.out("log", "-1", "--format=%H", f"--grep=^{ENTRY}: {entry}$")
        for path in g.out("diff", "--name-only", "--diff-filter=U").split():
            (g.worktree / path).write_bytes(reference.blob(commit, path))
            g.run("add", "--", path)

    raw_rebase(git, resolve=resolve)
    return Path(git.out("rev-parse", "--absolute-git-dir")) / "rr-cache"


def main() -> int:
    args = parser("rebase").parse_args()
    series = default_series_root()
    work = Path(tempfile.mkdtemp(prefix="bench-rebase-"))
    try:
        repo = mirror(work)
        rr_cache = trained_rr_cache(repo, work, series)

        def prepare(i: int) -> None:
            git = applied(repo, work / f"raw{i}", series, "v0.5.22")
            shutil.copytree(rr_cache, Path(git.out("rev-parse", "--absolute-git-dir")) / "rr-cache")
            applied(repo, work / f"ours{i}", series, "v0.5.22")

        figures, last = interleaved({
            "raw: git rebase + trained rerere, --continue at each stop": lambda i: raw_rebase(
                Git(worktree=work / f"raw{i}")),
            "c128patch rebase --onto v0.5.23 (replay, proof, contract)": lambda i: c128patch(
                "rebase", "--onto", "v0.5.23", "--tree", str(work / f"ours{i}"), "--series", str(series))},
            args.runs, prepare)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    raw, ours = figures
    r = ratio(figures, ours, raw)
    table(figures)
    record = {"runs": args.runs, "figures": figures, "ratios": {"rebase / raw": r},
              "targets": [target("rebase / raw", r["cpu"], TARGET_CPU, "cpu")],
              # README's figures (c128patch.evidence.figures)
              "rebase": "v0.5.22 -> v0.5.23", "raw_git_rebase_rerere_s": figures[raw]["wall"]["median"],
              "raw_git_stops": last[raw], "rebase_s": figures[ours]["wall"]["median"], "ratio": r["wall"]}
    return int(append(args.out, record, revs=("v0.5.22", "v0.5.23"))["missed"])


if __name__ == "__main__":
    raise SystemExit(main())
