#!/usr/bin/env python3
"""The behavioural tier with its scenarios (``fit.treecheck.run``) on the series applied to v0.5.23, its
environment the cached one ``fit.env`` builds from the committed lock (built first if missing: that build is
reported apart, never timed with the tier). N runs (default 3): wall and CPU median/min/max; target <= 60 s wall
per tree (issue 38), exit 1 over it. The profile beside it: the tier interpreter's `import torch` alone (the
runner imports it once, before forking a child per gate state), each gate state's scenarios (their own
``seconds``), and the rest (the sealed box, the tree's imports, the static import check).
  python ci/bench/bench_tier.py [--runs 3] [--out ci/bench/results/tier.json]
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from benchlib import append, interleaved, parser, spread, table, target

from c128patch.fit import env, treecheck
from c128patch.fit.contract import patched_tree
from c128patch.fit.resolve import PY_ROOT
from c128patch.series.manifest import default_series_root, load_series
from c128patch.upstream.releases import ReleaseHistory

TARGET_S = 60.0
REV = "v0.5.23"


def main() -> int:
    args = parser("tier").parse_args()
    series = load_series(default_series_root())
    started = time.perf_counter()
    python = str(env.build((series.root / "patches" / "env" / f"{REV}.lock").read_text(), env.cuda_only(series))[0])
    env_s = time.perf_counter() - started  # a lookup when cached
    git = ReleaseHistory().git
    base = git.rev_parse(REV)
    head = patched_tree(series, git, REV, base)
    work = Path(tempfile.mkdtemp(prefix="bench-tier-"))
    try:
        git.extract(head, f"{PY_ROOT}/sglang", work)
        paths = git.changed_files(base, head)
        name = f"treecheck with scenarios, {REV} patched"
        figures, last = interleaved({name: lambda i: treecheck.run(series, work, paths, python=python)}, args.runs,
                                    children_only=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = last[name]
    if not result.checked or result.failed:
        raise SystemExit(f"the tier did not pass on {REV}: {result.verdict()}")
    torch_s = []
    for _ in range(args.runs):
        t = time.perf_counter()
        subprocess.run([python, "-I", "-c", "import torch"], check=True)
        torch_s.append(time.perf_counter() - t)
    scenarios = {t.gates: {n: s.get("seconds") for n, s in t.scenarios.items()} for t in result.tiers}
    table(figures)
    record = {"runs": args.runs, "figures": figures, "environment_build_s": round(env_s, 3),
              "profile": {"import torch (s)": spread(torch_s), "scenarios, last run (s)": scenarios},
              "targets": [target(f"tier with scenarios on {REV} (s)", figures[name]["wall"]["median"], TARGET_S)]}
    return int(append(args.out, record, revs=(REV,))["missed"])


if __name__ == "__main__":
    raise SystemExit(main())
