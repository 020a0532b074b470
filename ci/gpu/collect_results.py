#!/usr/bin/env python3
"""Turn what a GPU evidence call brought back into the committed per-release results.

  python ci/gpu/collect_results.py FETCHED_DIR [FETCHED_DIR ...] [--dest ci/gpu/results] [--date YYYY-MM-DD]

FETCHED_DIR holds <phase>.tgz and <phase>-run.json from ci/gpu/h200_run.py (the device tool's
files_at folder). Writes ci/gpu/results/<rev>/{suite,differential,simulation}.json (plain),
{memcheck,racecheck,initcheck,synccheck}.json (sanitizers), kernel-bench.json (bench) and
<rev>/before/suite.json (c128patch.evidence.results' layout), each keyed by (upstream tree id, series hash)
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
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tooling"))

from c128patch.errors import C128Error  # noqa: E402
from c128patch.evidence.keys import EvidenceKey, is_old_style  # noqa: E402
from c128patch.evidence.results import (  # noqa: E402
    BENCH_REFERENCE,
    BENCH_TOLERANCE,
    SANITIZER_KINDS,
    SCHEMA,
    Kind,
    result_path,
    summarize,
    write_result,
)

SIMULATION_RESULT = "dspark_simulation"  # what tests/gpu/test_dspark_simulation.py writes
SIMULATION_TEST = "test_dspark_simulation.py::"
BAD = ("failed", "error", "crashed")


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


def relativize(value: Any, roots: dict[str, str]) -> Any:
    """Every machine path in ``value`` rewritten: ``roots`` maps an absolute prefix to its replacement."""
    if isinstance(value, str):
        for prefix, repl in sorted(roots.items(), key=lambda kv: -len(kv[0])):
            value = value.replace(prefix.rstrip("/") + "/", repl + "/").replace(prefix.rstrip("/"), repl)
        return value
    if isinstance(value, list):
        return [relativize(v, roots) for v in value]
    if isinstance(value, dict):
        return {k: relativize(v, roots) for k, v in value.items()}
    return value


def _counts(counts: dict[str, int]) -> dict[str, int]:
    return {"passed": counts.get("passed", 0), "failed": sum(counts.get(k, 0) for k in BAD),
            "skipped": counts.get("skipped", 0), "not_run": counts.get("not run", 0)}


def _key_json(key: EvidenceKey | dict[str, Any] | None) -> dict[str, Any] | None:
    """A result's key: an old-style one (a stage made before keys were by content) kept as it is."""
    return key.to_json() if isinstance(key, EvidenceKey) else key if is_old_style(key) else None


def _job(job: dict[str, Any]) -> dict[str, Any]:
    return {"name": job["name"], "exit": job["rc"], "seconds": job["seconds"]}


def from_smoke_report(report: dict[str, Any], *, rev: str, label: str, key: EvidenceKey | dict[str, Any] | None,
                      date: str, roots: dict[str, str]) -> dict[Kind, dict[str, Any]]:
    """The result files one ``smoke kernel`` report proves: ``suite``, ``differential``, ``simulation``, one per
    sanitizer run; ``key``: the staged tree's (an old-style one kept for ``ci/rekey_results.py``)."""
    dev = report.get("device") or {}
    sm = str(dev.get("capability", "?")).replace(".", "")
    device = (f"{dev.get('gpu') or dev.get('smi_gpu') or 'no GPU'} (sm_{sm}), driver {dev.get('driver', '?')}, "
              f"torch {dev.get('torch', '?')}, nvcc {dev.get('nvcc_version', '?')}, tvm_ffi {dev.get('tvm_ffi', '?')}")
    base = {"schema": SCHEMA, "rev": rev, "label": label, "key": _key_json(key),
            "command": report["command"], "device": device, "date": date}
    passes = report.get("passes") or {}
    out: dict[Kind, dict[str, Any]] = {}
    if "patched" in passes:
        counts = _counts(passes["patched"]["counts"])
        problems = [p for p in report.get("problems", []) if p.startswith("patched:")]
        out["suite"] = {**base, "kind": "suite", **counts, "seconds": passes["patched"]["seconds"],
                        "scale": passes["patched"]["scale"], "problems": problems,
                        "ok": counts["failed"] == 0 and counts["passed"] > 0 and not problems,
                        "tests": [{"nodeid": t["nodeid"], "outcome": t["outcome"], "seconds": t.get("seconds", 0.0),
                                   **({"message": t["message"][:300]} if t.get("message") else {})}
                                  for t in report.get("tests", [])]}
    if "differential" in report and "upstream" in passes:
        diff = report["differential"]
        regressed = [t["nodeid"] for t in report.get("tests", []) if t.get("verdict") == "regressed"]
        out["differential"] = {**base, "kind": "differential", "summary": diff["summary"],
                               "regressed": regressed, "upstream_counts": _counts(diff["upstream_counts"]),
                               "ok": not regressed and diff["summary"].get("regressed", 0) == 0,
                               "tests": [{"nodeid": t["nodeid"], "patched": t["outcome"],
                                          "upstream": t.get("upstream", "absent"), "verdict": t.get("verdict", ""),
                                          **({"needs": t["needs"]} if t.get("needs") else {}),
                                          **({"upstream_message": t["upstream_message"][:200]}
                                             if t.get("upstream_message") and t.get("verdict") != "same" else {})}
                                         for t in report.get("tests", [])]}
    sim = (passes.get("patched") or {}).get("results", {}).get(SIMULATION_RESULT)
    if isinstance(sim, dict):
        test = [t for t in report.get("tests", []) if t["nodeid"].startswith(SIMULATION_TEST)]
        outcome = test[0]["outcome"] if test else "absent"
        ours = sim.get("ours") or {}
        out["simulation"] = {**base, "kind": "simulation", "test": test[0]["nodeid"] if test else None,
                             "outcome": outcome, "written_by": "tests/gpu/test_dspark_simulation.py",
                             **{k: v for k, v in sim.items() if k not in base},
                             "ok": outcome == "passed" and ours.get("chunk_mismatches") == 0
                             and ours.get("state_mismatches") == 0}
    for run in (report.get("sanitizer") or {}).get("runs", []):
        tool = run["tool"]
        if tool not in SANITIZER_KINDS:
            continue
        counts = _counts(run["counts"])
        errors = run.get("errors")
        out[tool] = {**base, "kind": tool, **counts, "scale": run.get("scale"),
                     "sanitizer": {"tool": tool, "errors": errors, "processes": run.get("processes"),
                                   "reports": run.get("reports", [])[:20]},
                     "failing": run.get("failing", []),
                     "ok": errors == 0 and counts["failed"] == 0 and counts["passed"] > 0}
    return {k: relativize(v, roots) for k, v in out.items()}


def collect_run(run: dict[str, Any], results: Path, dest: Path, date: str, *,
                allow_dry_run: bool = False) -> list[tuple[Path, dict[str, Any]]]:
    """Write one device run's result files (``run``: its ``<phase>-run.json``; ``results``: its job folders)
    into ``dest``; returns (path, data) per file. A job without a report writes nothing ('unverified')."""
    if run.get("dry_run") and not allow_dry_run:
        raise C128Error("this bundle is from a --dry-run (collect only): it proves nothing; not collected")
    trees = {rel["rev"]: rel["trees"] for rel in run["manifest"]["releases"]}
    roots = {run["repo_root"]: ".", run["results_root"]: f"$OUT/{run['phase']}"}
    written = []
    for job in run["jobs"]:
        raw = trees[job["rev"]][job["label"]].get("key")
        key = EvidenceKey.from_json(raw) or (raw if is_old_style(raw) else None)
        if job.get("script"):
            data = bench_result(run, job, results, key, date, roots)
            if data is not None:
                written.append((write_result(dest, job["rev"], "kernel-bench", data, job["label"]), data))
            continue
        path = results / job["name"] / "smoke-kernel.json"
        if not path.is_file():
            continue
        report = json.loads(path.read_text())
        if report.get("mode") == "collect-only" and not allow_dry_run:
            raise C128Error(f"{path}: a collect-only report proves nothing; not collected")
        files = from_smoke_report(report, rev=job["rev"], label=job["label"], key=key, date=date, roots=roots)
        for kind in (*job["kinds"], *(("simulation",) if "suite" in job["kinds"] else ())):
            if kind in files:
                data = {**files[kind], "job": _job(job)}
                written.append((write_result(dest, job["rev"], kind, data, job["label"]), data))
    return written


# --------------------------------------------------------------------------- the kernel benchmark


def bench_result(run: dict[str, Any], job: dict[str, Any], results: Path, key: EvidenceKey | dict[str, Any] | None,
                 date: str, roots: dict[str, str]) -> dict[str, Any] | None:
    """``kernel-bench`` of one bench job (ci/bench/bench_online_c128_dspark.py's JSON), or None."""
    path = results / job["name"] / "online_c128_dspark.json"
    if job.get("rc") is None or not path.is_file():
        return None
    bench = json.loads(path.read_text())
    if bench.get("dry_run"):  # the benchmark's --dry-run measured nothing
        return None
    data = {"schema": SCHEMA, "rev": job["rev"], "label": job["label"], "key": _key_json(key),
            "kind": "kernel-bench", "command": bench.get("command", ""), "device": run.get("device", ""),
            "series_digest": ((run.get("manifest") or {}).get("series") or {}).get("digest"),
            "date": date, "copy_ceiling_gbps": bench.get("copy_ceiling_gbps"), "layers": bench.get("layers"),
            "reps": bench.get("reps"), "ragged": bench.get("ragged"),
            "upstream_mtp_calls": bench.get("upstream_mtp_calls"), "rows": bench.get("rows", []),
            "targets": bench.get("targets", {}),
            "job": _job(job), "ok": job["rc"] == 0 and bool(bench.get("rows"))}
    return relativize(data, roots)


def bench_row_key(row: dict[str, Any]) -> tuple:
    return (row["B"], row["W"], row["path"], row["what"])


def compare_bench(data: dict[str, Any], reference: dict[str, Any],
                  tolerance: float = BENCH_TOLERANCE) -> dict[str, Any]:
    """Each row of ``data`` against the same row of ``reference``: within ``tolerance`` or ``outside``."""
    ref = {bench_row_key(r): r["us"] for r in reference.get("rows", [])}
    rows = [r for r in data.get("rows", []) if bench_row_key(r) in ref and ref[bench_row_key(r)] > 0]
    outside = [{"B": r["B"], "W": r["W"], "path": r["path"], "what": r["what"], "us": r["us"],
                "reference_us": ref[bench_row_key(r)], "ratio": round(r["us"] / ref[bench_row_key(r)], 4)}
               for r in rows if abs(r["us"] / ref[bench_row_key(r)] - 1) > tolerance]
    by_path: dict[str, dict[str, int]] = {}
    for r in rows:
        counts = by_path.setdefault(r["path"], {"rows": 0, "within": 0})
        counts["rows"] += 1
        counts["within"] += abs(r["us"] / ref[bench_row_key(r)] - 1) <= tolerance
    return {"reference": reference.get("rev", BENCH_REFERENCE), "reference_key": reference.get("key"),
            "series_digest": reference.get("series_digest"),
            "tolerance": tolerance, "rows": len(rows), "within": len(rows) - len(outside), "outside": outside,
            "by_path": dict(sorted(by_path.items()))}


if __name__ == "__main__":
    sys.exit(main())
