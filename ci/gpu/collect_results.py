#!/usr/bin/env python3
"""Turn what a GPU evidence call brought back into the committed per-release results.

  python ci/gpu/collect_results.py FETCHED_DIR [FETCHED_DIR ...] [--dest ci/gpu/results] [--date YYYY-MM-DD]

FETCHED_DIR holds <phase>.tgz and <phase>-run.json from ci/gpu/h200_run.py (the device tool's
files_at folder). Writes ci/gpu/results/<rev>/{suite,differential,memcheck,racecheck}.json and
<rev>/before/suite.json (c128patch.evidence.results), each keyed by (upstream tree id, series hash)
as staged, with paths relative to the repository. Then `c128patch matrix` shows them.
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
from c128patch.evidence.results import collect_run, summarize  # noqa: E402


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
    return 0


if __name__ == "__main__":
    sys.exit(main())
