#!/usr/bin/env python3
"""`verify-wheel` time on the product series' patched sglang wheel, recorded per code version.

  python ci/bench/bench_verify_wheel.py --label before [--tooling DIR] [--reps 5] [--out ci/bench/results/verify_wheel.json]

Old and new code cannot run side by side in one process once the check changed, so each run times
the CLI of one code version (``--tooling DIR``: that version's ``tooling/`` folder, e.g. a
``git archive`` of main before the change; default: this checkout) on the same patched wheel and
writes its row under ``--label`` into the JSON, keeping the other labels' rows. With both
``before`` and ``after`` present the JSON gets their ratio (target: after <= 2x before).
The patched wheel is built once (not timed) with this checkout's ``c128patch wheel``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import machine

from c128patch.series.manifest import default_series_root, load_series
from c128patch.upstream.releases import ReleaseHistory, wheel_for

HERE_TOOLING = Path(__file__).resolve().parents[2] / "tooling"


def cli(tooling: Path, *args: str) -> tuple[float, subprocess.CompletedProcess]:
    env = {**os.environ, "PYTHONPATH": str(tooling)}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "c128patch", *args], capture_output=True, text=True, env=env)
    return time.perf_counter() - start, proc


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", required=True, help="row name, e.g. before / after")
    ap.add_argument("--tooling", type=Path, default=HERE_TOOLING, help="the tooling/ folder of the code to time")
    ap.add_argument("--version", default="0.5.23")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "verify_wheel.json")
    args = ap.parse_args()
    series = load_series(default_series_root())
    ReleaseHistory().ensure([args.version])
    wheel_for(args.version)  # the upstream wheel in the cache (what the new check compares with)
    work = Path(tempfile.mkdtemp(prefix="bench-verify-"))
    try:
        _, built = cli(HERE_TOOLING, "wheel", "--from-release", args.version, "--series", str(series.root),
                       "-o", str(work), "--json")
        if built.returncode != 0:
            raise SystemExit(f"c128patch wheel failed: {built.stderr.strip()}")
        patched = json.loads(built.stdout)["wheel"]
        runs = []
        for _ in range(args.reps):
            took, proc = cli(args.tooling.resolve(), "verify-wheel", patched, "--series", str(series.root), "--json")
            if proc.returncode != 0:
                raise SystemExit(f"verify-wheel failed: {proc.stderr.strip()}")
            runs.append(took)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc = json.loads(args.out.read_text()) if args.out.is_file() else {}
    doc.setdefault("rows", {})[args.label] = {
        "tooling": str(args.tooling),
        "upstream_wheel": Path(wheel_for(args.version)).name,
        "series": f"{series.name} {series.version} ({len(series.entries)} entries)",
        "reps": args.reps,
        "verify_wheel_cli_s": round(statistics.median(runs), 2),
        "runs_s": [round(t, 2) for t in runs],
        "machine": machine(),
    }
    rows = doc["rows"]
    if "before" in rows and "after" in rows:
        ratio = rows["after"]["verify_wheel_cli_s"] / rows["before"]["verify_wheel_cli_s"]
        doc["after_over_before"] = round(ratio, 2)
        doc["target"] = "after <= 2x before"
        doc["within_target"] = ratio <= 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{'verify-wheel (median, s)':40} {'label':>10}")
    for label, row in rows.items():
        print(f"{row['verify_wheel_cli_s']:<40} {label:>10}")
    if "after_over_before" in doc:
        print(f"after / before: {doc['after_over_before']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
