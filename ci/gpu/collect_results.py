#!/usr/bin/env python3
"""Split a `c128patch smoke --tier kernel` report into the committed per-series GPU results.

  python ci/gpu/collect_results.py SMOKE_OUT_DIR [--date YYYY-MM-DD] [--dest ci/gpu/results]

SMOKE_OUT_DIR is smoke's --out folder (smoke-kernel.json, results/<pass>/*.json). Writes
smoke-<date>.json (the whole report) and one file per series with the fields every result carries:
command, device, passed, failed, sanitizer {tool, errors}, the tests' rows and the JSON the tests
wrote themselves (results/patched/<name>.json).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

SERIES = {
    "series1-zero-rows": ("test_series1_zero_rows.py", ("series1_",)),
    "series2-dspark-kernels": (("test_dspark_kernels.py", "test_dspark_simulation.py"), ("dspark_",)),
    "series3-controller": ("test_series3_controller.py", ("series3_",)),
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--dest", type=Path, default=Path(__file__).resolve().parent / "results")
    args = ap.parse_args()
    report = json.loads((args.out / "smoke-kernel.json").read_text())
    args.dest.mkdir(parents=True, exist_ok=True)
    (args.dest / f"smoke-{args.date}.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    device = report["device"]
    for name, (files, prefixes) in SERIES.items():
        files = (files,) if isinstance(files, str) else files
        rows = [t for t in report["tests"] if t["nodeid"].split("::")[0] in files]
        sanitizer_runs = []
        for run in report["sanitizer"]["runs"]:
            rows_run = [json.loads(l) for l in (args.out / f"rows-{run['pass']}.jsonl").read_text().splitlines() if l.strip()]
            mine = [r for r in rows_run if r.get("nodeid", "").split("::")[0] in files]
            sanitizer_runs.append({"tool": run["tool"], "errors": run["errors"], "scale": run["scale"],
                                   "passed": sum(r.get("outcome") == "passed" for r in mine),
                                   "skipped": sum(r.get("outcome") == "skipped" for r in mine)})
        own = {}
        for path in sorted((args.out / "results" / "patched").glob("*.json")):
            if path.stem.startswith(prefixes):
                own[path.stem] = json.loads(path.read_text())
        result = {
            "command": report["command"],
            "device": f"{device['gpu']} (sm_{device['capability'].replace('.', '')}), driver {device['driver']}, "
                      f"torch {device['torch']}, nvcc {device['nvcc_version']}",
            "date": args.date,
            "series": report.get("series"),
            "passed": sum(t["outcome"] == "passed" for t in rows),
            "failed": sum(t["outcome"] in ("failed", "error", "crashed") for t in rows),
            "sanitizer": {"tool": "+".join(r["tool"] for r in sanitizer_runs),
                          "errors": sum(r["errors"] for r in sanitizer_runs), "runs": sanitizer_runs},
            "upstream_differential": {t["nodeid"]: t.get("verdict") for t in rows},
            "tests": rows,
            "results": own,
        }
        (args.dest / f"{name}.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        print(f"{name}: {result['passed']} passed, {result['failed']} failed, sanitizer errors {result['sanitizer']['errors']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
