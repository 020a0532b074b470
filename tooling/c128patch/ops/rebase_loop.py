"""The replay loop of a rebase (``ops.rebase``): each step on the new tip in an index of its own, every
commit dated as the new base; the branch and the work tree move only at a stop or the proven end."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Callable, NoReturn

from c128patch import procs
from c128patch.errors import C128Error, ConflictError, DifferenceError
from c128patch.git import BOT_EMAIL, BOT_NAME, Git, ReadMemo
from c128patch.ops import proofs
from c128patch.ops.conflicts import StopReport, analyze, taken
from c128patch.ops.equivalence import Equivalence, Trees, apply_cached, fresh_replay, prove, tree_diff
from c128patch.ops.merged import MergedCheck, Signal, proposes_drop, upstream_hints
from c128patch.ops.rebase_journal import DONE, Journal, Phase, Step, save_conflicts
from c128patch.ops.rebase_report import classify, range_diff_of, report_of, write_reports
from c128patch.ops.replay import FAILED, EntryCheck, RevCheck, renamed_patch_text, replay_entry, unmerged_paths
from c128patch.ops.treestate import fault_point, rebase_command, rebase_journal, remember_layers, tree_state
from c128patch.series import provenance
from c128patch.series.ledger import Ledger
from c128patch.series.manifest import Series
from c128patch.series.plan import (
    Planned,
    base_holding,
    check_paths_at,
    index_git,
    merged_entries,
    overlay_message,
    plan,
)
from c128patch.series.provenance import PROVENANCE_PATH
from c128patch.series.trailers import ENTRY_TRAILER, find_trailers
from c128patch.textsafe import shell_join
from c128patch.upstream.source import default_branch


class RebaseLoop:
    """The loop and its end; ``ops.rebase.Rebase`` adds the verbs that start, resume and undo it."""

    def __init__(self, git: Git, series: Series) -> None:
        self.git = git
        self.series = series
        self.path = rebase_journal(git)
        self.state = self.path.parent  # the reports, conflicts.json, the loop's index
        self.ledger = Ledger(series)
        self._onto_date = ""
        self._planned: dict[str, Planned] | None = None
        self._idx: Git | None = None  # the loop's index (``_reset_index``)
        self._tip_tree = ""
        self._present: set[str] = set()
        self._touched: list[str] = []
        self._hint_cache: dict[str, str] = {}
        self._mails: dict[str, Future] = {}  # entry -> its patch file's (message, author), being read
        self._pool = ThreadPoolExecutor(max_workers=1)  # the plan on the new base, beside the rebase's start
        self._plans: dict[str, Future] = {}  # commit -> the series' plan there, made once for the loop and the proof
        self._chain: list[tuple[str, EntryCheck, str, str]] = []  # (entry, row, tree before, after) of each replayed
        self.on_tip: Callable[[str, str], object] | None = None  # called with (new base, new tip) once it is made

    def _advance(self, journal: Journal, tip: str = "") -> None:
        journal.pos += 1
        journal.head_before = tip or journal.head_before
        journal.paused, journal.stop_state = "", {}
        journal.save(self.path)

    def _run(self, journal: Journal, keep: bool = False) -> dict:
        git = self.git
        planned = self._plan(journal)
        merged_here = {e.name: e for e in merged_entries(self.series, git, journal.onto_commit)}
        self._reset_index(journal)
        check = MergedCheck(git, journal.old_commit, journal.onto_commit, [s.sha for s in journal.steps],
                            self._hint_cache, self._touched)
        with ThreadPoolExecutor(max_workers=1) as pool:  # the entries' commit messages are read beside the loop
            self._mails = {s.name: pool.submit(self._mail, p.path, p.entry.name) for s in journal.steps[journal.pos:]
                           if s.kind == "entry" and s.status == "pending" and not s.user_edit
                           and (p := planned.get(s.name)) is not None and p.patch is not None}
            while journal.pos < len(journal.steps):
                step = journal.steps[journal.pos]
                if step.status in DONE:
                    self._advance(journal)
                    continue
                journal.save(self.path)
                fault_point("before", step.name)  # C128PATCH_FAULT=kill-before:<entry> (ops.treestate)
                if step.kind == "commit":
                    self._carry(journal, step)
                elif step.name in merged_here:
                    step.status = "dropped-as-merged"
                    step.detail = f"the series records it merged upstream in {merged_here[step.name].merged_in[:12]}"
                    self._advance(journal)
                else:
                    self._replay(journal, step, planned[step.name], check, keep)
                keep = False
        return self._finish(journal)

    def _older_than_its_base(self, name: str, onto_commit: str) -> str:
        """The base of entry ``name``'s own files that contains ``onto_commit`` (a backward rebase), else "": left out
        there, the entry is not merged upstream (``merged_in`` there would drop it from that base too)."""
        entry = next((e for e in self.series.entries if e.name == name), None)
        return base_holding(self.git, entry, onto_commit) if entry is not None else ""

    def _plan(self, journal: Journal) -> dict[str, Planned]:
        if self._planned is None:
            self._planned = {p.entry.name: p for p in self._planning(journal.onto_commit).result()}
        return self._planned

    def _planning(self, commit: str) -> Future:
        if commit not in self._plans:
            self._plans[commit] = self._pool.submit(plan, self.series, ReadMemo(self.git), commit)  # (probes in memory)
        return self._plans[commit]

    def _reset_index(self, journal: Journal) -> None:
        """The loop's index back at the tip's tree (it follows the tip while entries replay)."""
        idx = index_git(self.git, self.state / "rebase.index")
        idx.run("read-tree", journal.head_before)
        self._idx, self._tip_tree = idx, idx.out("write-tree")
        self._touched = sorted({path for item in self._plan(journal).values() for path in item.touched})
        self._present = set(idx.out("ls-files", "--", *self._touched).splitlines()) if self._touched else set()

    # ------------------------------------------------------------------ one step
    def _replay(self, journal: Journal, step: Step, item: Planned, check: MergedCheck, keep: bool) -> None:
        """The series' part of one entry on the tip, in the loop's index; a stop when it conflicts."""
        idx = self._idx
        assert idx is not None
        step.file, step.chosen_by = item.label, item.chosen_by
        signals = [] if keep else check.signals(item, step.sha, idx, self._present)
        row = replay_entry(self.git, item, Path(idx.env["GIT_INDEX_FILE"]), self._present, ledger=self.ledger,
                           span=journal.span, at=journal.onto_commit, series=self.series)
        tree = idx.out("write-tree") if row.status not in FAILED else ""
        if tree and tree == self._tip_tree:
            signals.append(Signal("became-empty", "replaying it on the new base changes nothing"))
        step.signals = [asdict(s) for s in signals]
        if keep and tree and "became-empty" in {s.kind for s in signals}:
            step.status, step.detail = "dropped-as-merged", "became empty on the new base"
            return self._advance(journal)
        if not keep and proposes_drop(signals):
            return self._merged(journal, step, "; ".join(s.describe() for s in signals))
        step.ledger = [r.ref for r in row.resolutions]
        step.renamed = dict(row.renamed)
        step.hints = [h.to_json() for h in upstream_hints(self.git, item.entry, item.patch, journal.old_commit,
                                                          journal.onto_commit, row.renamed, self._hint_cache,
                                                          self._touched)]
        step.signals = [s for s in step.signals if s["kind"] != "pr-hint"]  # kept: a hint, not a drop signal
        if tree:
            step.applied, step.series_tree, step.detail = row.status, tree, row.detail
            self._chain.append((step.name, row, self._tip_tree, tree))
            return self._carry(journal, step)
        text = item.path.read_text() if item.patch is not None else ""
        self._stop(journal, step, "series", renamed_patch_text(text, row.renamed) if row.renamed else text,
                   item.label, row.detail, row.conflicts or ([item.entry.target] if item.patch is None else []))

    def _merged(self, journal: Journal, step: Step, why: str) -> None:
        """An entry the content signals say upstream holds: dropped with ``--drop-merged``, else a stop."""
        step.detail = why
        self._reset_index(journal)
        if journal.drop_merged:
            step.status = "dropped-as-merged"
            return self._advance(journal)
        journal.paused, step.status = "merged", "pending"
        journal.save(self.path)
        report, tree = write_reports(self.state, report_of(self.git, journal)), self.git.worktree
        raise ConflictError(f"entry '{step.name}' looks merged upstream ({why}); nothing was dropped",
                            hint=f"  drop it: {rebase_command(tree, 'drop', step.name)}\n"
                                 f"  keep it: {rebase_command(tree, 'continue')}\n"
                                 f"  undo:    {rebase_command(tree, 'abort')}",
                            report=report)

    def _carry(self, journal: Journal, step: Step) -> None:
        """Commit a step: an entry's series part with the user's edit (if any) carried onto it, or a commit of the
        user's own (or one that cannot be compared with the series) as it is, on the tip."""
        entry = step.kind == "entry"
        tree = step.series_tree if entry else self._tip_tree
        delta = (tree_diff(self.git, step.edit_from, step.edit_to) if step.user_edit
                 else "" if entry else tree_diff(self.git, f"{step.sha}^", step.sha))
        if delta:  # applied to ``tree`` in an index of its own (strict, else 3-way); "" when it conflicts
            with procs.scratch("c128rebase-") as tmp:
                idx = index_git(self.git, Path(tmp) / "index")
                idx.run("read-tree", tree)
                tree = idx.out("write-tree") if apply_cached(idx, delta) else ""
        if not tree and entry:
            self._stop(journal, step, "user-edit", delta, f"your edit of {step.name} ({step.sha[:12]})",
                       "your edit conflicts with the series' file on the new base")
        if not tree:
            self._stop(journal, step, "carried", delta, f"commit {step.sha[:12]} {step.subject!r}",
                       "the commit does not apply on the new base")
        if step.user_edit:
            step.detail = "; ".join(filter(None, [step.detail, "your edit carried"]))
        self._commit(journal, step, tree)

    def _commit(self, journal: Journal, step: Step, tree: str) -> None:
        """Commit ``tree`` on the tip as the step's commit; the step is done."""
        git = self.git
        date = self._date(journal)
        if step.kind == "entry" and not step.user_edit and not step.file.startswith("patches/"):  # an overlay
            message, author = overlay_message(self.series.entry(step.name), self.series), (BOT_NAME, BOT_EMAIL, date)
        elif step.kind == "entry" and not step.user_edit:  # as ``git am`` would commit the step's file
            made = self._mails.get(step.name)
            message, author = (made.result() if made is not None else  # a layer's file is in its layer
                               self._mail(self.series.part(step.name)[0].root / step.file, step.name))
        else:
            message = git.run("log", "-1", "--format=%B", step.sha).stdout
            author = tuple(git.out("log", "-1", f"--format={f}", step.sha) for f in ("%an", "%ae", "%aI"))
        env = {"GIT_AUTHOR_NAME": author[0], "GIT_AUTHOR_EMAIL": author[1], "GIT_AUTHOR_DATE": author[2],
               "GIT_COMMITTER_DATE": date}
        step.new_sha = git.with_env(**env).out("commit-tree", tree, "-p", journal.head_before, input=message)
        if step.status in ("pending", "failing"):
            step.status = "resolved" if step.applied in ("resolved", "ledger") else "replayed" if step.sha else "new"
        if self._idx is not None and tree != step.series_tree:  # the loop's index follows the tip
            self._idx.run("read-tree", tree)
            self._present = set(self._idx.out("ls-files", "--", *self._present | set(self._touched)).splitlines())
        self._tip_tree = tree
        self._advance(journal, step.new_sha)

    def _date(self, journal: Journal) -> str:
        """The new base's commit date, carried by every commit the rebase makes (reproducible ids)."""
        if not self._onto_date:
            self._onto_date = self.git.out("log", "-1", "--format=%cI", journal.onto_commit)
        return self._onto_date

    def _mail(self, path: Path, name: str) -> tuple[str, tuple[str, str, str]]:
        """The message (with the entry trailer) and author ``git am`` would give the patch file at ``path``."""
        git = self.git
        with procs.scratch("c128mail-") as tmp:
            info = git.run("mailinfo", f"{tmp}/msg", f"{tmp}/patch", input=path.read_text()).stdout
            body = Path(tmp, "msg").read_text()
        fields = dict(line.split(": ", 1) for line in info.splitlines() if ": " in line)
        message = git.run("stripspace", input=f"{fields.get('Subject', name)}\n\n{body}").stdout
        if not any(k == ENTRY_TRAILER for k, _ in find_trailers(message)):  # in any spelling git reads (plan: ours)
            message += f"\n{ENTRY_TRAILER}: {name}\n"
        return message, (fields.get("Author", "c128patch"), fields.get("Email", ""), fields.get("Date", ""))

    # ------------------------------------------------------------------ stops
    def _stop(self, journal: Journal, step: Step, phase: Phase, diff: str, label: str, why: str,
              paths: list[str] | None = None) -> NoReturn:
        """Leave the conflict in the work tree (``git apply --3way``), write the reports, raise."""
        git = self.git
        if (git.head() or "") != journal.head_before or git.current_branch():
            git.run("checkout", "--quiet", "--detach", journal.head_before)  # the work tree is clean here
        if phase == "user-edit":
            git.run("read-tree", "--reset", "-u", step.series_tree)  # the series' part, then the edit on it
        proc = git.run("apply", "--3way", input=diff, check=False) if diff else None
        fault_point("at", "rebase-stop")
        conflicts = Ledger.conflicts(git, unmerged_paths(git))
        resolved = self.ledger.replay(git, step.name, conflicts, journal.span) if phase == "series" else []
        left = unmerged_paths(git)
        save_conflicts(self.state, [c for c in conflicts if c.path in left])
        stop = StopReport(step.name, phase, label, resolved=resolved, unresolved=left, paths=left or list(paths or []))
        for c in conflicts:
            if c.path in left:
                stop.blocks += analyze(git, c.path, c.text, diff, head=journal.head_before, old=journal.old_commit,
                                       onto=journal.onto_commit, rev=journal.onto_rev)
        step.stop, step.phase, step.status = asdict(stop), phase, "failing"
        step.ledger = [r.ref for r in resolved]
        step.upstream_commits = sorted({u for b in stop.blocks for u in b.upstream})
        if left:
            step.detail = f"conflicts in {', '.join(left)}"
        else:
            reason = (proc.stderr.strip().splitlines() or [why])[-1] if proc is not None else why
            step.detail = f"{why}: {reason.removeprefix('error: ')}" if reason != why else why
        item = self._plan(journal).get(step.name) if phase == "series" else None
        if item is not None and item.patch is None and stop.paths == [item.entry.target]:  # upstream's own file there
            found = taken(git, self.series, item.entry, journal.old_commit, journal.onto_commit)
            step.stop["taken"] = asdict(found)
            extra = found.lines(rebase_command(git.worktree, "continue"),
                                rebase_command(git.worktree, "drop", step.name))
        else:
            extra = [h["line"] for h in step.hints]
        journal.paused = "conflict"
        journal.stop_state = tree_state(git)
        journal.save(self.path)
        report = write_reports(self.state, report_of(git, journal))
        tree, where = git.worktree, "\n".join(f"  {line}" for line in stop.lines() + extra)
        older = self._older_than_its_base(step.name, journal.onto_commit) if phase == "series" else ""
        raise ConflictError(  # where it conflicts and what the user can do next
            f"entry '{step.name}' conflicts on {journal.onto_rev}"
            + (f" in {', '.join(left)}" if left else f": {step.detail}")
            + (f" ({'your edit' if phase == 'user-edit' else 'your commit'})" if phase != "series" else ""),
            hint=((where + "\n") if where else "")
            + f"  resolve: edit the files, `{shell_join(['git', '-C', str(tree), 'add'])}` them, then "
              f"{rebase_command(tree, 'continue')}\n"
            + (f"  leave it out on {journal.onto_rev} (older than its base {older}; not merged upstream, it is kept "
               f"for the releases it applies to): {rebase_command(tree, 'skip')}\n" if older else
               f"  drop it: {rebase_command(tree, 'skip')}\n")
            + (f"  merged upstream: {rebase_command(tree, 'drop', step.name)} (drops it as merged, with merged_in)\n"
               if step.hints and phase == "series" and not older else "")
            + f"  undo:    {rebase_command(tree, 'abort')} (back to {journal.orig_branch or journal.orig_head[:12]})\n"
              f"  report:  {self.state / 'rebase-report.md'}",
            report=report)

    # ------------------------------------------------------------------ the end
    def _finish(self, journal: Journal) -> dict:
        """The provenance commit on the new tip, the branch moved there, proven; the journal forgotten."""
        git = self.git
        classify(git, journal.steps)
        blob = git.out("hash-object", "-w", "--stdin", input=provenance.dumps(self._record(journal)))
        with procs.scratch("c128rebase-") as tmp:  # the provenance commit, the work tree untouched
            idx = index_git(git, Path(tmp) / "index")
            idx.run("read-tree", journal.head_before)
            idx.run("update-index", "--add", "--cacheinfo", f"100644,{blob},{PROVENANCE_PATH}")
            tree = idx.out("write-tree")
        date = self._date(journal)
        message = (f"c128patch: provenance (series {self.series.name} rebased onto {journal.onto_rev})\n\n"
                   f"{ENTRY_TRAILER}: provenance\n")
        new_head = git.with_env(GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date).out(
            "commit-tree", tree, "-p", journal.head_before, input=message)
        if self.on_tip is not None:
            self.on_tip(journal.onto_commit, new_head)
        carried = {s.new_sha for s in journal.steps if s.new_sha and (s.kind == "commit" or s.user_edit)}
        known: list[tuple[RevCheck, str, Trees]] = []  # the fresh replay: the loop's own, else one made now

        def proving() -> Equivalence:
            known.append(self._chained(journal) or fresh_replay(
                self.series, git, journal.onto_rev, journal.onto_commit, span=journal.span, without=journal.left_out,
                planned=None if journal.left_out else list(self._plan(journal).values())))
            return prove(self.series, git, journal.onto_rev, journal.onto_commit, new_head, fresh=known[0],
                         accept=lambda e: e.commit.sha in carried, span=journal.span, without=journal.left_out)

        with ThreadPoolExecutor(max_workers=2) as pool:  # the proof reads objects only: it runs beside the checkout
            proof_made = pool.submit(proving)
            ranged = pool.submit(range_diff_of, git, journal, new_head)
            fault_point("at", "rebase-checkout")
            git.run("checkout", "--quiet", "--detach", new_head)  # the work tree is clean here
            if git.out("ls-files", "-t", "--", PROVENANCE_PATH).startswith("S "):  # (h140 case 35)
                # a sparse checkout left the provenance out of the tree (status: "no series applied"): written, as
                # apply's `add` leaves it
                git.run("update-index", "--no-skip-worktree", "--", PROVENANCE_PATH)
                git.run("checkout-index", "--force", "--", PROVENANCE_PATH)
            renamed = self._move_branch(journal, new_head)
            proof, range_diff = proof_made.result(), ranged.result()
        if proof.identical and not journal.left_out:  # what `status` proves (the whole series): recorded for it
            proofs.record(self.state, proofs.proof_key(git, self.series, journal.onto_rev, journal.onto_commit,
                                                       new_head), proof.to_json(), known[0][2])
        if proof.ok and renamed and git.current_branch() != renamed:  # named after its new base; the old tip stays
            git.run("update-ref", "-m", f"c128patch rebase onto {journal.onto_rev}", f"refs/heads/{renamed}", new_head,
                    "0" * 40)  # at the recovery ref
            self._attach(journal, renamed)
            git.run("update-ref", "-d", f"refs/heads/{journal.orig_branch}", new_head)
        report = report_of(git, journal, new_head, proof, range_diff)
        if renamed and git.current_branch() == renamed:
            report["branch"], report["renamed_branch"] = renamed, {"from": journal.orig_branch, "to": renamed}
        elif proof.ok and (rename := self._rename_hint(journal)):
            report["branch_keeps_name"] = rename
        elif proof.ok and (taken := self._taken_hint(journal)):  # c128/<new base> is another branch: not moved
            report["branch_name_taken"], report["branch_keeps_name"] = taken
        write_reports(self.state, report)
        remember_layers(git, self.series, self.state)  # the stack the new tip's provenance names (a c128patch.toml's)
        self._forget()
        if not proof.ok:
            shown = "\n".join(f"  {h.path} {h.header}" for d in proof.unattributed for h in d.hunks[:20])
            undo = shell_join(["git", "-C", str(git.worktree), "reset", "--hard", journal.recovery_ref])
            kept = f"{journal.orig_branch or 'HEAD'} is kept as it is (report: {self.state / 'rebase-report.md'})"
            raise DifferenceError(f"rebase onto {journal.onto_rev} finished, but the tree is not proven: "
                                  f"{proof.summary()}", hint=f"{shown}\n  {kept}\n  undo: {undo}", report=report)
        return report

    def _chained(self, journal: Journal) -> tuple[RevCheck, str, Trees] | None:
        """``fresh_replay``'s answer from the loop's replay where this process replayed every entry of the series,
        each on the series' tree the one before left, from the new base's (else None: the proof replays it)."""
        planned, chain = self._plan(journal), self._chain
        trees = [self.git.out("rev-parse", f"{journal.onto_commit}^{{tree}}")] + [after for *_, after in chain]
        names, befores = [c[0] for c in chain], [c[2] for c in chain]
        if names != [e.name for e in self.series.entries] or names != list(planned) or befores != trees[:-1]:
            return None
        try:  # what the fresh replay refuses, the proof does too
            check_paths_at(self.git, journal.onto_commit, [p for p in planned.values() if p.patch is not None])
        except C128Error as exc:
            return RevCheck(journal.onto_rev, journal.onto_commit, ok=False, error=exc.message), trees[0], {}
        return (RevCheck(journal.onto_rev, journal.onto_commit, entries=[c[1] for c in chain]), trees[-1],
                {name: (before, after) for name, _, before, after in chain})

    def _forget(self) -> None:
        """The journal and the stop's saved conflicts gone: no rebase is in progress."""
        self.path.unlink()
        (self.state / "conflicts.json").unlink(missing_ok=True)

    def _record(self, journal: Journal) -> dict:
        """The new tip's provenance: the old record on the new base, what was carried and dropped."""
        kept = [s for s in journal.steps if s.new_sha]
        planned = self._plan(journal)
        items = [planned[s.name] for s in kept if s.kind == "entry" and s.name in planned]
        results = [{"name": s.name, "applied": s.status, "commit": s.new_sha} for s in kept]
        upstream = {**journal.upstream, "rev": journal.onto_rev, "commit": journal.onto_commit}
        record = provenance.build(self.series, items, upstream, results)
        record["rebased_from"] = {**journal.upstream, "rev": journal.old_rev, "commit": journal.old_commit}
        record["carried"] = [{"name": s.name, "commit": s.new_sha, "user_edit": s.user_edit} for s in kept
                             if s.kind == "commit" or s.user_edit]
        record["dropped"] = [{"name": s.name, "status": s.status, "detail": s.detail,
                              "merged_in": s.merged_in(journal.onto_commit)}
                             for s in journal.steps
                             if s.status in ("dropped-as-merged", "skipped") and s.kind == "entry"]
        return record

    def _move_branch(self, journal: Journal, new_head: str) -> str:
        """The branch moved to the new tip and checked out; returns the name it takes after the proof, or ""."""
        git, old = self.git, journal.orig_branch
        renamed = default_branch(journal.onto_rev) if old and old == default_branch(journal.old_rev) else ""
        if renamed and (renamed == old or not git.ok("check-ref-format", "--branch", renamed)
                        or git.rev_parse(f"refs/heads/{renamed}") not in (None, git.head())):  # (HEAD: the new tip)
            renamed = ""  # ``c128/<new base>`` for a branch ``apply`` named ``c128/<old base>``, unless taken
        if renamed and git.rev_parse(f"refs/heads/{renamed}") == new_head:  # renamed already before a kill
            self._attach(journal, renamed)
        elif journal.orig_branch:
            if git.rev_parse(f"refs/heads/{journal.orig_branch}") != new_head:  # (moved already before a kill)
                git.run("update-ref", "-m", f"c128patch rebase onto {journal.onto_rev}",
                        f"refs/heads/{journal.orig_branch}", new_head, journal.orig_head)
            fault_point("after", "rebase-branch")
            self._attach(journal, journal.orig_branch)
        return renamed

    def _rename_hint(self, journal: Journal) -> str:
        """A branch of the user's name holding the old base's (``c128/v0.5.23-acme``) keeps it: the command that
        renames it after the new base, where that name is free (else "")."""
        old, rev, git = journal.orig_branch, journal.old_rev, self.git
        if not old or not rev or rev not in old or rev == journal.onto_rev or old == default_branch(rev):
            return ""
        new = old.replace(rev, journal.onto_rev)
        if not git.ok("check-ref-format", "--branch", new) or git.rev_parse(f"refs/heads/{new}") is not None:
            return ""
        return shell_join(["git", "-C", str(git.worktree), "branch", "-m", old, new])

    def _taken_hint(self, journal: Journal) -> tuple[str, str] | None:
        """A branch ``apply`` named ``c128/<old base>`` keeps it where ``c128/<new base>`` is another branch already
        (``_move_branch`` leaves that one alone): (that name, the commands that set it aside and rename this one)."""
        old, git = journal.orig_branch, self.git
        new = default_branch(journal.onto_rev)
        if not old or old != default_branch(journal.old_rev) or new == old or git.current_branch() != old \
                or not git.ok("check-ref-format", "--branch", new) or git.rev_parse(f"refs/heads/{new}") is None:
            return None
        names = (f"{new}-old" + (str(i) if i > 1 else "") for i in range(1, 1000))
        aside = next(name for name in names if git.rev_parse(f"refs/heads/{name}") is None)
        g = ["git", "-C", str(git.worktree), "branch", "-m"]
        return new, f"{shell_join([*g, new, aside])} && {shell_join([*g, old, new])}"

    def _attach(self, journal: Journal, branch: str) -> None:
        """HEAD onto ``branch`` (at the same commit): a checkout without its pass over the work tree."""
        self.git.run("symbolic-ref", "-m", f"c128patch rebase onto {journal.onto_rev}: {branch}", "HEAD",
                     f"refs/heads/{branch}")
