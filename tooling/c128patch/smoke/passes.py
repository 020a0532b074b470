"""One pytest pass of the GPU suite in a subprocess, with the harness API's environment, optionally under
compute-sanitizer (its ``=========`` summaries summed over the processes it watched); per-test rows from
:mod:`c128patch.smoke.plugin`, so a pass that dies mid-test still says which test it was."""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from c128patch import PACKAGE_DIR
from c128patch.procs import without_credentials
from c128patch.smoke.logs import read_jsonl
from c128patch.smoke.plugin import ROWS_ENV
from c128patch.smoke.procs import Managed, exit_description

# The harness API (tests/gpu/harness.py); mirrored here because the suite is not importable.
TREE_ENV = "C128PATCH_TREE"
UPSTREAM_TREE_ENV = "C128PATCH_UPSTREAM_TREE"
SCALE_ENV = "C128PATCH_GPU_SCALE"
RESULTS_ENV = "C128PATCH_GPU_RESULTS_DIR"
ERROR_EXIT_CODE = 99  # compute-sanitizer --error-exitcode
# The caching allocator hides out-of-bounds accesses inside its big blocks; off, each tensor is
# its own cudaMalloc and memcheck sees its real bounds.
SANITIZER_ENV = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}

_PREFIX = re.compile(r"^=+ ?")
_ERROR_SUMMARY = re.compile(r"^=+ ERROR SUMMARY: (\d+) errors?\b")
_RACE_SUMMARY = re.compile(r"^=+ RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
# First line of each report block: "Invalid __global__ read of size 4 bytes", "Error: Race
# reported between ...", "Program hit cudaErrorIllegalAddress ...".
_REPORT = re.compile(r"^=+ (Invalid |Error: |Program hit |Warning: |Uninitialized |Barrier error|Malloc/Free error)")
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "crashed", "not run")  # a pass's counts
BAD = ("failed", "error", "crashed")  # outcomes that fail a pass
ABSENT = {"outcome": "absent", "seconds": 0.0, "message": ""}  # a test one pass has and the other has not


@dataclass
class PassSpec:
    label: str
    tree: Path
    upstream: Path | None = None
    scale: float = 1.0
    sanitizer: str | None = None  # tool name
    sanitizer_exe: str | None = None
    timeout: float = 1800.0
    keyword: str | None = None
    collect_only: bool = False
    extra_env: dict[str, str] = field(default_factory=dict)
    paths: tuple[str, ...] = ()  # test files (relative to the suite folder); default: the whole suite
    pytest_args: tuple[str, ...] = ()  # more pytest arguments (smoke upstream: its -p plugin ...)


def pytest_argv(spec: PassSpec, suite: Path, python: str, out_dir: Path) -> list[str]:
    ini = out_dir / "pytest.ini"
    ini.write_text("[pytest]\n")  # not the repo's ini: its addopts and timeout are for the CPU suite
    argv = [python, "-m", "pytest", *(spec.paths or [str(suite)]), "-c", str(ini), "--rootdir", str(suite),
            "--confcutdir", str(suite), "-p", "no:cacheprovider", "-p", "c128patch.smoke.plugin",
            *spec.pytest_args, "-q", "-rfEs",
            "--junitxml", str(out_dir / f"junit-{spec.label}.xml")]
    if spec.collect_only:
        argv.append("--collect-only")
    if spec.keyword:
        argv += ["-k", spec.keyword]
    if spec.sanitizer:
        assert spec.sanitizer_exe
        argv = [spec.sanitizer_exe, "--tool", spec.sanitizer, "--error-exitcode", str(ERROR_EXIT_CODE), *argv]
    return argv


def pytest_env(spec: PassSpec, rows: Path, results: Path) -> dict[str, str]:
    env = without_credentials(dict(os.environ))  # the tree's tests run as the operator, unsealed: no token of theirs
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_DIR.parent), env.get("PYTHONPATH", "")) if p)
    env.update({ROWS_ENV: str(rows), TREE_ENV: str(spec.tree), SCALE_ENV: repr(spec.scale),
                RESULTS_ENV: str(results), "PYTHONUNBUFFERED": "1"})
    env.pop(UPSTREAM_TREE_ENV, None)
    env.update({UPSTREAM_TREE_ENV: str(spec.upstream)} if spec.upstream else {})
    if spec.sanitizer:
        env.update(SANITIZER_ENV)
    env.update(spec.extra_env)
    return env


def parse_sanitizer(text: str, tool: str) -> dict[str, Any]:
    """``errors``: the total (None: no summary, the run did not end); per-process summaries; 50 reports' heads."""
    summaries: list[int] = []
    races: list[dict[str, int]] = []
    reports: list[str] = []
    for line in text.splitlines():
        line = line.rstrip()
        if m := _ERROR_SUMMARY.match(line):
            summaries.append(int(m.group(1)))
        elif m := _RACE_SUMMARY.match(line):
            races.append({"hazards": int(m.group(1)), "errors": int(m.group(2)), "warnings": int(m.group(3))})
        elif _REPORT.match(line) and len(reports) < 50:
            reports.append(_PREFIX.sub("", line))
    if tool == "racecheck" and races:
        # racecheck's hazards are in its own summary; an ERROR SUMMARY, where printed too,
        # counts the same hazards again, so take the larger per-process view, not the sum.
        errors: int | None = max(sum(r["errors"] for r in races), sum(summaries))
    else:
        errors = sum(summaries) if summaries else None
    return {"tool": tool, "errors": errors, "processes": len(summaries) or len(races), "error_summaries": summaries,
            "racecheck_summaries": races, "warnings": sum(r["warnings"] for r in races), "reports": reports}


def tests_from_rows(rows: list[dict], end_time: float, timed_out: bool = False) -> list[dict]:
    """Per-test rows from the plugin's events (crashed: started, never finished; not run: never started)."""
    tests: dict[str, dict] = {}
    running: dict[str, float] = {}  # nodeid -> when it started, until its teardown reports
    for ev in rows:
        kind, nodeid = ev.get("event"), ev.get("nodeid", "")
        if kind not in ("collected", "start", "report"):
            continue
        r = tests.setdefault(nodeid, {"nodeid": nodeid, "outcome": "not run", "seconds": 0.0, "message": ""})
        if kind == "collected":
            r["markers"] = ev.get("markers", [])
        elif kind == "start":
            running[nodeid] = ev.get("t", end_time)
        else:
            r["seconds"] += ev.get("duration", 0.0)
            _report_outcome(r, ev)
            if ev.get("when") == "teardown":
                running.pop(nodeid, None)
    for nodeid, started in running.items():
        tests[nodeid].update(outcome="crashed", seconds=max(tests[nodeid]["seconds"], end_time - started),
                             message="killed at the pass timeout" if timed_out else "the process died during this test")
    for r in tests.values():
        r["seconds"] = round(r["seconds"], 3)
    return list(tests.values())


def _report_outcome(r: dict, ev: dict) -> None:
    """Update test row ``r`` with the outcome one phase's report event gives."""
    when, outcome, msg = ev.get("when"), ev.get("outcome"), ev.get("message", "")
    if when == "collect" or (when == "setup" and outcome == "failed"):
        r.update(outcome="error", message=msg)
    elif when == "setup" and outcome == "skipped":
        r.update(outcome="skipped", message=msg)
    elif when == "call":
        if "xfail" in ev:
            outcome = "xfailed" if outcome == "skipped" else "xpassed"
            msg = msg or ev["xfail"]
        r.update(outcome=outcome, message=msg)
    elif when == "teardown" and outcome == "failed":
        r.update(outcome="error", message=msg or r["message"])


@dataclass
class _Running:
    """One pass between its start and its result."""

    spec: PassSpec
    rows_path: Path
    results: Path
    proc: Managed  # its argv and log are the pass's
    start: float = 0.0
    end: float = 0.0
    timed_out: bool = False


def _result(run: _Running) -> dict[str, Any]:
    spec, proc = run.spec, run.proc
    code = proc.proc.returncode if proc.proc else None
    rows = read_jsonl(run.rows_path)
    finished = any(r.get("event") == "finish" for r in rows)
    tests = tests_from_rows(rows, run.end, run.timed_out)
    text = proc.log.read_text(errors="replace")
    results: dict[str, Any] = {}  # what the suite wrote to its results folder
    for path in sorted(run.results.glob("*.json")):
        try:
            results[path.stem] = json.loads(path.read_text())
        except (ValueError, RecursionError):  # the target's file: a number past Python's digit limit, deep, not UTF-8
            results[path.stem] = {"unreadable": str(path)}
    result: dict[str, Any] = {
        "label": spec.label, "tree": str(spec.tree), "upstream_tree": str(spec.upstream) if spec.upstream else None,
        "scale": spec.scale, "exit_code": code,
        "exit": "timed out after %ds" % spec.timeout if run.timed_out else exit_description(code),
        "timed_out": run.timed_out, "finished": finished, "seconds": round(run.end - run.start, 1),
        "log": str(proc.log), "counts": {k: sum(1 for t in tests if t["outcome"] == k) for k in OUTCOMES},
        "tests": tests, "results": results,
        "argv": proc.argv}
    if proc.leftover:
        result["leftover_pids"] = proc.leftover
    if not finished and not spec.collect_only:
        result["log_tail"] = text.strip().splitlines()[-20:]
    if spec.sanitizer:
        found = parse_sanitizer(text, spec.sanitizer)
        result["sanitizer"] = {**found, "exit_code": code}
    return result


def run_passes(specs: list[PassSpec], suite: Path, python: str, out_dir: Path) -> dict[str, dict[str, Any]]:
    """Passes at once (distinct labels), each its own process group and timeout; label -> result. A signal stops all."""
    out_dir = out_dir.resolve()  # the child runs in the suite's folder
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = []
    for spec in specs:
        rows_path = out_dir / f"rows-{spec.label}.jsonl"
        log = out_dir / f"pytest-{spec.label}.log"
        results = out_dir / "results" / spec.label
        for stale in (rows_path, log):
            stale.unlink(missing_ok=True)
        results.mkdir(parents=True, exist_ok=True)
        proc = Managed(f"pytest {spec.label}", pytest_argv(spec, suite, python, out_dir), log,
                       env=pytest_env(spec, rows_path, results), cwd=suite)
        runs.append(_Running(spec, rows_path, results, proc))
    assert len({r.spec.label for r in runs}) == len(runs), "pass labels must differ"
    with contextlib.ExitStack() as stack:
        for run in runs:
            stack.enter_context(run.proc)
            run.start = time.time()
        pending = list(runs)
        while pending:
            for run in list(pending):
                if run.proc.poll() is None and time.time() - run.start < run.spec.timeout:
                    continue
                run.timed_out = run.proc.proc is not None and run.proc.proc.poll() is None
                run.proc.stop()
                run.end = time.time()
                pending.remove(run)
            time.sleep(0.2 if pending else 0)
    return {run.spec.label: _result(run) for run in runs}


def pass_problems(p: dict[str, Any], collect_only: bool = False, outcomes: bool = True) -> list[str]:
    """Why a pass is not clean (empty: clean); ``outcomes=False``: only a pass cut short (smoke upstream's verdicts)."""
    label, c = p["label"], p["counts"]
    problems = [f"{label}: {p['exit']}"] if p["timed_out"] else []
    bad = {k: c[k] for k in ("failed", "error", "crashed") if c[k]} if outcomes else {}
    if bad:
        problems.append(f"{label}: " + ", ".join(f"{n} {k}" for k, n in bad.items()))
    if not p["timed_out"] and not (collect_only and outcomes):
        if outcomes and c["passed"] == 0:
            problems.append(f"{label}: no test passed "
                            f"({', '.join(f'{n} {k}' for k, n in c.items() if n) or 'none collected'})")
        if not p["finished"]:
            problems.append(f"{label}: pytest did not finish ({p['exit']})")
        elif outcomes and p["exit_code"] not in (0, 1, ERROR_EXIT_CODE) and not bad:
            problems.append(f"{label}: pytest {p['exit']}")
    errors = (p.get("sanitizer") or {"errors": 0})["errors"]
    if errors is None:
        problems.append(f"{label}: compute-sanitizer printed no summary ({p['exit']})")
    elif errors:
        problems.append(f"{label}: compute-sanitizer {p['sanitizer']['tool']} found {errors} error(s)")
    if p.get("leftover_pids"):
        problems.append(f"{label}: processes left behind {p['leftover_pids']}")
    return problems
