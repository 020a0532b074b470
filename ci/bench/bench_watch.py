#!/usr/bin/env python3
"""watch --onto v0.5.23 --no-run (the series unchanged: it carries at its own base, tier excluded) vs apply
--sglang-rev v0.5.23 on the same mirror of the release history: N paired runs, interleaved; target watch
<= 3x apply in wall time (issue 35).
  python ci/bench/bench_watch.py [--runs 3] [--out ci/bench/results/watch.json]
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from benchlib import append, c128patch, interleaved, mirror, parser, ratio, table, target

from c128patch.series.manifest import default_series_root, load_series

TARGET = 3.0


def main() -> int:
    args = parser("watch").parse_args()
    series = load_series(default_series_root())
    work = Path(tempfile.mkdtemp(prefix="bench-watch-"))
    try:
        repo = mirror(work)
        figures, last = interleaved({
            "c128patch apply --sglang-rev v0.5.23": lambda i: c128patch(
                "apply", "--sglang-rev", "v0.5.23", "--repo", str(repo), "--tree", str(work / f"apply{i}"),
                "--series", str(series.root)),
            "c128patch watch --onto v0.5.23 --no-run": lambda i: c128patch(
                "watch", "--onto", "v0.5.23", "--no-run", "--repo", str(repo), "--out", str(work / f"watch{i}"),
                "--series", str(series.root), check=False)}, args.runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    apply, watch = figures
    outcome = json.loads(last[watch].stdout or "{}").get("outcome", "?")
    if outcome not in ("clean", "unchecked"):  # the series is unchanged on its own base: nothing else is right
        raise SystemExit(f"watch said {outcome}: {last[watch].stderr.strip()[-2000:]}")
    r = ratio(figures, watch, apply)
    table(figures)
    record = {"runs": args.runs, "entries": len(series.entries), "outcome": outcome, "figures": figures,
              "ratios": {"watch --no-run / apply": r}, "targets": [target("watch --no-run / apply", r["wall"], TARGET)]}
    return int(append(args.out, record, revs=("v0.5.23",))["missed"])


if __name__ == "__main__":
    raise SystemExit(main())
