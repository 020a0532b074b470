#!/usr/bin/env python3
"""Evidence keys by content: the time to compute one release's key (target <= 0.5 s per release),
side by side with the plan it is made from, in the tool's release history and in a clone that looks
like upstream's (tests/upstream_like.py: other commit ids, folders beside python/), with the keys
compared (they must be equal).
  python ci/bench/bench_keys.py [--repeat 5] [--out ci/bench/results/keys.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchlib import machine, write_json

from c128patch.evidence.keys import key_for, planned_key
from c128patch.git import Git
from c128patch.series.manifest import default_series_root, load_series
from c128patch.series.plan import plan
from c128patch.upstream.releases import DEFAULT_RELEASES, ReleaseHistory, tag_for

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import upstream_like  # noqa: E402  (tests/upstream_like.py)

TARGET_S = 0.5


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    series = load_series(default_series_root())
    history = Git(git_dir=ReleaseHistory().ensure())
    rows = []
    with tempfile.TemporaryDirectory(prefix="c128bench-") as tmp:
        like = Git(git_dir=upstream_like.build(history.git_dir, Path(tmp) / "sglang.git"))
        for tag in map(tag_for, DEFAULT_RELEASES):
            row = {"release": tag}
            for name, git in (("history", history), ("upstream_like", like)):
                commit = git.rev_parse(tag) or ""
                planned = plan(series, git, commit)
                row[f"{name}_key_s"] = best(lambda: key_for(series, git, commit), args.repeat)
                row[f"{name}_plan_s"] = best(lambda: plan(series, git, commit), args.repeat)
                row[f"{name}_sources_s"] = best(lambda: planned_key(git, commit, planned), args.repeat)
            row["same_key"] = (key_for(series, history, history.rev_parse(tag) or "")
                               == key_for(series, like, like.rev_parse(tag) or ""))
            rows.append(row)
    worst = max(max(r["history_key_s"], r["upstream_like_key_s"]) for r in rows)
    out = {"target_s_per_release": TARGET_S, "worst_key_s": worst,
           "ok": worst <= TARGET_S and all(r["same_key"] for r in rows),
           "repeat": args.repeat, "releases": rows, "machine": machine()}
    print(f"{'release':9} {'key (history)':>14} {'of it: plan':>12} {'sources':>8} "
          f"{'key (upstream-like)':>20} same key")
    for r in rows:
        print(f"{r['release']:9} {r['history_key_s']:14.3f} {r['history_plan_s']:12.3f} {r['history_sources_s']:8.3f} "
              f"{r['upstream_like_key_s']:20.3f} {r['same_key']}")
    print(f"worst {worst:.3f} s per release (target <= {TARGET_S} s): {'ok' if out['ok'] else 'FAILED'}")
    write_json(args.out, out)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
