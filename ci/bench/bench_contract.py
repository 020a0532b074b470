#!/usr/bin/env python3
"""The API contract's cost: the check over the whole series on one patched tree (target <= 2 s), per
supported release, and `watch` on an unchanged release in three modes interleaved in one run: without
the contract and the behavioural tier, with the contract alone (watch before the tier joined it), and
with both (today's watch); targets: contract / neither <= 1.5x, both / contract alone <= 1.5x. The
nvcc signature probe is timed on its own, cold (its result is cached by the headers' tree id, so an
unchanged upstream compiles it once).
  python ci/bench/bench_contract.py [--pairs 3] [--out ci/bench/results/contract.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchlib import machine, write_json

from c128patch.fit import contract, contract_cxx, treecheck
from c128patch.fit import watch as watch_ops
from c128patch.git import Git
from c128patch.series.manifest import default_series_root, load_series
from c128patch.upstream.releases import ReleaseHistory

RELEASES = ["v0.5.20", "v0.5.21", "v0.5.22", "v0.5.23"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    series = load_series(default_series_root())
    git = Git(git_dir=ReleaseHistory().ensure())
    per_rev = {}
    for rev in RELEASES:
        commit = git.rev_parse(rev)
        tree = contract.patched_tree(series, git, rev, commit)
        runs = []
        for _ in range(5):
            start = time.perf_counter()
            result = contract.check(series, git, commit, tree)
            runs.append(time.perf_counter() - start)
        per_rev[rev] = {"median_s": statistics.median(runs), "max_s": max(runs), "ok": result.ok,
                        "definitions": len({(i.kind, i.target) for i in result.items}), "uses": len(result.items)}
    commit = git.rev_parse("v0.5.23")
    tree = contract.patched_tree(series, git, "v0.5.23", commit)
    start = time.perf_counter()
    probe_ok, probe_line = contract_cxx.probe(series.root, git, tree)
    probe_s = time.perf_counter() - start

    real = {name: getattr(watch_ops.Watch, name) for name in ("_contract", "_start_tier", "_finish_tier")}
    off = {"_contract": lambda self, *a: None, "_start_tier": lambda self, *a: None,
           "_finish_tier": lambda self, p: None}
    modes = {"neither": ("_contract", "_start_tier", "_finish_tier"), "contract": ("_start_tier", "_finish_tier"),
             "both": ()}
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    outcomes = set()
    start = time.perf_counter()
    tier = treecheck.run_rev(series, git, "v0.5.23", commit)
    tier_s = time.perf_counter() - start
    for _ in range(args.pairs):
        for mode, disabled in modes.items():
            for name, fn in real.items():
                setattr(watch_ops.Watch, name, off[name] if name in disabled else fn)
            with tempfile.TemporaryDirectory() as out:
                start = time.perf_counter()
                report = watch_ops.watch(series, None, "v0.5.23", Path(out) / "w")
                times[mode].append(time.perf_counter() - start)
                outcomes.add((mode, report["outcome"]))
    for name, fn in real.items():
        setattr(watch_ops.Watch, name, fn)
    median = {mode: statistics.median(t) for mode, t in times.items()}
    ratio = median["contract"] / median["neither"]
    tier_ratio = median["both"] / median["contract"]
    row = {"contract_per_release": per_rev, "contract_max_median_s": max(r["median_s"] for r in per_rev.values()),
           "nvcc_probe_cold_s": round(probe_s, 2), "nvcc_probe": probe_line, "nvcc_probe_ok": probe_ok,
           "treecheck_v0_5_23_s": round(tier_s, 2), "treecheck_v0_5_23": tier.verdict(),
           "watch_unchanged_without_contract_s": times["neither"], "watch_unchanged_with_contract_s": times["contract"],
           "watch_unchanged_with_contract_and_tier_s": times["both"],
           "watch_ratio_median": ratio, "watch_tier_ratio_median": tier_ratio,
           "watch_outcomes": sorted(f"{m}: {o}" for m, o in outcomes),
           "series_version": series.version, "machine": machine()}
    print(f"{'what':52} {'seconds':>8}")
    for rev, r in per_rev.items():
        print(f"{'contract, whole series, ' + rev:52} {r['median_s']:8.3f}  ({r['definitions']} definitions, "
              f"{r['uses']} uses; target <= 2 s)")
    print(f"{'nvcc signature probe, cold (v0.5.23)':52} {probe_s:8.2f}  {probe_line}")
    print(f"{'behavioural tier alone, v0.5.23 (replay + unpack)':52} {tier_s:8.2f}  {tier.verdict()}")
    print(f"{'watch v0.5.23 (unchanged), neither contract nor tier':52} {median['neither']:8.2f}")
    print(f"{'watch v0.5.23 (unchanged), the contract (probe cached)':52} {median['contract']:8.2f}  "
          f"ratio {ratio:.2f} to neither (target <= 1.5)")
    print(f"{'watch v0.5.23 (unchanged), contract and tier':52} {median['both']:8.2f}  "
          f"ratio {tier_ratio:.2f} to the contract alone (target <= 1.5)")
    write_json(args.out, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
