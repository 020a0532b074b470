#!/usr/bin/env python3
"""`verify-wheel` time on the product series' patched sglang wheel, recorded per code version.

  python ci/bench/bench_verify_wheel.py --against OLD_TOOLING [--reps 5] [--out ci/bench/results/verify_wheel.json]
  python ci/bench/bench_verify_wheel.py --label before --tooling DIR [--reps 5]

Each timing is the CLI in a fresh process with ``PYTHONPATH`` set to one code version's ``tooling/``
folder, on the same patched wheel (built once, not timed, by this checkout). ``--against DIR`` (e.g.
a ``git archive`` of main before the change) runs the old and this checkout's code alternately in
one run, rows ``before`` and ``after`` (side by side: the machine's load hits both alike);
``--label`` times one version and keeps the other rows. With both rows the JSON gets their ratio
(target: after <= 2x before).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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


def cli(tooling: Path, *args: str) -> tuple[float, float, subprocess.CompletedProcess]:
    """(wall s, CPU s of the process and its children, the process)."""
    env = {**os.environ, "PYTHONPATH": str(tooling)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "c128patch", *args], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", default=None, help="row name, e.g. before / after")
    ap.add_argument("--against", type=Path, default=None, help="the old tooling/ folder: before and after alternately")
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
        _, _, built = cli(HERE_TOOLING, "wheel", "--from-release", args.version, "--series", str(series.root),
                       "-o", str(work), "--json")
        if built.returncode != 0:
            raise SystemExit(f"c128patch wheel failed: {built.stderr.strip()}")
        patched = json.loads(built.stdout)["wheel"]
        versions = ({"before": args.against.resolve(), "after": HERE_TOOLING} if args.against
                    else {args.label or "after": args.tooling.resolve()})
        runs: dict[str, list[float]] = {label: [] for label in versions}
        cpus: dict[str, list[float]] = {label: [] for label in versions}
        for _ in range(args.reps):
            for label, tooling in versions.items():
                took, cpu, proc = cli(tooling, "verify-wheel", patched, "--series", str(series.root), "--json")
                if proc.returncode != 0:
                    raise SystemExit(f"verify-wheel ({label}) failed: {proc.stderr.strip()}")
                runs[label].append(took)
                cpus[label].append(cpu)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc = json.loads(args.out.read_text()) if args.out.is_file() else {}
    for label, tooling in versions.items():
        doc.setdefault("rows", {})[label] = {
            "tooling": str(tooling),
            "upstream_wheel": Path(wheel_for(args.version)).name,
            "series": f"{series.name} {series.version} ({len(series.entries)} entries)",
            "reps": args.reps,
            "interleaved": bool(args.against),
            "verify_wheel_cli_s": round(statistics.median(runs[label]), 2),
            "runs_s": [round(t, 2) for t in runs[label]],
            "verify_wheel_cpu_s": round(statistics.median(cpus[label]), 2),  # less sensitive to the load
            "machine": machine(),
        }
    rows = doc["rows"]
    if "before" in rows and "after" in rows:
        ratio = rows["after"]["verify_wheel_cli_s"] / rows["before"]["verify_wheel_cli_s"]
        doc["after_over_before"] = round(ratio, 2)
        doc["after_over_before_cpu"] = round(
            rows["after"]["verify_wheel_cpu_s"] / rows["before"]["verify_wheel_cpu_s"], 2)
        doc["target"] = "after <= 2x before"
        doc["within_target"] = ratio <= 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{'label':10} {'wall s (median)':>16} {'CPU s (median)':>16}")
    for label, row in rows.items():
        print(f"{label:10} {row['verify_wheel_cli_s']:16.2f} {row.get('verify_wheel_cpu_s', float('nan')):16.2f}")
    if "after_over_before" in doc:
        print(f"after / before: {doc['after_over_before']} (wall), {doc['after_over_before_cpu']} (CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
