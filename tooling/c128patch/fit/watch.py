"""``watch``: does the series still carry onto an upstream rev? Classify, prove, report; never touch the user's tree.

On a scratch clone of upstream (objects shared) and a private copy of the series: apply at the base
(``ops.apply``), rebase onto REV (``ops.rebase``: strict, 3-way, the ledger; entries upstream holds
dropped as proposals), prove it (``ops.equivalence``), then ``lint``, the gate ``audit``, the CPU tree
checks (``fit.treecheck.check_tree``), the API contract (``fit.contract``, against ``patches/contract.lock``) and
the behavioural tier (``fit.treecheck``, in its sealed box; ``run=False`` skips it). The outcome:

* ``clean`` (0): every entry applies strictly on REV;
* ``refreshed`` (3): entries needed a 3-way merge or a ledger resolution, all proven; the refreshed
  series (``ops.refresh``) is written to ``OUT/series/`` and verified (applies strictly at REV, the
  same tree as the rebase, a ``refresh --check`` fixed point);
* ``merged`` (4): entries upstream holds on content evidence (``ops.merged``); the proposed series goes
  to ``OUT/series/`` for a human to adopt or not;
* ``conflict`` (5): entries that stop the rebase, each with its file, hunks and the upstream commits
  that touched them (``ops.conflicts``); the rebase skips past each stop, so one report lists them all;
* ``failed`` (6): carried, but not proven, the refreshed series does not verify, or a check has findings;
* ``broken`` (7): carried, but the contract (a name gone, a call that does not bind, a signature
  changed since the lock), the nvcc probe, a copy upstream made of what we patch without our hooks
  (``fit.copies``; ``fit.bisect.fit_check`` runs these three) or the behavioural tier fails on REV;
* ``unchecked`` (8): it would be ``clean`` but the C++ side or the behavioural tier was not checked here,
  upstream copied what we patch (with our hooks: a warning, printed first), or changed a file our code mirrors
  with nothing to check (the lock's kind ``file``: until reviewed and accepted).

Conflict > broken > failed > merged > refreshed > unchecked. For ``conflict`` and ``broken``, ``bisect``
(``fit.bisect``, at most ``BISECT_TIMEOUT`` s) names the first upstream commit that broke it. Every
outcome writes ``OUT/watch-report.md``/``.json`` and the rebase's report; ``refreshed`` and ``merged``
also ``OUT/commit-message.txt``. ``OUT`` must be new, empty, or hold an earlier watch report. Past
``timeout`` s the work stops (SIGALRM), the report says where, and ``WatchTimeout`` (exit 124) is
raised. Bad input raises before anything is written (exit 2).
"""
from __future__ import annotations

import contextlib
import shutil
import signal
import threading
import time
from dataclasses import asdict
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator

from c128patch import SCHEMA_VERSION, exitcodes
from c128patch.errors import C128Error, ConflictError, DifferenceError, Interrupted
from c128patch.fit import bisect as bisect_ops
from c128patch.fit import contract as contract_ops
from c128patch.fit import copies
from c128patch.fit import treecheck as tier_ops
from c128patch.fit.sandbox import NOTICE, interpreter
from c128patch.fit.watch_report import WORK_TREE, commit_message, headline, render
from c128patch.git import Git, starved
from c128patch.jsonio import write_json_atomic
from c128patch.ops import refresh as refresh_ops
from c128patch.ops.applier import Apply
from c128patch.ops.audit import audit_branch
from c128patch.ops.equivalence import tree_without_provenance
from c128patch.ops.lint import lint_stack
from c128patch.ops.merged import CONTENT
from c128patch.ops.rebase import Rebase
from c128patch.ops.rebase_report import render_markdown
from c128patch.ops.replay import branch_commits
from c128patch.ops.treestate import git_command
from c128patch.procs import scratch
from c128patch.progress import NullReporter, Reporter, echo
from c128patch.series.layers import layer_folders, layer_rows, stack
from c128patch.series.manifest import Series, installed, load_series
from c128patch.textsafe import decoded, one_line, shell_quote
from c128patch.upstream import local_repo
from c128patch.upstream.source import Target, Upstream, open_upstream

EXIT: dict[str, int] = exitcodes.WATCH
REPORT = "watch-report.json"
WRITTEN = ("watch-report.md", REPORT, "rebase-report.md", "rebase-report.json", "commit-message.txt", "series",
           ".gitignore")
BISECT_TIMEOUT = 300.0  # seconds `watch` gives `bisect` for a conflict or broken outcome
BRANCH, VERIFY_BRANCH = "c128patch-watch", "c128patch-watch-verify"


class WatchTimeout(C128Error):
    """The time bound passed; the report says where the work was."""

    exit_code = exitcodes.TIMEOUT


class _OutOfTime(BaseException):
    """The alarm: not a C128Error, so no step takes it for a finding; ``watch`` makes it ``WatchTimeout``."""


@contextlib.contextmanager
def deadline(seconds: float | None, where: Callable[[], str]) -> Iterator[None]:
    """Raise ``_OutOfTime`` in the main thread after ``seconds``; an earlier alarm is put back with its time left."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum, frame) -> None:  # noqa: ANN001
        raise _OutOfTime(f"watch timed out after {seconds:g} s while {where()}")

    start = time.monotonic()
    old_handler = signal.signal(signal.SIGALRM, fire)
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if old_delay:
            signal.setitimer(signal.ITIMER_REAL, max(old_delay - (time.monotonic() - start), 0.001), old_interval)


def copy_series_root(series: Series, dest: Path) -> Series:
    """The series folder (``patches/``, its overlays' folders) copied to ``dest``, each layer to ``layers/<name>``."""
    parts = [(series.ours, dest), *((layer, dest / "layers" / layer.name) for layer in series.layers)]
    for part, to in parts:
        tops = {"patches"} | {PurePosixPath(e.source).parts[0] for e in part.entries if not e.is_patch}
        for top in sorted(tops):
            if (part.root / top).is_dir():
                shutil.copytree(part.root / top, to / top, symlinks=True)
    return stack(load_series(dest), [to for _, to in parts[1:]])


def _q(value: object) -> str:
    return shell_quote(str(value))


class Watch:
    def __init__(self, series: Series, repo: str | None, onto: str, out: Path, *, primary: bool | None = None,
                 python: str | None = None, run_code: bool = True, reporter: Reporter = NullReporter()) -> None:
        self.series, self.repo, self.onto, self.out, self.python = series, repo, onto, out, python
        self.run_code, self.primary, self.inner, self.last = run_code, primary, reporter, ""
        # the series and REV as a command names them: its folder (not an installed tool's: the command's default,
        # never a site-packages path) and its layers; the rev and its repository
        self.series_args = ("" if installed(series.ours.root) else f" --series {_q(series.root)}") + "".join(
            f" --layer {_q(x.root)}" for x in series.layers)
        self.rev_args = f"--sglang-rev {_q(onto)}" + (f" --repo {_q(repo)}" if repo else "")
        self.phase = "starting"
        self.started = time.monotonic()
        self.info: dict = {"onto": {"rev": onto, "commit": ""}, "base": {"rev": series.base, "commit": ""}}
        self.upstream: Upstream | None = None
        self.contract: dict | None = None  # ops.contract on the carried tree (``_contract``)
        self.behaviour: dict | None = None  # ops.treecheck on the carried tree (``_start_tier``, ``_finish_tier``)
        self.at_base: list[tuple[str, str]] = []  # each patch entry's (parent, commit) as applied at the base

    def step(self, message: str) -> None:
        """The reporter the steps get (apply's too): the last message is remembered for the timeout's."""
        self.last = message
        self.inner.step(message)

    def _step(self, phase: str) -> None:
        self.phase = phase
        self.step(phase)

    def where(self) -> str:
        return self.phase + (f" ({self.last})" if self.last and self.last != self.phase else "")

    # ------------------------------------------------------------------ the work
    def work(self, tmp: Path) -> dict:
        """Carry, prove, check and judge (module docstring): the report, the rebase's JSON under ``json``."""
        git, mine, base_commit, onto_commit = self._open(tmp)
        series = self.series
        self._step(f"applying series {series.name} {series.version} at its base {series.base}")
        try:
            applied = Apply(git, mine, self).start(Target(series.base, base_commit, self.info["upstream"]["source"]),
                                                   branch=BRANCH, fresh_clone=True)
        except C128Error as exc:
            _not_a_signal(exc)
            return {**self._report("failed", [f"the series does not apply at its own base {series.base}: "
                                              f"{exc.message}"]), "json": {}}

        patches = {e.name for e in series.entries if e.is_patch}  # what each patch entry changed at the base
        self.at_base = [(c.parent, c.sha) for c in branch_commits(git, base_commit, applied.head) if c.entry in patches]
        self._step(f"rebasing onto {self.onto}")
        final, stops, unproven = self._rebase(Rebase(git, mine), onto_commit)
        steps = list(final["entries"])
        merged = [s for s in steps if s["status"] == "dropped-as-merged" and any(sig["kind"] in CONTENT
                                                                                  for sig in s["signals"])]
        needed = [s for s in steps if s["kind"] == "entry" and s["new_sha"]
                  and (s["applied"] in ("3way", "ledger", "whitespace") or s.get("renamed"))]
        refresh_due = not stops and not unproven and bool(needed or merged)
        refreshed, checks = self._judge(git, tmp, mine, final, onto_commit, stops, refresh_due)

        problems = ([unproven] if unproven else []) + (refreshed or {}).get("problems", [])
        problems += [f"{c['name']}: {f}" for c in checks if not c["ok"] for f in c["findings"][:5]]
        broken = bool(self.contract and self.contract["broken"]) or bool(self.behaviour and self.behaviour["failed"])
        outcome = ("conflict" if stops else "broken" if broken else "failed" if problems
                   else "merged" if merged else "refreshed" if needed else "unchecked" if self.unchecked() else "clean")
        report = self._report(outcome, problems, final, stops, merged, needed, checks, refreshed)
        if outcome in ("conflict", "broken"):  # fit.bisect; behaviour: the break is the tier's alone, each step runs it
            self._step(f"bisecting {series.base}..{self.onto} (at most {BISECT_TIMEOUT:g} s)")
            behaviour = outcome == "broken" and self.run_code and not (self.contract or {}).get("broken")
            try:
                found = bisect_ops.bisect(series, self.repo, self.onto, timeout=BISECT_TIMEOUT, behaviour=behaviour,
                                          python=self.python)
            except C128Error as exc:
                _not_a_signal(exc)
                found = {"found": False, "summary": f"bisect: {exc.message}"}
            report["bisect"] = {**found, "bound_s": BISECT_TIMEOUT}
        report["json"] = final
        return report

    def _open(self, tmp: Path) -> tuple[Git, Series, str, str]:
        """Upstream opened, both revs resolved (bad input raises here), a scratch clone and a copy of the series."""
        series = self.series
        if not series.base:
            raise C128Error(f"{series.manifest_path} names no base: watch applies the series there first")
        self._step(f"opening upstream ({self.repo or 'the sglang release wheels'})")
        upstream = open_upstream(self.repo, [series.base, self.onto] if self.repo is None else [], self)
        upstream.update()
        self.upstream = upstream
        base_commit, onto_commit = upstream.resolve(series.base), upstream.resolve(self.onto)
        self.info.update(onto={"rev": self.onto, "commit": onto_commit},
                         base={"rev": series.base, "commit": base_commit},
                         upstream={"source": upstream.kind, "location": upstream.location})

        self._step("cloning upstream into a scratch folder")
        self.source = upstream.git.git_dir or Path(upstream.git.out("rev-parse", "--absolute-git-dir"))
        Git().run("clone", "--quiet", "--no-checkout", "--shared", "--", str(self.source), str(tmp / "tree"))
        return Git(worktree=tmp / "tree"), copy_series_root(series, tmp / "series"), base_commit, onto_commit

    def _judge(self, git: Git, tmp: Path, mine: Series, final: dict, onto_commit: str, stops: list[dict],
               refresh_due: bool) -> tuple[dict | None, list[dict]]:
        """The refreshed series (when due) and the checks; sets ``contract`` and ``behaviour`` (not run past a stop)."""
        head = final["head"]
        refreshed: dict | None = None
        checked = mine
        # the behavioural tier imports from the work tree: started now (it runs while lint, the audit and the
        # contract do), or after a refresh, whose verifying apply checks out another branch there
        pending = None if stops or refresh_due else self._start_tier(git, mine, onto_commit, head)
        try:
            if refresh_due:
                refreshed, checked = self._refresh(git, tmp, final, onto_commit, head)
                pending = self._start_tier(git, mine, onto_commit, head)
            checks = self._checks(git, checked, onto_commit, head, list(final["entries"]), bool(stops))
            self.contract = None if stops else self._contract(git, onto_commit, head)
            self.behaviour = None if stops else self._finish_tier(pending)
        finally:
            if isinstance(pending, tier_ops.Pending):
                pending.kill()
        return refreshed, checks

    # -- broken: the series carries, but does not fit (ops.contract, ops.treecheck)
    def _contract(self, git: Git, onto_commit: str, head: str) -> dict:
        """``fit.bisect.fit_check`` on the carried tree (what each bisect step runs), with the commands for it."""
        self._step(f"API contract, nvcc signature probe and copies of what we patch on {self.onto}")
        base = self.info["base"]["commit"]
        fix = f"c128patch contract {self.rev_args} --series {_q(self.series.root)}"  # see every item, then accept
        review = contract_ops.Review(str(self.source), onto_commit[:12], f"{fix} --accept")  # (the scratch clone goes)
        try:
            ours = copies.hooked(git, self.at_base) if onto_commit != base else []  # (no range: no copies)
            fit = bisect_ops.fit_check(self.series, git, base, onto_commit, head, ours, review)
        except C128Error as exc:
            _not_a_signal(exc)
            return {"broken": True, "verdict": exc.message, "failing": [exc.message], "next": [], "json": {}}
        nxt = [f"{fix} --verbose", "# fix what it names (a copy of a file we patch: carry our hooks there too); for "
               "a changed signature that still fits, after review:", f"{fix} --accept"]
        return {**fit, "next": nxt if fit["failing"] else []}

    def _start_tier(self, git: Git, series: Series, onto_commit: str, head: str) -> tier_ops.Pending | str:
        """``fit.treecheck`` (gates off and on) on the carried tree, started; a str says why it did not start."""
        if self.run_code:  # said as it starts, on a terminal or not (a step line off one shows only at the beat)
            echo(f"watch {NOTICE}")
        self._step(f"behavioural tier on {self.onto} (started, in the sealed box)" if self.run_code else
                   f"behavioural tier on {self.onto}: --no-run, the target's code is not run (unchecked)")
        try:
            git.run("checkout", "--quiet", "--force", "--detach", head)
            return tier_ops.Pending(series, git.worktree, git.changed_files(onto_commit, head), python=self.python,
                                    run_code=self.run_code, reporter=self)
        except C128Error as exc:
            _not_a_signal(exc)
            return exc.message

    def _finish_tier(self, pending: tier_ops.Pending | str | None) -> dict:
        """The tier's result: failing modules make the outcome broken; what it could not run, unchecked."""
        self._step(f"behavioural tier on {self.onto}")
        try:
            if not isinstance(pending, tier_ops.Pending):
                raise C128Error(pending or "not started")
            result = pending.finish()
        except C128Error as exc:
            _not_a_signal(exc)
            return {"ok": False, "ran": False, "verdict": f"not run: {exc.message}", "failed": [], "not_checked": [],
                    "unchecked": [f"behavioural tier: not run: {exc.message}"], "json": {}}
        data = result.to_json()
        whole = [] if result.checked else [f"behavioural tier: {result.verdict()}"]
        return {"ok": data["ok"], "ran": result.ran, "verdict": data["verdict"], "failed": data["failed"],
                "not_checked": data["not_checked"], "unchecked": whole, "env": data["env"],
                "modules": data["modules"], "json": data}

    def unchecked(self) -> list[str]:
        """What could not be checked here, one line each (a copy of what we patch, an upstream file we mirror changed
        since the lock, no nvcc, no torch, the tier did not run): never clean."""
        probe = [f"C++: {self.contract.get('cxx_probe', 'not checked')}"] if self.contract and self.contract.get(
            "cxx_probe_ok") is None else []
        return [*(self.contract or {}).get("copies", []), *(self.contract or {}).get("unchecked", []), *probe,
                *(self.behaviour or {}).get("unchecked", [])]

    def _rebase(self, rb: Rebase, onto_commit: str) -> tuple[dict, list[dict], str]:
        """Rebase with every entry upstream holds dropped; past each stop, skip and go on."""
        stops: list[dict] = []
        verb: Callable[[], dict] = lambda: rb.start(self.onto, onto_commit, drop_merged=True)  # noqa: E731
        while True:
            try:
                return verb(), stops, ""
            except DifferenceError as exc:
                return exc.report, stops, exc.message
            except ConflictError as exc:  # the entry that stopped it, as the report lists it (its step as left)
                step = next((e for e in (exc.report or {}).get("entries", []) if e.get("status") == "failing"), {})
                stop = step.get("stop") or {}
                stops.append({
                    "entry": step.get("name", "?"), "message": exc.message, "detail": step.get("detail", ""),
                    "file": stop.get("file", step.get("file", "")), "chosen_by": step.get("chosen_by", ""),
                    "blocks": stop.get("blocks", []), "resolved_by_ledger": stop.get("resolved", []),
                    "unresolved": stop.get("unresolved", []), "paths": stop.get("paths", []),
                    "upstream_commits": step.get("upstream_commits", []), "hints": step.get("hints", []),
                    "taken": stop.get("taken") or {}, "after_skipping": [s["entry"] for s in stops]})
                self._step(f"rebasing onto {self.onto}: past the conflict in {stops[-1]['entry']}")
                verb = rb.skip

    def _refresh(self, git: Git, tmp: Path, final: dict, onto_commit: str, head: str) -> tuple[dict, Series]:
        """The series refreshed from the rebased branch, then verified on a fresh apply at REV."""
        self._step("refreshing the series from the rebased branch")
        target = copy_series_root(self.series, tmp / "refreshed")
        label = refresh_ops.base_label(git, onto_commit, self.onto)
        tagged = label in git.lines("tag", "--points-at", onto_commit)
        primary = self.primary if self.primary is not None else (final["direction"] == "forward" and tagged)
        info = {"mode": "primary" if primary else "variant", "label": label, "changed": [], "notes": [],
                "version": target.version, "base": target.base, "problems": [], "path": "series",
                "applies_strictly": False, "same_tree": False, "fixed_point": False}
        try:
            export = refresh_ops.export(target, git, primary=primary, lock_items=contract_ops.lock_items)
            info["changed"], info["notes"] = refresh_ops.write(target, export), export.notes
        except C128Error as exc:
            _not_a_signal(exc)
            info["problems"].append(f"refresh of the rebased branch refused: {exc.message}")
            return info, target
        new = stack(load_series(target.root), layer_folders(target))
        info.update(version=new.version, base=new.base, layers=layer_rows(new))
        changed = [target.root / c for c in info["changed"]]  # (relative to the copy's root, a layer's under it)
        theirs = [layer for layer in new.layers if any(c.is_relative_to(layer.root) for c in changed)]
        info["parts"] = [f"series {new.name} {new.version}"] * any(
            not any(c.is_relative_to(layer.root) for layer in new.layers) for c in changed) + [
            f"layer {layer.name} {layer.version}" for layer in theirs]

        self._step(f"verifying the refreshed series on {self.onto}")
        problems = info["problems"]
        try:
            applied = Apply(git, new).start(Target(self.onto, onto_commit), branch=VERIFY_BRANCH)
        except C128Error as exc:
            _not_a_signal(exc)
            problems.append(f"the refreshed series does not apply on {self.onto}: {exc.message}")
            return info, new
        loose = [r["name"] for r in applied.entries if r["status"] != "skipped" and r.get("applied") != "clean"]
        if loose:
            problems.append(f"the refreshed series does not apply strictly on {self.onto}: {', '.join(loose)}")
        info["applies_strictly"] = not loose
        info["verify_proof"] = applied.equivalence.get("summary", "")
        ours = tree_without_provenance(git, applied.head, tmp / "a.index")
        rebased = tree_without_provenance(git, head, tmp / "b.index")
        info["same_tree"] = ours == rebased
        if not info["same_tree"]:
            problems.append(f"the refreshed series applied on {self.onto} gives tree {ours[:12]}, the proven rebase "
                            f"gave {rebased[:12]}")
        again = refresh_ops.export(new, git, lock_items=contract_ops.lock_items).changes(new.root)
        info["fixed_point"] = not again
        if again:
            problems.append(f"refresh --check on the refreshed series would change {', '.join(again)}")
        return info, new

    def _checks(self, git: Git, series: Series, onto_commit: str, head: str, steps: list[dict],
                stopped: bool) -> list[dict]:
        """lint and the gate audit of the series carried to REV; the tree checks of the rebased tree."""
        self._step("lint")
        findings = lint_stack(series, git)
        errors = [f"{f.entry}: {f.message}" for f in findings if f.level == "error"]
        out = [{"name": "lint", "ok": not errors, "findings": errors,
                "notes": [f"{f.entry}: {f.message}" for f in findings if f.level != "error"]}]
        if stopped:
            return out + [{"name": name, "ok": True, "findings": [],
                           "notes": [f"not run: the series does not carry onto {self.onto}"], "skipped": True}
                          for name in ("audit", "no-conflict-markers", "python-compiles", "gates-declared")]
        self._step(f"gate audit on {self.onto}")
        try:
            audit = [str(f) for f in audit_branch(series, git, onto_commit, head)]
        except C128Error as exc:
            _not_a_signal(exc)
            audit = [exc.message]
        out.append({"name": "audit", "ok": not audit, "findings": audit, "notes": []})
        self._step("tree checks")
        carried = {s["name"] for s in steps if s["kind"] == "entry" and s["new_sha"]}
        gates = [e.gate for e in series.entries if e.name in carried and e.gate]
        out += [asdict(c) for c in tier_ops.check_tree(git, onto_commit, head, gates)]
        return out

    # ------------------------------------------------------------------ the report
    def reproduce(self) -> list[str]:
        """Commands that replay this rebase in a tree of one's own (printed for a conflict)."""
        upstream, onto = self.upstream, self.info["onto"]  # both set: a conflict comes after ``_open``
        where = upstream.location if upstream.kind == "url" else self.source
        repo = f" --repo {_q(where)}" if upstream.kind != "release" else ""
        tagged = onto["rev"] in upstream.git.lines("tag", "--points-at", onto["commit"])
        shown = one_line(onto["rev"]) == onto["rev"]  # a tag holding what no report shows (U+202E) is its commit
        target = onto["rev"] if tagged and shown else onto["commit"]
        return [f"c128patch apply --sglang-rev {_q(self.series.base)}{repo} --tree {WORK_TREE}{self.series_args}",
                f"c128patch rebase --onto {_q(target)}{repo} --tree {WORK_TREE}{self.series_args}"]

    def _report(self, outcome: str, problems: list[str], final: dict | None = None, stops: tuple = (),
                merged: tuple = (), needed: tuple = (), checks: tuple = (), refreshed: dict | None = None) -> dict:
        final = final or {}
        series, proof = self.series, final.get("equivalence") or {}
        stopped = {s["entry"]: s["detail"] for s in stops}
        rows = []
        for s in final.get("entries", []):
            if s["kind"] != "entry":
                continue
            how = ("conflict" if s["name"] in stopped else
                   "merged upstream (proposed)" if s in merged else
                   "recorded merged" if s["status"] == "dropped-as-merged" else
                   {"clean": "strict", "3way": "3-way", "ledger": "ledger", "whitespace": "whitespace-merged"
                    }.get(s["applied"], s["status"]))
            if s.get("renamed") and s["name"] not in stopped:
                how += " (renamed: " + ", ".join(f"{a} -> {b}" for a, b in s["renamed"].items()) + ")"
            rows.append({"name": s["name"], "on_rev": how, "status": s["status"], "file": s["file"],
                         "chosen_by": s["chosen_by"], "detail": stopped.get(s["name"], s["detail"]),
                         "ledger": s["ledger"], "signals": s["signals"], "renamed": s.get("renamed", {}),
                         "hints": s.get("hints", [])})
        report = {
            "ok": outcome in ("clean", "refreshed"),
            "outcome": outcome,
            "exit_code": EXIT[outcome],
            "series": {"name": series.name, "version": series.version, "base": series.base,
                       "root": str(series.root)},
            "layers": layer_rows(series),
            **self.info,
            "direction": final.get("direction", ""),
            "upstream_commits_between": final.get("upstream_commits_between", 0),
            "upstream_commits": final.get("upstream_commits", [])[:50],
            "entries": rows,
            "needed_merge": [s["name"] for s in needed],
            "conflicts": list(stops),
            "merged": [{"entry": s["name"], "signals": s["signals"], "detail": s["detail"]} for s in merged],
            "equivalence": {k: proof[k] for k in ("summary", "ok", "identical") if k in proof},
            "checks": list(checks),
            "refreshed": refreshed,
            "problems": problems,
            "contract": self.contract,
            "behaviour": self.behaviour,
            "unchecked": self.unchecked(),
            "reproduce": self.reproduce() if stops else [],
            "rebase_report": "rebase-report.md" if final else "",
            "out": str(self.out),
            "seconds": round(time.monotonic() - self.started, 1),
        }
        report["headline"] = headline(report)
        report["next"] = self._next(report)
        return report

    def _next(self, report: dict) -> list[str]:
        """What to run for this outcome (shell commands, from the series checkout)."""
        root, out = self.series.root, self.out
        adopt = [f"rm -rf {_q(root / 'patches')} && cp -R {_q(out / 'series' / 'patches')} {_q(root / 'patches')}",
                 *(f"rm -rf {_q(layer.patches_dir)} && cp -R {_q(out / 'series' / 'layers' / layer.name / 'patches')} "
                   f"{_q(layer.patches_dir)}" for layer in self.series.layers),
                 f"c128patch lint{self.series_args}",
                 f"git -C {_q(root)} add -A patches && {git_command(root)} commit -F {_q(out / 'commit-message.txt')}"]
        if installed(root):  # an installed tool's series is not written from here (refresh refuses it too)
            adopt = adopt[1:-1]
        outcome = report["outcome"]
        if outcome in ("refreshed", "merged") and report["refreshed"]:
            return adopt
        if outcome == "broken":  # the contract's commands, else the behavioural tier's on REV
            return (self.contract or {}).get("next") or [
                f"c128patch treecheck {self.rev_args}{self.series_args}",
                "# fix the overlay / patch code it names (or adapt to the upstream commit the bisect names)"]
        if outcome == "conflict":
            return [*report["reproduce"],
                    f"# resolve the files it names, `git -C {WORK_TREE} add` them, then:",
                    f"c128patch rebase --continue --tree {WORK_TREE}{self.series_args}",
                    f"c128patch refresh --tree {WORK_TREE}{self.series_args}"]
        return []

    def write(self, report: dict, tmp: Path | None) -> None:
        """Replace what an earlier watch wrote under ``out`` with this run's files (a failed write: none)."""
        out, rebase_json = self.out, report.pop("json")
        try:
            out.mkdir(parents=True, exist_ok=True)
            self._clear()
            # git ignores the folder, wherever it is: run in a tree (./c128patch-watch), it is no change of the user's
            (out / ".gitignore").write_text("# c128patch watch's reports: never part of a tree\n*\n")
            if report["refreshed"] is not None and tmp is not None:
                shutil.copytree(tmp / "refreshed", out / "series", symlinks=True)
                if report["outcome"] in ("refreshed", "merged"):  # a series to adopt: else no message proposes it
                    (out / "commit-message.txt").write_text(commit_message(report))
            if rebase_json:
                write_json_atomic(out / "rebase-report.json", decoded(rebase_json))  # (a byte no UTF-8: U+FFFD)
                (out / "rebase-report.md").write_text(render_markdown(rebase_json))
            (out / "watch-report.md").write_text(render(report))
            write_json_atomic(out / REPORT, decoded({**report, "schema": SCHEMA_VERSION}))  # as --json prints it
        except OSError as exc:
            self._clear()
            raise C128Error(f"cannot write the report under --out {out} ({exc.strerror or exc}); its report files "
                            "are removed") from None

    def _clear(self) -> None:
        for path in (self.out / name for name in WRITTEN):
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)


def watch(series: Series, repo: str | None, onto: str, out: Path, *, timeout: float | None = None,
          primary: bool | None = None, python: str | None = None, run_code: bool = True,
          reporter: Reporter = NullReporter()) -> dict:
    """Run ``watch`` (module docstring) and write its report under ``out``; returns the report."""
    out = out.resolve()  # refused (nothing written) unless new, empty or an earlier watch's output
    if out.exists() and not out.is_dir():
        raise C128Error(f"--out {out} is not a folder; pass a new or empty folder")
    if out.is_dir() and any(out.iterdir()) and not (out / REPORT).is_file():
        raise C128Error(f"--out {out} holds files that are not a c128patch watch report; pass a new or empty "
                        "folder (nothing was written)")
    python = interpreter(python, local_repo(repo)) if python else None  # from the current folder, before the work moves
    run = Watch(series, repo, onto, out, primary=primary, python=python, run_code=run_code, reporter=reporter)
    with scratch("c128watch-") as tmp:
        try:
            with deadline(timeout, run.where):
                report = run.work(Path(tmp))
        except _OutOfTime as stop:
            exc = WatchTimeout(str(stop), hint=f"  report: {out / 'watch-report.md'}\n"
                               "  nothing else was written; give it more time with --timeout SECONDS")
            report = {**run._report("timeout", [exc.message]), "phase": run.where(), "json": {}}
            run.write(report, None)
            raise exc from None
        run.write(report, Path(tmp))
    return report


def _not_a_signal(exc: C128Error) -> None:
    """A signal inside an apply or a series write of watch's own scratch (``Interrupted``: "the series is applied
    ... prove it with status --tree <scratch>") is the signal, not a finding: watch had reported `failed` (exit 6)
    naming a tree it then removed. A full disk or ``ulimit -f`` is the machine's, not a finding either: watch had
    reported `failed` (exit 6), "the series does not apply at its own base"."""
    if isinstance(exc, Interrupted):
        raise exc.stop() from None
    if starved(exc.message):
        raise C128Error(f"watch stopped: the machine, not the series ({exc.message}); no outcome: free space or raise "
                        "the limit, then run it again") from None

