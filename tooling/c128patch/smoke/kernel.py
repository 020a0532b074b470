"""``smoke kernel``: run the project's GPU suite (tests/gpu) on the patched sources, and
optionally under compute-sanitizer and side by side with the unpatched upstream sources.

Inputs (smoke.trees), one pytest pass each (smoke.passes), here: which passes, and the report.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from c128patch import SCHEMA_VERSION
from c128patch.errors import C128Error
from c128patch.jsonio import write_json_atomic
from c128patch.smoke.device import probe_python, require_device
from c128patch.smoke.passes import ABSENT, BAD, PassSpec, pass_problems, run_passes
from c128patch.smoke.trees import (
    KernelOptions,
    Prepared,
    interrupted_out,
    out_dir,
    prepare,
    series_info,
    stage,
    validate,
)
from c128patch.smoke.upstream_select import ModuleIndex

Progress = Callable[[str], None]
Passes = dict[str, dict[str, Any]]  # label -> a pass's result (smoke.passes)
REPORT = "smoke-kernel.json"
NO_RECORD = "the tree has no provenance record (sglang/c128patch_provenance.json): is it a c128patch-patched tree?"


VERDICTS = ("same", "fixed", "n/a", "regressed", "differs")

# The first line of a failure that says the code a test needs is not in the tree.
_MISSING = re.compile(
    r"(?:ModuleNotFoundError: No module named '(?P<module>[\w.]+)'"
    r"|ImportError: cannot import name '(?P<name>\w+)' from '(?P<source>[\w.]+)'"
    r"|AttributeError: module '(?P<owner>[\w.]+)' has no attribute '(?P<attr>\w+)')"
)


def _has(root: Path, module: str, name: str | None = None) -> bool:
    """``module`` is a file of ``root``; with ``name``, one that mentions it."""
    path = ModuleIndex(root).file(module)
    if path is None or name is None:
        return path is not None
    return re.search(rf"\b{re.escape(name)}\b", path.read_text(errors="replace")) is not None


def series_code_missing(message: str, patched: Path, upstream: Path | None) -> str | None:
    """The module (or module.name) a failure says is missing, when only the patched tree has it; else None."""
    m = _MISSING.search(message or "")
    if m is None or upstream is None:
        return None
    module, name = ((m["module"], None) if m["module"] else (m["source"], m["name"]) if m["name"]
                    else (m["owner"], m["attr"]))
    if not _has(patched, module, name) or _has(upstream, module, name):
        return None
    return f"{module}.{name}" if name else f"module {module}"


def paired(patched: list[dict], upstream: list[dict]) -> list[tuple[str, dict, dict]]:
    """(nodeid, patched row, upstream row) over both passes: the patched pass's order, then what only
    upstream's has; a test one pass lacks is ``ABSENT`` there. ``smoke upstream`` pairs its passes with it too."""
    pt, up = {t["nodeid"]: t for t in patched}, {t["nodeid"]: t for t in upstream}
    return [(n, pt.get(n, ABSENT), up.get(n, ABSENT)) for n in {**pt, **up}]


def _verdict(a: dict, b: dict, prep: Prepared) -> tuple[str, str | None]:
    """same, fixed, n/a (upstream fails for want of series-only code), regressed or differs; the code n/a wants."""
    if a["outcome"] == b["outcome"]:
        return "same", None
    if a["outcome"] == "passed" and b["outcome"] in BAD:
        needs = series_code_missing(b.get("message", ""), prep.patched, prep.upstream)
        return ("n/a" if needs else "fixed"), needs
    return ("regressed" if a["outcome"] in BAD and b["outcome"] == "passed" else "differs"), None


def report_head(command: str, mode: str, prep: Prepared, device: dict[str, Any],
                passes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The fields both ``smoke kernel``'s and ``smoke upstream``'s reports start with."""
    return {"command": command, "tier": "kernel", "mode": mode, "device": device, "tree": str(prep.patched),
            "upstream_tree": str(prep.upstream) if prep.upstream else None, "upstream_how": prep.upstream_how or None,
            "provenance": series_info(prep.record), "series": (prep.record or {}).get("series"),
            "passes": {k: {x: v for x, v in res.items() if x != "tests"} for k, res in passes.items()},
            "runs_target_code": UNSEALED}


def _differential(report: dict[str, Any], main: dict[str, Any], upstream: dict[str, Any], prep: Prepared,
                  problems: list[str]) -> list[str]:
    """The upstream pass beside the patched one (columns and verdict per test, a row for one only it has, the
    summary); the problems left (the upstream pass failing, even dying, is what the series fixes: a note)."""
    tests, summary, rows = {t["nodeid"]: t for t in report["tests"]}, dict.fromkeys(VERDICTS, 0), []
    for nodeid, a, b in paired(main["tests"], upstream["tests"]):
        verdict, needs = _verdict(a, b, prep)
        summary[verdict] += 1
        row = {"upstream": b["outcome"], "upstream_seconds": b["seconds"], "verdict": verdict,
               **({"needs": needs} if needs else {})}
        if nodeid in tests:
            tests[nodeid].update(row, upstream_message=b.get("message", "")[:300])
        else:
            rows.append({**row, "nodeid": nodeid, "patched": a["outcome"], "patched_seconds": a["seconds"],
                         "upstream_message": b.get("message", "")})
    shared = sorted(set(main["results"]) & set(upstream["results"]))
    report["differential"] = {"summary": summary, "upstream_counts": upstream["counts"], "rows": rows,
                              "results_identical": {n: main["results"][n] == upstream["results"][n] for n in shared}}
    if summary["regressed"]:
        problems.append(f"differential: {summary['regressed']} test(s) pass upstream and fail patched")
    notes = [p for p in problems if p.startswith("upstream:") and "left behind" not in p]
    report.setdefault("notes", []).extend(notes)
    return [p for p in problems if p not in notes]


def build_report(command: str, opts: KernelOptions, prep: Prepared, device: dict[str, Any],
                 passes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The JSON report: the patched pass on top, the other passes beside it."""
    main = passes.get("patched") or next(iter(passes.values()), None)  # --sanitizer-only: the first tool's
    problems = [p for res in passes.values() for p in pass_problems(res, opts.collect_only)]
    for res in passes.values():
        res.setdefault("tests_brief", [{"nodeid": t["nodeid"], "outcome": t["outcome"]} for t in res["tests"]])
    report = report_head(command, "collect-only" if opts.collect_only else "run", prep, device, passes)
    report.update(wheel=str(opts.wheel) if opts.wheel else None, suite=str(prep.suite), scale=opts.scale)
    if prep.record is None:
        report["notes"] = [NO_RECORD]
    if main:
        report.update({k: main["counts"][k] for k in ("passed", "failed", "skipped")})
        report.update(errors=main["counts"]["error"], crashed=main["counts"]["crashed"])
        report["tests"] = [dict(t) for t in main["tests"]]
        if "upstream" in passes:
            problems = _differential(report, main, passes["upstream"], prep, problems)
    san_runs = [res["sanitizer"] | {"pass": k, "scale": res["scale"], "counts": res["counts"],
                                    "failing": [t["nodeid"] for t in res["tests"] if t["outcome"] in BAD]}
                for k, res in passes.items() if res.get("sanitizer")]
    errors = [r["errors"] for r in san_runs]
    report["sanitizer"] = {"tool": "+".join(r["tool"] for r in san_runs), "runs": san_runs,
                           "errors": None if None in errors else sum(errors)} if san_runs else None
    return {**report, "problems": problems, "ok": not problems}


# said as smoke first runs the tree's code (its kernels; its tests' conftest.py, even for --list; its server): on
# stderr, with --json too (as watch and treecheck say theirs), and in the report (``runs_target_code``)
UNSEALED = ("smoke runs the tree's code as you, outside the sealed box (it needs the GPU), without your credentials in "
            "its environment: run it on a tree you trust")


def unsealed(prefix: str = "") -> None:
    """``UNSEALED`` on stderr, on a terminal or not, with --json too (``progress`` is quiet there)."""
    from c128patch.progress import echo

    echo(prefix + UNSEALED)


def run_groups(groups: list[list[PassSpec]], cwd: Path, python: str, out: Path,
               announce: Callable[[list[PassSpec]], None], report: Callable[[Passes], dict[str, Any]],
               write: Callable[[dict[str, Any], Path], Path]) -> tuple[dict[str, Any], Path]:
    """Each group's passes at once, group after group, the report rewritten after each; the last report, its path."""
    passes: dict[str, dict] = {}
    result: dict[str, Any] = {}
    path = out
    unsealed()
    for group in groups:
        announce(group)
        passes.update(run_passes(group, cwd, python, out))
        result = report(passes)
        path = write(result, out)
    return result, path


def stage_trees(opts: KernelOptions, dest: Path, progress: Progress) -> dict[str, dict[str, Any]]:
    """What the suite reads of the trees, copied under ``dest`` (to carry to a GPU machine)."""
    with prepare(opts, progress) as prep:
        trees = {"patched": prep.patched, **({"upstream": prep.upstream} if prep.upstream else {})}
        return {k: {**v, "path": str(dest / k)} for k, v in stage(prep.suite, trees, dest).items()}


def run(opts: KernelOptions, command: str, progress: Progress) -> tuple[dict[str, Any], Path]:
    """The suite's passes, the report rewritten after each; the report and its path."""
    opts = replace(opts, suite=validate(opts))
    device = {} if opts.collect_only else require_device(opts.python, opts.sanitizers)

    def announce(group: list[PassSpec]) -> None:
        for spec in (s for s in group if not s.collect_only):
            what = f" under compute-sanitizer {spec.sanitizer}" if spec.sanitizer else ""
            progress(f"running the GPU suite on {spec.label} ({spec.tree}){what}, scale {spec.scale}")

    given = opts.out
    with prepare(opts, progress) as prep, interrupted_out(out := out_dir(opts.out, "kernel"), opts.out):
        opts = replace(opts, out=out)
        common = dict(timeout=opts.timeout, keyword=opts.keyword, collect_only=opts.collect_only)
        specs = [] if opts.sanitizer_only and not opts.collect_only else [
            PassSpec("patched", prep.patched, prep.upstream, opts.scale, **common)]
        if opts.differential and prep.upstream is not None and not opts.collect_only:
            specs.append(PassSpec("upstream", prep.upstream, prep.upstream, opts.scale, **common))
        specs += [PassSpec(f"patched-{tool}", prep.patched, prep.upstream, opts.sanitizer_scale, sanitizer=tool,
                           sanitizer_exe=device.get("compute_sanitizer"), **common)
                  for tool in (() if opts.collect_only else opts.sanitizers)]  # --list: the plain pass only
        report, path = run_groups([[s] for s in specs], prep.suite, opts.python, opts.out, announce,
                                  lambda passes: build_report(command, opts, prep, device, passes),
                                  lambda rep, out: write_json_atomic(out / REPORT, {**rep, "schema": SCHEMA_VERSION}))
        if opts.collect_only and not report.get("tests"):
            probe = probe_python(opts.python)
            why = (f": torch does not import in {opts.python} ({probe['torch_error']}) and the suite's files skip "
                   "without it" if "torch_error" in probe else
                   f": pytest does not import in {opts.python} ({probe['pytest_error']}); the suite runs as "
                   "`python -m pytest`" if "pytest_error" in probe else "")
            if given is None:  # the folder it made holds nothing to keep (--out DIR keeps its logs)
                shutil.rmtree(out, ignore_errors=True)
            raise C128Error(f"--list collected no test of {prep.suite} on {prep.patched}{why}")
    return report, path
