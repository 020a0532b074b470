"""``smoke kernel``: run the project's GPU suite (tests/gpu) on the patched sources, and
optionally under compute-sanitizer and side by side with the unpatched upstream sources.

Inputs (smoke.trees), one pytest pass each (smoke.passes), here: which passes, and the report.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from c128patch import SCHEMA_VERSION
from c128patch.errors import C128Error
from c128patch.jsonio import write_json_atomic
from c128patch.smoke.device import probe_python, require_device
from c128patch.smoke.passes import ABSENT, BAD, PassSpec, pass_problems, run_pass
from c128patch.smoke.trees import (
    check_suite,
    default_suite_root,
    derive_upstream,
    out_dir,
    read_provenance,
    resolve_tree,
    series_info,
    stage,
    unpack_wheel,
)
from c128patch.smoke.upstream_select import ModuleIndex

Progress = Callable[[str], None]
REPORT = "smoke-kernel.json"


# --------------------------------------------------------------------------- differential


VERDICTS = ("same", "fixed", "n/a", "regressed", "differs")

# The first line of a failure that says the code a test needs is not in the tree.
_MISSING = re.compile(
    r"(?:ModuleNotFoundError: No module named '(?P<module>[\w.]+)'"
    r"|ImportError: cannot import name '(?P<name>\w+)' from '(?P<source>[\w.]+)'"
    r"|AttributeError: module '(?P<owner>[\w.]+)' has no attribute '(?P<attr>\w+)')"
)


def _mentions(root: Path, module: str, name: str) -> bool:
    path = ModuleIndex(root).file(module)
    return path is not None and re.search(rf"\b{re.escape(name)}\b", path.read_text(errors="replace")) is not None


def series_code_missing(message: str, patched: Path | None, upstream: Path | None) -> str | None:
    """What code the series adds that an upstream run lacked, read from the failure message and
    checked on both trees: a module the patched tree has and upstream's has not, or a name a
    module defines on the patched tree only. None when the failure is anything else."""
    m = _MISSING.search(message or "")
    if m is None or patched is None or upstream is None:
        return None
    if m["module"]:
        mod = m["module"]
        if ModuleIndex(patched).file(mod) and not ModuleIndex(upstream).file(mod):
            return f"module {mod}"
        return None
    module, name = (m["source"], m["name"]) if m["name"] else (m["owner"], m["attr"])
    if _mentions(patched, module, name) and not _mentions(upstream, module, name):
        return f"{module}.{name}"
    return None


def compare(patched: dict[str, Any], upstream: dict[str, Any],
            trees: tuple[Path, Path] | None = None) -> dict[str, Any]:
    """Both columns per test and a verdict: same; fixed (ran on both, fails upstream, passes
    patched: a fix); n/a (passes patched, fails upstream because it needs code only the series
    has: a module or a name missing there, checked on ``trees`` = (patched root, upstream root));
    regressed (fails patched, passes upstream); differs."""
    pt = {t["nodeid"]: t for t in patched["tests"]}
    up = {t["nodeid"]: t for t in upstream["tests"]}
    rows = []
    for nodeid in {**pt, **up}:  # the patched pass's order, then what only upstream's has
        a, b = pt.get(nodeid, ABSENT), up.get(nodeid, ABSENT)
        needs = None
        if a["outcome"] == b["outcome"]:
            verdict = "same"
        elif a["outcome"] == "passed" and b["outcome"] in BAD:
            needs = series_code_missing(b.get("message", ""), *(trees or (None, None)))
            verdict = "n/a" if needs else "fixed"
        elif a["outcome"] in BAD and b["outcome"] == "passed":
            verdict = "regressed"
        else:
            verdict = "differs"
        rows.append({"nodeid": nodeid, "patched": a["outcome"], "upstream": b["outcome"], "verdict": verdict,
                     "patched_seconds": a["seconds"], "upstream_seconds": b["seconds"],
                     "upstream_message": b.get("message", ""), **({"needs": needs} if needs else {})})
    summary = {v: sum(1 for r in rows if r["verdict"] == v) for v in VERDICTS}
    shared = sorted(set(patched["results"]) & set(upstream["results"]))
    results = {name: patched["results"][name] == upstream["results"][name] for name in shared}
    return {"rows": rows, "summary": summary, "results_identical": results}


# --------------------------------------------------------------------------- the tier


@dataclass
class KernelOptions:
    tree: Path | None = None
    wheel: Path | None = None
    upstream_tree: Path | None = None
    sanitizers: tuple[str, ...] = ()
    differential: bool = False
    scale: float = 1.0
    sanitizer_scale: float = 0.05
    sanitizer_only: bool = False
    collect_only: bool = False
    suite: Path | None = None
    timeout: float = 1800.0
    keyword: str | None = None
    python: str = sys.executable
    out: Path | None = None


@dataclass
class Prepared:
    """Trees resolved, suite found; temp folders to remove at the end."""

    patched: Path
    upstream: Path | None
    upstream_how: str
    suite: Path
    record: dict | None
    temp: list[Path] = field(default_factory=list)

    def cleanup(self) -> None:
        for path in self.temp:
            shutil.rmtree(path, ignore_errors=True)


def validate(opts: KernelOptions) -> Path:
    """Cheap checks of the inputs, before the machine is probed; returns the suite."""
    if (opts.tree is None) == (opts.wheel is None):
        raise C128Error("give the patched sources one way: --tree PATH or --wheel FILE")
    suite = check_suite(opts.suite or default_suite_root())
    if opts.tree is not None:
        root = resolve_tree(opts.tree)
        upstream = (read_provenance(root) or {}).get("upstream", {})
        if opts.differential and opts.upstream_tree is None and not opts.collect_only and not (
                upstream.get("commit") or upstream.get("rev")):
            raise C128Error("--differential: the tree has no provenance record naming its upstream; "
                            "pass --upstream-tree")
    if opts.wheel is not None:
        if not opts.wheel.is_file():
            raise C128Error(f"--wheel: {opts.wheel} does not exist")
        if not zipfile.is_zipfile(opts.wheel):
            raise C128Error(f"--wheel: {opts.wheel} is not a wheel (not a zip file)")
    if opts.upstream_tree is not None:
        resolve_tree(opts.upstream_tree, "--upstream-tree")
    return suite


def prepare(opts: KernelOptions, progress: Progress = lambda _m: None) -> Prepared:
    """Resolve the suite and the trees (unpacking a wheel, deriving upstream when asked)."""
    suite = validate(opts)
    temp: list[Path] = []
    try:
        if opts.wheel is not None:
            work = Path(tempfile.mkdtemp(prefix="c128patch-smoke-"))
            temp.append(work)
            progress(f"unpacking {opts.wheel.name}")
            patched = resolve_tree(unpack_wheel(opts.wheel, work / "patched"), "--wheel")
        else:  # validate: --tree when there is no --wheel
            patched = resolve_tree(opts.tree or Path())
        record = read_provenance(patched)
        upstream, how = None, ""
        if opts.upstream_tree is not None:
            upstream, how = resolve_tree(opts.upstream_tree, "--upstream-tree"), "--upstream-tree"
        elif opts.differential and not opts.collect_only:
            work = Path(tempfile.mkdtemp(prefix="c128patch-smoke-upstream-"))
            temp.append(work)
            progress("extracting the unpatched upstream sources")
            root, how = derive_upstream(patched, record, opts.wheel, work)
            upstream = resolve_tree(root, "upstream")
        if upstream is not None and upstream == patched:
            raise C128Error("the upstream tree is the patched tree; pass the unpatched sources")
        return Prepared(patched, upstream, how, suite, record, temp)
    except BaseException:
        for path in temp:
            shutil.rmtree(path, ignore_errors=True)
        raise


def plan_passes(opts: KernelOptions, prep: Prepared, sanitizer_exe: str | None) -> list[PassSpec]:
    common = dict(timeout=opts.timeout, keyword=opts.keyword, collect_only=opts.collect_only)
    if opts.collect_only:
        return [PassSpec("patched", prep.patched, prep.upstream, opts.scale, **common)]
    passes = []
    if not opts.sanitizer_only:
        passes.append(PassSpec("patched", prep.patched, prep.upstream, opts.scale, **common))
        if opts.differential:
            assert prep.upstream is not None
            passes.append(PassSpec("upstream", prep.upstream, prep.upstream, opts.scale, **common))
    for tool in opts.sanitizers:
        passes.append(PassSpec(f"patched-{tool}", prep.patched, prep.upstream, opts.sanitizer_scale,
                               sanitizer=tool, sanitizer_exe=sanitizer_exe, **common))
    return passes


def build_report(command: str, opts: KernelOptions, prep: Prepared, device: dict[str, Any],
                 passes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The JSON report: the patched pass on top, the other passes beside it."""
    main = passes.get("patched") or next(iter(passes.values()), None)  # --sanitizer-only: the first tool's
    problems = [p for res in passes.values() for p in pass_problems(res, opts.collect_only)]
    report: dict[str, Any] = {
        "command": command,
        "tier": "kernel",
        "mode": "collect-only" if opts.collect_only else "run",
        "device": device,
        "tree": str(prep.patched),
        "wheel": str(opts.wheel) if opts.wheel else None,
        "suite": str(prep.suite),
        "provenance": series_info(prep.record),
        "series": (prep.record or {}).get("series"),  # name, version, digest of the applied series
        "scale": opts.scale,
        "upstream_tree": str(prep.upstream) if prep.upstream else None,
        "upstream_how": prep.upstream_how or None,
        "passes": {k: {x: v for x, v in res.items() if x != "tests"} for k, res in passes.items()},
    }
    if prep.record is None:
        report["notes"] = ["the tree has no provenance record (sglang/c128patch_provenance.json): "
                           "is it a c128patch-patched tree?"]
    if main:
        report.update({k: main["counts"][k] for k in ("passed", "failed", "skipped")})
        report.update(errors=main["counts"]["error"], crashed=main["counts"]["crashed"])
        report["tests"] = [dict(t) for t in main["tests"]]
    if "upstream" in passes and main:
        diff = compare(main, passes["upstream"], (prep.patched, prep.upstream) if prep.upstream else None)
        report["differential"] = {k: v for k, v in diff.items() if k != "rows"}
        report["differential"]["upstream_counts"] = passes["upstream"]["counts"]
        by_id = {r["nodeid"]: r for r in diff["rows"]}
        for t in report["tests"]:
            r = by_id.get(t["nodeid"])
            if r:
                t.update(upstream=r["upstream"], upstream_seconds=r["upstream_seconds"], verdict=r["verdict"],
                         upstream_message=r["upstream_message"][:300],
                         **({"needs": r["needs"]} if "needs" in r else {}))
        report["differential"]["rows"] = [r for r in diff["rows"]
                                          if r["nodeid"] not in {t["nodeid"] for t in main["tests"]}]
        regressed = diff["summary"]["regressed"]
        if regressed:
            problems.append(f"differential: {regressed} test(s) pass upstream and fail patched")
        # The upstream pass failing (even dying) is what the series fixes: a note, not a problem.
        up_notes = [p for p in problems if p.startswith("upstream:") and "left behind" not in p]
        problems = [p for p in problems if p not in up_notes]
        report.setdefault("notes", []).extend(up_notes)
    san_runs = [res["sanitizer"] | {"pass": k, "scale": res["scale"], "counts": res["counts"],
                                    "failing": [t["nodeid"] for t in res["tests"] if t["outcome"] in BAD]}
                for k, res in passes.items() if res.get("sanitizer")]
    errors = [r["errors"] for r in san_runs]
    report["sanitizer"] = {"tool": "+".join(r["tool"] for r in san_runs), "runs": san_runs,
                           "errors": None if None in errors else sum(errors)} if san_runs else None
    report["problems"] = problems
    report["ok"] = not problems
    return report


def write_report(report: dict[str, Any], out: Path) -> Path:
    return write_json_atomic(out / REPORT, {**report, "schema": SCHEMA_VERSION})


def stage_trees(opts: KernelOptions, dest: Path, progress: Progress) -> dict[str, dict[str, Any]]:
    """What the suite reads of the trees, copied under ``dest`` (to carry to a GPU machine)."""
    prep = prepare(opts, progress)
    try:
        trees = {"patched": prep.patched, **({"upstream": prep.upstream} if prep.upstream else {})}
        return {k: {**v, "path": str(dest / k)} for k, v in stage(prep.suite, trees, dest).items()}
    finally:
        prep.cleanup()


def run(opts: KernelOptions, command: str, progress: Progress) -> tuple[dict[str, Any], Path]:
    """The suite's passes, the report rewritten after each; the report and its path."""
    opts = replace(opts, suite=validate(opts))
    device = {} if opts.collect_only else require_device(opts.python, opts.sanitizers)
    prep = prepare(opts, progress)
    try:
        out = out_dir(opts.out, "kernel")
        opts = replace(opts, out=out)
        passes: dict[str, dict] = {}
        report: dict[str, Any] = {}
        path = out / REPORT
        for spec in plan_passes(opts, prep, device.get("compute_sanitizer")):
            what = f" under compute-sanitizer {spec.sanitizer}" if spec.sanitizer else ""
            if not opts.collect_only:
                progress(f"running the GPU suite on {spec.label} ({spec.tree}){what}, scale {spec.scale}")
            result = run_pass(spec, prep.suite, opts.python, out)
            result["tests_brief"] = [{"nodeid": t["nodeid"], "outcome": t["outcome"]} for t in result["tests"]]
            passes[spec.label] = result
            report = build_report(command, opts, prep, device, passes)
            path = write_report(report, out)
        if opts.collect_only and not report.get("tests"):
            probe = probe_python(opts.python)
            why = (f": torch does not import in {opts.python} ({probe['torch_error']}) and the suite's files skip "
                   "without it" if "torch_error" in probe else "")
            raise C128Error(f"--list collected no test of {prep.suite} on {prep.patched}{why}")
    finally:
        prep.cleanup()
    return report, path
