#!/usr/bin/env python3
"""apply with one layer of 3 entries (docs/examples/acme-layer) vs apply without it, on the real 0.5.23 tree.

One paired run: the two whole CLI applies (proof included) interleaved, median of --reps each, the
ratio of the medians (target <= 1.2). Prints a table and writes JSON (--out).
  python ci/bench/bench_layers.py [--reps 5] [--out ci/bench/results/layers.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import machine, write_json

from c128patch.series.layers import stack
from c128patch.series.manifest import default_series_root, load_series
from c128patch.upstream.releases import ReleaseHistory

LAYER = Path(__file__).resolve().parents[2] / "docs" / "examples" / "acme-layer"
TARGET = 1.2


def apply(repo: Path, dest: Path, series_root: Path, layers: list[Path]) -> float:
    argv = [sys.executable, "-m", "c128patch", "apply", "--sglang-rev", "v0.5.23", "--repo", str(repo),
            "--tree", str(dest), "--series", str(series_root), *[a for l in layers for a in ("--layer", str(l))],
            "--json"]
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True)
    took = time.perf_counter() - start
    if proc.returncode != 0 or not json.loads(proc.stdout)["equivalence"]["identical"]:
        raise SystemExit(f"apply failed: {proc.stderr}")
    return took


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    series = load_series(default_series_root())
    layered = stack(series, [LAYER])
    releases = ReleaseHistory().ensure()
    work = Path(tempfile.mkdtemp(prefix="bench-layers-"))
    try:
        repo = work / "mirror.git"  # a bare clone stands for the user's mirror; both sides read the same objects
        subprocess.run(["git", "clone", "--quiet", "--bare", str(releases), str(repo)], check=True)
        plain, with_layer = [], []
        for i in range(args.reps):  # interleaved, so drift in the machine hits both alike
            plain.append(apply(repo, work / f"plain{i}", series.root, []))
            with_layer.append(apply(repo, work / f"layer{i}", series.root, [LAYER]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    row = {
        "series_entries": len(series.entries),
        "layer": {"name": layered.layers[0].name, "version": layered.layers[0].version,
                  "entries": len(layered.layers[0].entries), "digest": layered.layers[0].digest()},
        "reps": args.reps,
        "apply_s": statistics.median(plain),
        "apply_with_layer_s": statistics.median(with_layer),
        "ratio": statistics.median(with_layer) / statistics.median(plain),
        "target": TARGET,
        "runs": {"apply_s": plain, "apply_with_layer_s": with_layer},
        "machine": machine(),
    }
    row["within_target"] = row["ratio"] <= TARGET
    print(f"{'what':52} {'seconds':>8}")
    print(f"{'c128patch apply --sglang-rev v0.5.23 (' + str(row['series_entries']) + ' entries)':52} "
          f"{row['apply_s']:8.3f}")
    print(f"{'  ... --layer docs/examples/acme-layer (+3 entries)':52} {row['apply_with_layer_s']:8.3f}")
    print(f"{'ratio with / without (target <= ' + str(TARGET) + ')':52} {row['ratio']:8.2f}")
    write_json(args.out, row, revs=("v0.5.23",))
    return 0 if row["within_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
