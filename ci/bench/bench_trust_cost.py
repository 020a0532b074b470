#!/usr/bin/env python3
"""What issue 36's trust rules cost the common path: `apply` and `check` as whole CLI processes, the code of
BASE (default 0d24fe4, the last commit before issue 36's first change) against this checkout's, each with its
own series, on one bare mirror of the release history; A (this code) and B (BASE) in turn, N pairs, the ratio
taken pair by pair. check runs over the 4 releases and 16 synthetic upstream commits on v0.5.23
(bench_growth.synthetic).

Target: apply and check within 5 % of BASE, decided on CPU seconds (user + sys of the CLI process and every git
it waits for): the median of the paired CPU ratios <= 1.05. CPU, named before any run, because on the shared
2-core machine wall time is mostly other processes' scheduling and file-system I/O (git checkout writes ~3,700
files), which is neither side's code; wall is reported beside it. So that the ratio can decide, the noise the
bench can remove is removed on both sides alike: the base's worktree, the mirror and every tree on tmpfs
(/dev/shm when it has room: no disk I/O, said in the record as "work_on"), each tree removed untimed, WARMUP
untimed rounds of every case first (bytecode, page cache, the mirror's packs), the order alternated pair by pair
(ABBA); and a distribution-free 95 % interval of the median pair ratio (order statistics) is recorded with a
verdict: met (the interval's top <= 1.05), missed (its bottom > 1.05) or undecided.
  python ci/bench/bench_trust_cost.py [--runs 30] [--warmup 2] [--base REV] [--out ci/bench/results/trust_cost.json]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_growth import synthetic
from benchlib import append, interleaved, mirror, paired, parser, table, target, verdict

from c128patch.git import Git
from c128patch.series.manifest import default_series_root, load_series
from c128patch.series.plan import plan

BASE = "0d24fe4"
TARGET = 1.05
ROOM = 4 << 30  # bytes free on /dev/shm to put the work there (the mirror, two tooling trees, two sglang trees)
SYNTHETIC = 16
REPO = Path(__file__).resolve().parents[2]


def cli(tooling: Path | None, *args: str) -> None:
    """``c128patch ARGS`` in a fresh process, from ``tooling`` (None: this checkout's)."""
    env = {**os.environ, "PYTHONPATH": str(tooling)} if tooling else dict(os.environ)
    proc = subprocess.run([sys.executable, "-m", "c128patch", *args], capture_output=True, text=True, env=env,
                          cwd=tempfile.gettempdir())
    if proc.returncode != 0:
        raise SystemExit(f"c128patch {' '.join(args)} ({tooling or 'this checkout'}) failed: {proc.stderr[-2000:]}")


def workspace() -> tuple[Path, str]:
    """A scratch folder on tmpfs where /dev/shm has ROOM, else in $TMPDIR; and what it is on, for the record."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free >= ROOM:
        return Path(tempfile.mkdtemp(prefix="bench-trust-", dir=shm)), f"tmpfs {shm}"
    work = Path(tempfile.mkdtemp(prefix="bench-trust-"))
    return work, f"{work.parent} (not tmpfs: /dev/shm missing or under {ROOM >> 30} GiB free)"


def main() -> int:
    ap = parser("trust_cost", runs=30)
    ap.add_argument("--base", default=BASE)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    load_before = [round(x, 2) for x in os.getloadavg()]
    work, work_on = workspace()
    print(f"work on {work_on}: {work}; load before {load_before}", flush=True)
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
        trees = work / "trees"

        def clear(i: int) -> None:  # the last round's trees, untimed
            shutil.rmtree(trees, ignore_errors=True)
            trees.mkdir()

        cases = {name: (lambda i, t=tooling, n=n: cli(t, *apply, str(trees / f"tree-{n}-{i}")))
                 for n, (name, tooling) in enumerate(names.items())}
        cases |= {f"check, {len(revs) // 2} revs, {args.base}": lambda i: cli(base, "check", "--repo", str(repo),
                                                                             *revs),
                  f"check, {len(revs) // 2} revs, this code": lambda i: cli(None, "check", "--repo", str(repo), *revs)}
        # (apply: this code first in even rounds; check: the base first; reversed in odd rounds)
        figures, _ = interleaved(cases, args.runs, clear, children_only=True, alternate=True, warmup=args.warmup)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(work / "base")],
                       capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    table(figures)
    names = list(figures)
    ratios = {"apply: this code / base": paired(figures, names[0], names[1]),
              "check: this code / base": paired(figures, names[3], names[2])}
    targets = []
    for what, r in ratios.items():
        print(f"{what}: CPU {r['cpu']['median']:.3f} (95 % {r['cpu']['ci95'][0]:.3f}-{r['cpu']['ci95'][1]:.3f}; "
              f"pairs {r['cpu']['min']:.3f}-{r['cpu']['max']:.3f}), wall {r['wall']['median']:.3f} "
              f"(95 % {r['wall']['ci95'][0]:.3f}-{r['wall']['ci95'][1]:.3f}; pairs {r['wall']['min']:.3f}-"
              f"{r['wall']['max']:.3f}): {verdict(r['cpu']['ci95'], TARGET)} on CPU")
        targets.append({**target(what, r["cpu"]["median"], TARGET, on="cpu"), "ci95": r["cpu"]["ci95"],
                        "verdict": verdict(r["cpu"]["ci95"], TARGET)})
    record = {"runs": args.runs, "warmup": args.warmup, "base": args.base, "work_on": work_on,
              "load_before": load_before, "order": "alternated pair by pair (ABBA)", "figures": figures,
              "ratios": {what: {on: r[on]["median"] for on in ("wall", "cpu")} for what, r in ratios.items()},
              "paired_ratios": ratios,  # (median, min, max and the median's 95 % interval of the pairs' ratios)
              "targets": targets}
    return int(append(args.out, record, revs=("v0.5.23",))["missed"])


if __name__ == "__main__":
    raise SystemExit(main())
