"""``smoke upstream [--tests PATH]``: upstream SGLang's own kernel tests (smoke.upstream_select) on the patched
and the unpatched tree, one pytest pass each, a verdict per test (:func:`verdict`); exit 1 on a regression, a
cut pass, nothing passing on the patched tree or a missing stand-in. Writes the report and the evidence
matrix's per-release result (ci/gpu/results/<rev>/upstream-suite.json) after each pass."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

from c128patch.errors import C128Error
from c128patch.git import Git
from c128patch.jsonio import write_json_atomic
from c128patch.smoke import upstream_select as sel
from c128patch.smoke.device import describe, require_device
from c128patch.smoke.kernel import NO_RECORD, Passes, Progress, paired, report_head, run_groups
from c128patch.smoke.passes import BAD, PassSpec, pass_problems
from c128patch.smoke.trees import (
    KernelOptions,
    Prepared,
    copy_files,
    interrupted_out,
    out_dir,
    prepare,
    resolve_tree,
    stage,
    validate,
)
from c128patch.smoke.upstream_standins import HARNESS_ENV, PLAN_ENV

BOOT_PLUGIN = "c128patch.smoke.upstream_standins"
STANDINS_FILE = "c128patch/smoke/upstream_standins.py"  # where a missing stand-in is added
REPORT = "smoke-upstream-suite.json"
RESULT = "upstream-suite.json"
RESULT_SCHEMA = 1
STAGED_TESTS = "upstream-tests"
SOURCES = "SOURCES.json"  # at the test root: where the files come from (copied into the report)
VERDICTS = ("same", "regressed", "fixed", "both fail", "both skipped", "not applicable", "differs", "not run")


@dataclass
class TreePlan:
    root: Path
    closure: sel.Closure
    standins: dict[str, list[str]]  # what upstream_standins installs
    standin_rows: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"tree": str(self.root), "real_packages": sorted(self.closure.real_packages),
                "standins": self.standin_rows, "predicted_import_errors": self.closure.missing,
                "not_followed": self.closure.lazy}


@dataclass
class Plan:
    root: Path  # the test root
    selection: sel.Selection
    harness: Path
    pool: dict[str, set[str]]  # module -> the names a stand-in exists for (upstream_select.standin_pool)
    trees: dict[str, TreePlan] = field(default_factory=dict)
    sources: dict[str, Any] = field(default_factory=dict)


def sources_of(root: Path) -> dict[str, Any]:
    """Where the tests come from: the commit of the checkout that tracks them, and a SOURCES.json at the root."""
    out: dict[str, Any] = {"root": str(root)}
    tracked = Git(worktree=root).run("ls-files", "--", ".", check=False)
    head = Git(worktree=root).run("rev-parse", "HEAD", check=False)
    if tracked.returncode == 0 and tracked.stdout.strip() and head.returncode == 0:
        out["git_commit"] = head.stdout.strip()
    if (root / SOURCES).is_file():
        try:
            out["sources"] = json.loads((root / SOURCES).read_text())
        except (ValueError, RecursionError) as exc:  # a number past Python's digit limit, deep, not UTF-8
            out["sources"] = {"unreadable": f"{root / SOURCES}: {getattr(exc, 'msg', None) or type(exc).__name__}"}
    return out


def pass_spec(plan: Plan, label: str, opts: KernelOptions) -> PassSpec:
    tree = plan.trees[label]
    boot = {"standins": tree.standins, "real_packages": sorted(tree.closure.real_packages)}  # upstream_standins' plan
    return PassSpec(label, tree.root, None, 1.0, timeout=opts.timeout, keyword=opts.keyword,
                    collect_only=opts.collect_only,
                    extra_env={HARNESS_ENV: str(plan.harness), PLAN_ENV: json.dumps(boot, sort_keys=True)},
                    paths=tuple(f.rel for f in plan.selection.files),
                    # a file one tree cannot import is a verdict, not the end of the pass
                    pytest_args=("-p", BOOT_PLUGIN, "--continue-on-collection-errors"))


_NO_MODULE = re.compile(r"No module named '([^']+)'")
_NO_NAME = re.compile(r"cannot import name '([^']+)' from '([^']+)'")
_STANDIN = re.compile(r"the stand-in for (\S+) has no '([^']+)'")


def classify(message: str, standin_rows: list[dict[str, Any]]) -> tuple[str, str]:
    """(``tree`` | ``environment`` | ``stand-in`` | ``other``, a short reason): why a file could not be collected."""
    withheld = {(r["module"], n) for r in standin_rows for n in r.get("withheld", [])}
    m = _STANDIN.search(message)
    if m:
        if (m.group(1), m.group(2)) in withheld:
            return "tree", f"this tree's {m.group(1)} does not define {m.group(2)}"
        return "stand-in", f"the c128patch stand-in for {m.group(1)} lacks {m.group(2)!r}"
    m = _NO_NAME.search(message)
    if m:
        kind = "tree" if m.group(2).split(".")[0] == "sglang" else "environment"
        return kind, f"{m.group(2)} has no {m.group(1)}"
    m = _NO_MODULE.search(message)
    if m:
        if m.group(1).split(".")[0] == "sglang":
            return "tree", f"this tree has no module {m.group(1)}"
        return "environment", f"the environment lacks {m.group(1).split('.')[0]}"
    return "other", message


def verdict(patched: str, upstream: str, nodeid: str, collect_only: bool) -> str:
    good = "not run" if collect_only else "passed"  # --list: collected is the good outcome
    file_row = "::" not in nodeid  # a file that failed to collect
    if patched == upstream:
        if patched == "not run" and not collect_only:
            return "not run"  # a pass cut short: no evidence (the pass itself is a problem)
        if patched in BAD:
            return "not applicable" if file_row and patched == "error" else "both fail"
        return "both skipped" if patched == "skipped" else "same"
    if upstream == good or (file_row and patched in BAD and upstream == "absent"):
        return "regressed"
    if patched == good and (upstream in BAD or (file_row and upstream == "absent")):
        return "fixed"
    if patched in BAD and upstream in BAD:
        return "both fail"
    return "differs"


_KIND_ORDER = ("stand-in", "environment", "tree", "other")


def compare(patched: dict[str, Any], upstream: dict[str, Any] | None, plan: Plan,
            collect_only: bool) -> list[dict[str, Any]]:
    """One row per test id seen in either pass (the upstream pass may not have run yet)."""
    rows = []
    for nodeid, a, b in paired(patched["tests"], upstream["tests"] if upstream else []):
        row: dict[str, Any] = {"id": nodeid, "patched": a["outcome"], "patched_seconds": a["seconds"]}
        if upstream is None:
            row.update(upstream="not run yet", verdict=None)
        else:
            row.update(upstream=b["outcome"], upstream_seconds=b["seconds"],
                       verdict=verdict(a["outcome"], b["outcome"], nodeid, collect_only))
        row.update({f"{side}_message": t["message"] for side, t in (("patched", a), ("upstream", b))
                    if t.get("message")})
        if row["verdict"] == "not applicable":
            kinds = {classify(m, plan.trees[label].standin_rows) for label, m in (("patched", a["message"]),
                                                                                   ("upstream", b["message"]))}
            row["why"], row["reason"] = min(kinds, key=lambda k: _KIND_ORDER.index(k[0]))
        rows.append(row)
    return rows


def _group(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in rows:
        out.setdefault(r.get("patched_message") or r.get("upstream_message") or "", []).append(r["id"])
    return out


def _findings(rows: list[dict[str, Any]], collect_only: bool) -> tuple[list[str], list[str]]:
    """The verdicts as problems and notes."""
    problems: list[str] = []
    notes: list[str] = []
    regressed = [r["id"] for r in rows if r["verdict"] == "regressed"]
    if regressed:
        problems.append(f"{len(regressed)} upstream test(s) {'collect' if collect_only else 'pass'} on the unpatched "
                        f"tree and not on the patched one: {', '.join(regressed[:10])}")
    for r in (r for r in rows if r["verdict"] == "not applicable"):
        if r["why"] == "stand-in":
            problems.append(f"{r['id']}: not collected on either tree: {r['reason']} (add it in {STANDINS_FILE})")
        elif r["why"] == "environment":
            line = f"{r['id']}: not applicable to this environment: {r['reason']}"
            (notes if collect_only else problems).append(
                line + ("" if collect_only else " (install it where the tests run)"))
        else:
            notes.append(f"{r['id']}: not applicable to this tree: {r['reason']}")
    for message, ids in _group([r for r in rows if r["verdict"] == "both fail"]).items():
        notes.append(f"both fail ({len(ids)}): {message} [{', '.join(ids[:4])}{' ...' if len(ids) > 4 else ''}]")
    for message, ids in _group([r for r in rows if r["verdict"] == "both skipped"]).items():
        notes.append(f"both skipped ({len(ids)}): {message}")
    for v in ("fixed", "differs"):
        ids = [r["id"] for r in rows if r["verdict"] == v]
        if ids:
            notes.append(f"{v} ({len(ids)}): {', '.join(ids[:10])}")
    return problems, notes


def build_report(command: str, plan: Plan, prep: Prepared, device: dict[str, Any], passes: Passes,
                 collect_only: bool) -> dict[str, Any]:
    patched, upstream = passes.get("patched"), passes.get("upstream")
    rows = compare(patched, upstream, plan, collect_only) if patched else []
    problems, notes = _findings(rows, collect_only)
    for label, tp in plan.trees.items():  # a module no stand-in provides, what a stand-in withholds
        for row in tp.standin_rows:
            if row.get("no_standin"):
                problems.append(f"{label}: upstream's tests import {', '.join(row['no_standin'])} from "
                                f"{row['module']}, which no c128patch stand-in provides (add it in {STANDINS_FILE})")
            if row.get("withheld") and row.get("reason"):
                notes.append(f"{label}: stand-in {row['module']} withholds {', '.join(row['withheld'])}: "
                             f"{row['reason']}")
    problems[:0] = [x for p in passes.values() for x in pass_problems(p, collect_only, outcomes=False)]
    if not plan.selection.files:
        problems.append("no upstream test selected (nothing under the tests' scope reaches what the series touches)")
    if patched and not patched["timed_out"]:
        if collect_only and not any(r["patched"] == "not run" for r in rows):
            problems.append("no upstream test could be collected on the patched tree")
        elif not collect_only and patched["counts"]["passed"] == 0:
            problems.append("no upstream test passed on the patched tree")
    if prep.record is None:
        notes.append(NO_RECORD)
    report = report_head(command, "upstream-suite collect-only" if collect_only else "upstream-suite", prep, device,
                         passes)
    files = [{"file": f.rel, "sha256": hashlib.sha256(f.path.read_bytes()).hexdigest()} for f in plan.selection.files]
    return report | {
        "tests_from": plan.sources, "selection": plan.selection.to_json(), "files": files,
        "trees": {label: tp.to_json() for label, tp in plan.trees.items()},
        "counts": {v: sum(1 for r in rows if r["verdict"] == v) for v in VERDICTS},
        "patched": patched["counts"] if patched else None, "upstream": upstream["counts"] if upstream else None,
        "tests": rows, "problems": problems, "notes": notes, "ok": not problems and upstream is not None,
    }


def result_file(report: dict[str, Any], date: str | None = None) -> dict[str, Any]:
    """The per-release result the evidence matrix reads (ci/gpu/results/<rev>/upstream-suite.json)."""
    prov = report.get("provenance") or {}
    upstream = prov.get("upstream", {})
    device = report["device"]
    standins = {label: [{k: r[k] for k in ("module", "offered", "withheld", "used", "used_in_functions") if k in r}
                        for r in t["standins"] if r["used"] or r.get("used_in_functions")]
                for label, t in report["trees"].items()}
    messages = ("patched_message", "upstream_message")  # only where the verdict is not "same"
    tests = [{k: r[k] for k in ("id", "patched", "upstream", "verdict", "reason", *messages)
              if k in r and (k not in messages or r["verdict"] != "same")} for r in report["tests"]]
    return {"schema": RESULT_SCHEMA, "kind": "upstream-suite", "column": "upstream's own tests",
            "rev": upstream.get("rev"), "upstream_commit": upstream.get("commit"), "series": report.get("series"),
            "mode": report["mode"], "command": report["command"],
            "device": describe(device) + (f" (sm_{device['capability'].replace('.', '')})"
                                          if device.get("capability") else ""),
            "date": date or datetime.date.today().isoformat(),
            "tests_from": {k: v for k, v in report["tests_from"].items() if k != "root"}, "files": report["files"],
            "standins": standins, **{k: report[k] for k in ("counts", "patched", "upstream")}, "tests": tests,
            **{k: report[k] for k in ("problems", "notes", "ok")}}


def write(report: dict[str, Any], out: Path) -> Path:
    write_json_atomic(out / RESULT, result_file(report))
    return write_json_atomic(out / REPORT, report)


def _planned(opts: KernelOptions, tests: Path | None) -> tuple[KernelOptions, Path]:
    """Both trees side by side, the inputs checked and the test root found, before anything slow."""
    opts = replace(opts, differential=True, suite=validate(opts))
    if opts.tree is None and tests is None:
        raise C128Error("smoke upstream with --wheel: pass --tests PATH (the test/ folder of an sglang checkout)")
    return opts, sel.test_root(tests, resolve_tree(opts.tree) if opts.tree else Path.cwd())


@contextlib.contextmanager
def _prepared(opts: KernelOptions, root: Path, progress: Progress) -> Iterator[tuple[Prepared, Plan]]:
    """Both trees (even for --list) and the plan (what each tree needs; no process started); temp folders removed."""
    with prepare(replace(opts, collect_only=False), progress) as prep:
        assert prep.upstream is not None
        pool = sel.standin_pool(prep.suite)
        targets = sel.series_targets(prep.patched, prep.upstream, sel.touched_files(prep.record))
        selection = sel.select(root, prep.patched, targets, set(pool), opts.keyword)
        plan = Plan(root, selection, prep.suite / "harness.py", pool, sources=sources_of(root))
        for label, tree in (("patched", prep.patched), ("upstream", prep.upstream)):
            closure = sel.closure(sel.ModuleIndex(tree), selection.files, set(pool))
            standins, rows = sel.standin_plan(tree, pool, closure.standin_uses, closure.standin_uses_lazy)
            plan.trees[label] = TreePlan(tree, closure, standins, rows)
        progress(f"{len(plan.selection.files)} of {plan.selection.scanned} upstream test files selected under "
                 f"{plan.root}")
        yield prep, plan


def stage_run(opts: KernelOptions, tests: Path | None, dest: Path,
              progress: Progress) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Both trees (the kernel tier's subset + what the tests import) and the selected tests (with their conftest.py
    files and sibling helpers) under ``dest``, to carry to a GPU machine; (staged, selection)."""
    opts, root = _planned(opts, tests)
    with _prepared(opts, root, progress) as (prep, plan):
        trees = {label: tp.root for label, tp in plan.trees.items()}
        extra = {label: tp.closure.files(sel.ModuleIndex(tp.root)) + sel.standin_files(tp.root, plan.pool)
                 for label, tp in plan.trees.items()}
        staged: dict[str, Any] = stage(prep.suite, trees, dest, lambda label, _root: extra[label])
        files = [p.relative_to(plan.root) for test in plan.selection.files
                 for p in (test.path, *sel.conftests(test, plan.root), *test.siblings)]
        staged[STAGED_TESTS] = copy_files(plan.root, files, dest / STAGED_TESTS)
        sources = plan.sources.get("sources", {}) | {k: plan.sources[k] for k in ("git_commit",) if k in plan.sources}
        if sources:
            (dest / STAGED_TESTS / SOURCES).write_text(json.dumps(sources, indent=1, sort_keys=True) + "\n")
        return {k: {**v, "path": str(dest / k)} for k, v in staged.items()}, plan.selection.to_json()


def run(opts: KernelOptions, tests: Path | None, command: str, progress: Progress,
        parallel_trees: bool = False) -> tuple[dict[str, Any], Path]:
    """Upstream's tests on both trees, in turn or (``parallel_trees``) at once; the report and its path."""
    opts, root = _planned(opts, tests)
    device = {} if opts.collect_only else require_device(opts.python)
    verb = "collecting" if opts.collect_only else "running"

    def announce(group: list[PassSpec]) -> None:
        progress(f"{verb} upstream's tests on " + " and, at the same time, ".join(f"{s.label} ({s.tree})"
                                                                                 for s in group))

    with _prepared(opts, root, progress) as (prep, plan), \
            interrupted_out(out := out_dir(opts.out, "upstream-suite"), opts.out):
        specs = [pass_spec(plan, label, opts) for label in ("patched", "upstream")]
        return run_groups([specs] if parallel_trees else [[s] for s in specs], plan.root, opts.python, out, announce,
                          lambda passes: build_report(command, plan, prep, device, passes, opts.collect_only), write)
