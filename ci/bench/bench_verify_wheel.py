#!/usr/bin/env python3
"""`verify-wheel` time on the product series' patched sglang wheel, recorded per code version.

  python ci/bench/bench_verify_wheel.py --against OLD_TOOLING [--runs 3] [--out ci/bench/results/verify_wheel.json]
  python ci/bench/bench_verify_wheel.py --label before --tooling DIR [--runs 3]

Each timing is the CLI in a fresh process with ``PYTHONPATH`` set to one code version's ``tooling/``
folder, on the same patched wheel (built once, not timed, by this checkout). ``--against DIR`` (e.g.
a ``git archive`` of main before the change) runs the old and this checkout's code interleaved in
one run, rows ``before`` and ``after``; ``--label`` times one version and keeps the other rows. With
both rows the record gets their ratio (target: after <= 2x before, wall).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import append, c128patch, interleaved, parser, table, target

from c128patch.series.manifest import default_series_root, load_series
from c128patch.upstream.releases import ReleaseHistory, wheel_for

HERE_TOOLING = Path(__file__).resolve().parents[2] / "tooling"


def verify(tooling: Path, wheel: str, series: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "c128patch", "verify-wheel", wheel, "--series", str(series), "--json"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tooling)})
    if proc.returncode != 0:
        raise SystemExit(f"verify-wheel ({tooling}) failed: {proc.stderr.strip()}")


def main() -> int:
    ap = parser("verify_wheel")
    ap.add_argument("--label", default=None, help="row name, e.g. before / after")
    ap.add_argument("--against", type=Path, default=None, help="the old tooling/ folder: before and after alternately")
    ap.add_argument("--tooling", type=Path, default=HERE_TOOLING, help="the tooling/ folder of the code to time")
    ap.add_argument("--version", default="0.5.23")
    args = ap.parse_args()
    series = load_series(default_series_root())
    ReleaseHistory().ensure([args.version])
    upstream = Path(wheel_for(args.version))  # the upstream wheel in the cache (what the check compares with)
    versions = ({"before": args.against.resolve(), "after": HERE_TOOLING} if args.against
                else {args.label or "after": args.tooling.resolve()})
    work = Path(tempfile.mkdtemp(prefix="bench-verify-"))
    try:
        wheel = json.loads(c128patch("wheel", "--from-release", args.version, "--series", str(series.root),
                                     "-o", str(work)).stdout)["wheel"]
        figures, _ = interleaved({label: lambda i, t=tooling: verify(t, wheel, series.root)
                                  for label, tooling in versions.items()}, args.runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    old = json.loads(Path(args.out).read_text()) if Path(args.out).is_file() else {}
    rows = {**old.get("rows", {}), **{label: {
        "tooling": str(tooling), "upstream_wheel": upstream.name, "runs": args.runs, "interleaved": bool(args.against),
        "series": f"{series.name} {series.version} ({len(series.entries)} entries)",
        "verify_wheel_cli_s": figures[label]["wall"]["median"], "verify_wheel_cpu_s": figures[label]["cpu"]["median"]}
        for label, tooling in versions.items()}}
    table(figures)
    record = {"runs": args.runs, "figures": figures, "rows": rows, "targets": []}
    if "before" in rows and "after" in rows:
        after, before = rows["after"], rows["before"]
        wall = after["verify_wheel_cli_s"] / before["verify_wheel_cli_s"]
        record.update(after_over_before=round(wall, 2), targets=[target("verify-wheel after / before", wall, 2.0)],
                      after_over_before_cpu=round(after["verify_wheel_cpu_s"] / before["verify_wheel_cpu_s"], 2))
    return int(append(args.out, record)["missed"])


if __name__ == "__main__":
    raise SystemExit(main())
