#!/usr/bin/env python3
"""What issue 36's trust rules cost the common path: `apply` and `check` as whole CLI processes, the code of
BASE (default 0d24fe4, the last commit before issue 36's first change) against this checkout's, each with its
own series, on one bare mirror of the release history; A (this code) and B (BASE) in turn, N pairs, the ratio
taken pair by pair. Target: apply and check within 5 % of BASE (median of the paired wall ratios <= 1.05).
check runs over the 4 releases and 16 synthetic upstream commits on v0.5.23 (bench_growth.synthetic).
  python ci/bench/bench_trust_cost.py [--runs 7] [--base REV] [--out ci/bench/results/trust_cost.json]
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_growth import synthetic
from benchlib import append, interleaved, mirror, parser, table, target

from c128patch.git import Git
from c128patch.series.manifest import default_series_root, load_series
from c128patch.series.plan import plan

BASE = "0d24fe4"
TARGET = 1.05
SYNTHETIC = 16
REPO = Path(__file__).resolve().parents[2]


def cli(tooling: Path | None, *args: str) -> None:
    """``c128patch ARGS`` in a fresh process, from ``tooling`` (None: this checkout's)."""
    env = {**os.environ, "PYTHONPATH": str(tooling)} if tooling else dict(os.environ)
    proc = subprocess.run([sys.executable, "-m", "c128patch", *args], capture_output=True, text=True, env=env,
                          cwd=tempfile.gettempdir())
    if proc.returncode != 0:
        raise SystemExit(f"c128patch {' '.join(args)} ({tooling or 'this checkout'}) failed: {proc.stderr[-2000:]}")


def paired(figures: dict, a: str, b: str) -> dict:
    """A/B per pair (wall and CPU): median, min, max."""
    out = {}
    for on in ("wall", "cpu"):
        r = [x / y for x, y in zip(figures[a][f"runs_{on}"], figures[b][f"runs_{on}"])]
        out[on] = {"median": round(statistics.median(r), 3), "min": round(min(r), 3), "max": round(max(r), 3)}
    return out


def main() -> int:
    ap = parser("trust_cost", runs=7)
    ap.add_argument("--base", default=BASE)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-trust-"))
    try:
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--quiet", "--detach", str(work / "base"),
                        args.base], check=True)
        import compileall  # as benchlib.compiled does for this checkout

        compileall.compile_dir(work / "base" / "tooling" / "c128patch", quiet=1)
        base = work / "base" / "tooling"
        repo = mirror(work)
        git = Git(git_dir=repo)
        synthetic(repo, plan(load_series(default_series_root()), git, git.rev_parse("v0.5.23")), SYNTHETIC)
        revs = [a for r in ("v0.5.20", "v0.5.21", "v0.5.22", "v0.5.23",
                            *(f"syn-{i}" for i in range(1, SYNTHETIC + 1))) for a in ("--sglang-rev", r)]
        apply = ("apply", "--sglang-rev", "v0.5.23", "--repo", str(repo), "--tree")
        names = {"apply, this code": None, f"apply, {args.base}": base}
        cases = {name: (lambda i, t=tooling, n=n: cli(t, *apply, str(work / f"tree-{n}-{i}")))
                 for n, (name, tooling) in enumerate(names.items())}
        cases |= {f"check, {len(revs) // 2} revs, {args.base}": lambda i: cli(base, "check", "--repo", str(repo),
                                                                             *revs),
                  f"check, {len(revs) // 2} revs, this code": lambda i: cli(None, "check", "--repo", str(repo), *revs)}
        # (apply: this code first in each round; check: the base first)
        figures, _ = interleaved(cases, args.runs, children_only=True)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(work / "base")],
                       capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    table(figures)
    names = list(figures)
    ratios = {"apply: this code / base": paired(figures, names[0], names[1]),
              "check: this code / base": paired(figures, names[3], names[2])}
    for what, r in ratios.items():
        print(f"{what}: wall {r['wall']['median']:.3f} [{r['wall']['min']:.3f}-{r['wall']['max']:.3f}], "
              f"CPU {r['cpu']['median']:.3f}")
    record = {"runs": args.runs, "base": args.base, "figures": figures,
              "ratios": {what: {on: r[on]["median"] for on in r} for what, r in ratios.items()},
              "paired_ratios": ratios,  # (median, min, max of the pairs' ratios)
              "targets": [target(what, r["wall"]["median"], TARGET) for what, r in ratios.items()]}
    return int(append(args.out, record, revs=("v0.5.23",))["missed"])


if __name__ == "__main__":
    raise SystemExit(main())
