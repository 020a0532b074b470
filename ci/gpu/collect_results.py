#!/usr/bin/env python3
"""Turn what a GPU evidence call brought back into the committed per-release results.

  python ci/gpu/collect_results.py FETCHED_DIR [FETCHED_DIR ...] [--dest ci/gpu/results] [--date YYYY-MM-DD]

FETCHED_DIR holds <phase>.tgz and <phase>-run.json from ci/gpu/h200_run.py (the device tool's
files_at folder). Writes ci/gpu/results/<rev>/{suite,differential,simulation}.json (plain),
{memcheck,racecheck,initcheck,synccheck}.json (sanitizers), kernel-bench.json (bench) and
<rev>/before/suite.json (c128patch.evidence.results), each keyed by (upstream tree id, series hash)
as staged, with command, device, date and paths relative to the repository; then compares every
release's kernel-bench rows with the 0.5.23 run's (within 5 %: `vs_reference`). Then
`c128patch matrix` shows them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tooling"))

from c128patch.errors import C128Error  # noqa: E402
from c128patch.evidence.results import (  # noqa: E402
    BENCH_REFERENCE,
    collect_run,
    compare_bench,
    result_path,
    summarize,
    write_result,
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fetched", type=Path, nargs="+")
    ap.add_argument("--dest", type=Path, default=REPO / "ci" / "gpu" / "results")
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--allow-dry-run", action="store_true", help="collect a --dry-run bundle (plumbing checks only)")
    args = ap.parse_args()
    runs = [p for folder in args.fetched for p in sorted(folder.glob("*-run.json"))]
    if not runs:
        print(f"c128patch: error: no <phase>-run.json in {', '.join(map(str, args.fetched))}", file=sys.stderr)
        return 2
    try:
        for run_path in runs:
            run = json.loads(run_path.read_text())
            tgz = run_path.with_name(f"{run['phase']}.tgz")
            with tempfile.TemporaryDirectory(prefix="c128-collect-") as tmp, tarfile.open(tgz) as tar:
                tar.extractall(tmp, filter="data")
                for path, data in collect_run(run, Path(tmp) / run["phase"], args.dest, args.date,
                                              allow_dry_run=args.allow_dry_run):
                    print(f"{path.relative_to(args.dest)}: {'ok' if data['ok'] else 'NOT ok'}, "
                          f"{summarize(data['kind'], data)}")
    except C128Error as exc:
        print(f"c128patch: error: {exc.message}", file=sys.stderr)
        return 2
    compare_benchmarks(args.dest)
    return 0


def compare_benchmarks(dest: Path) -> None:
    """Each release's kernel-bench.json gets `vs_reference`: its rows against the 0.5.23 run's
    of the same series (the stage's series digest; one of another series is not compared with)."""
    ref_path = result_path(dest, BENCH_REFERENCE, "kernel-bench")
    if not ref_path.is_file():
        return
    reference = json.loads(ref_path.read_text())
    for path in sorted(dest.glob("v*/kernel-bench.json")):
        data = json.loads(path.read_text())
        same_series = (data.get("series_digest") is not None
                       and data.get("series_digest") == reference.get("series_digest"))
        if data["rev"] == BENCH_REFERENCE:
            data["vs_reference"] = {"reference": BENCH_REFERENCE, "is_reference": True}
        else:
            data["vs_reference"] = compare_bench(data, reference) if same_series else None
        write_result(dest, data["rev"], "kernel-bench", data)
        print(f"{path.relative_to(dest)}: {summarize('kernel-bench', data)}")


if __name__ == "__main__":
    sys.exit(main())
