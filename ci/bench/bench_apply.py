#!/usr/bin/env python3
"""apply vs raw git (worktree add + am -3 of the same files, a commit per overlay) on the real 0.5.23
tree: N paired runs, interleaved, the order reversed every other pair (ABBA), one untimed warm-up pair first;
target apply <= 1.3x raw in wall time (issue 35), on the median of the pairs' ratios, recorded with its
distribution-free 95 % interval and a verdict (met: the interval's top <= 1.3; missed: its bottom > 1.3;
else undecided). The ratio of the medians stays beside it ("ratios", README's figure).
  python ci/bench/bench_apply.py [--runs 15] [--out ci/bench/results/apply.json]
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from benchlib import append, c128patch, interleaved, mirror, paired, parser, ratio, table, target, verdict

from c128patch.git import Git
from c128patch.series.manifest import default_series_root, load_series
from c128patch.series.plan import plan

TARGET = 1.3


def raw_git(repo: Path, dest: Path, items: list, rev: str = "v0.5.23") -> None:
    """What a maintainer would type: a worktree, then git am -3 and a commit per overlay."""
    Git(git_dir=repo).run("worktree", "add", "--quiet", "-B", f"raw-{dest.name}", str(dest), rev)
    wt = Git(worktree=dest)
    for item in items:
        if item.patch is not None:
            wt.run("am", "-3", "--quiet", str(item.path))
        else:
            (dest / item.entry.target).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(item.path, dest / item.entry.target)
            wt.run("add", item.entry.target)
            wt.run("commit", "--quiet", "-m", f"add {item.entry.target}")


def main() -> int:
    args = parser("apply", runs=15).parse_args()
    series = load_series(default_series_root())
    work = Path(tempfile.mkdtemp(prefix="bench-apply-"))
    try:
        repo = mirror(work)
        items = plan(series, Git(git_dir=repo), Git(git_dir=repo).rev_parse("v0.5.23"))
        figures, _ = interleaved({
            "raw: git worktree add + git am -3": lambda i: raw_git(repo, work / f"raw{i}", items),
            "c128patch apply --sglang-rev v0.5.23": lambda i: c128patch(
                "apply", "--sglang-rev", "v0.5.23", "--repo", str(repo), "--tree", str(work / f"ours{i}"),
                "--series", str(series.root))}, args.runs, alternate=True, warmup=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    raw, ours = figures
    r, pairs = ratio(figures, ours, raw), paired(figures, ours, raw)
    table(figures)
    w = pairs["wall"]
    print(f"apply / raw pair by pair: wall {w['median']:.3f} (95 % {w['ci95'][0]:.3f}-{w['ci95'][1]:.3f}; pairs "
          f"{w['min']:.3f}-{w['max']:.3f}): {verdict(w['ci95'], TARGET)}; CPU {pairs['cpu']['median']:.3f}")
    record = {"runs": args.runs, "warmup": 1, "order": "alternated pair by pair (ABBA)", "entries": len(series.entries),
              "figures": figures, "ratios": {"apply / raw": r}, "paired_ratios": {"apply / raw": pairs},
              "targets": [{**target("apply / raw, pair by pair", w["median"], TARGET), "ci95": w["ci95"],
                           "verdict": verdict(w["ci95"], TARGET)}],
              # README's figures (c128patch.evidence.figures)
              "raw_git_s": figures[raw]["wall"]["median"], "apply_s": figures[ours]["wall"]["median"],
              "ratio": r["wall"]}
    return int(append(args.out, record, revs=("v0.5.23",))["missed"])


if __name__ == "__main__":
    raise SystemExit(main())
