"""``rebase``: move a patched branch onto another upstream rev; the series decides what is replayed.

For each entry of the series, in order, the rebase replays what ``apply`` would replay on the new
base: the file ``plan`` chooses there, strict then 3-way (``ops.replay``; the ledger's recorded
resolution where the 3-way merge conflicts), never the branch's old commit. The branch's own
commits count only for what the user changed on them: before anything moves, each entry commit is
compared with what the series' file gives on its parent (``equivalence.compare_commits``). Such a
*user edit* is carried onto the replayed entry (a 3-way merge of the difference) and listed; a
commit that carries no entry of the series (the user's own), or one that cannot be compared, is
carried as it is, in its place. Forward, backward and skip-release rebases follow the same rule.
An entry the series has but the branch had removed is not replayed; one new in the series is.

Before an entry is replayed, content evidence that upstream has it already is collected
(``ops.merged``): a drop is proposed only on content evidence; ``--drop-merged`` drops only those.

The state lives in a journal (``.git/c128patch/rebase.json``), written before every step, so a
conflict, a dirty tree or a killed process leaves something ``--continue``, ``--skip`` or
``--abort`` can finish. A stop is ``git apply --3way`` in the work tree (stages in the index,
markers in the files); every stop writes the Markdown + JSON report (``ops.conflicts``: file,
hunk, line range on the new base, upstream commits, moved code, partial ledger replay).
Resolutions of the series' own conflicts are recorded in the ledger at ``--continue``.

A finished rebase is proven (``ops.equivalence``): the tree must equal a fresh apply of the series
on the new base but for the user edits and commits carried from the branch. Anything else fails
the command (exit 1): the branch is kept, the difference shown and the undo printed.
"""

from __future__ import annotations

import json
import re
import shlex
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Literal, NoReturn

from c128patch.errors import C128Error, ConflictError, DifferenceError
from c128patch.git import BOT_EMAIL, BOT_NAME, Git
from c128patch.jsonio import write_json_atomic
from c128patch.ops.conflicts import StopReport, analyze, block_markdown
from c128patch.ops.equivalence import Edit, Equivalence, compare_commits, fresh_replay, prove
from c128patch.ops.faults import fault_point
from c128patch.ops.hints import upstream_hints
from c128patch.ops.merged import MergedCheck, Signal, UpstreamIds, commit_diffs, proposes_drop
from c128patch.ops.replay import FAILED, renamed_patch_text, replay_entry, replay_in_index, unmerged_paths
from c128patch.ops.taken import taken
from c128patch.ops.treestate import (
    changed_paths,
    checked_fields,
    corrupt_journal,
    ensure_clean,
    ensure_idle,
    read_journal,
    rebase_command,
    rebase_journal,
    refuse_conflict_markers,
)
from c128patch.series import provenance
from c128patch.series.layers import layer_folders
from c128patch.series.ledger import Conflict, Ledger
from c128patch.series.manifest import Series
from c128patch.series.plan import ENTRY_TRAILER, Planned, index_git, merged_entries, overlay_message, plan
from c128patch.series.provenance import PROVENANCE_PATH, read_provenance
from c128patch.upstream.target import default_branch

RECOVERY_PREFIX = "refs/c128patch/recovery"

StepKind = Literal["entry", "commit"]
Status = Literal["pending", "replayed", "unchanged", "context-only", "content-changed", "new", "resolved",
                 "dropped-as-merged", "skipped", "removed", "failing"]
Phase = Literal["", "series", "user-edit", "carried"]
Paused = Literal["", "conflict", "merged"]
DONE: tuple[Status, ...] = ("replayed", "unchanged", "context-only", "content-changed", "new", "resolved",
                            "dropped-as-merged", "skipped", "removed")


@dataclass
class Step:
    name: str
    kind: StepKind = "entry"
    sha: str = ""  # its commit on the old branch ("" when the branch had none)
    subject: str = ""
    status: Status = "pending"
    detail: str = ""
    new_sha: str = ""
    file: str = ""  # the series' file replayed (entries)
    chosen_by: str = ""
    applied: str = ""  # clean | 3way | ledger | resolved (by hand) | carried
    edit_from: str = ""  # a user edit: the tree the series gives on the old commit's parent ...
    edit_to: str = ""  # ... and the old commit's tree
    series_tree: str = ""  # the tree after the series' part on the new branch
    phase: Phase = ""  # where a stop is
    ledger: list[str] = field(default_factory=list)
    signals: list[dict] = field(default_factory=list)
    upstream_commits: list[str] = field(default_factory=list)
    stop: dict = field(default_factory=dict)  # the StopReport of a stop
    renamed: dict = field(default_factory=dict)  # path in the file -> where upstream moved it (ops.replay)
    hints: list = field(default_factory=list)  # ops.hints: upstream commits that may now do what it does

    @property
    def user_edit(self) -> bool:
        return bool(self.edit_from)


@dataclass
class Journal:
    onto_rev: str
    onto_commit: str
    old_rev: str
    old_commit: str
    orig_branch: str | None
    orig_head: str
    recovery_ref: str
    series_root: str
    drop_merged: bool
    steps: list[Step]
    pos: int = 0
    head_before: str = ""  # the new branch's tip before the current step (HEAD goes there only at a stop and at the end)
    paused: Paused = ""
    stop_state: dict[str, str] = field(default_factory=dict)  # path -> blob the stop left in the work tree
    upstream: dict = field(default_factory=dict)  # the old provenance's upstream record (its fields are kept)
    layers: list[str] = field(default_factory=list)  # the layer folders replayed after the series (series.layers)

    @property
    def span(self) -> str:
        return f"{self.old_rev}..{self.onto_rev}"

    @classmethod
    def load(cls, path: Path, git: Git) -> "Journal":
        """The journal at ``path``; a damaged one is a one-line error that says how to forget it."""
        data = checked_fields(cls, read_journal(git, path, "rebase"), git, path, "rebase")
        if not all(isinstance(s, dict) for s in data["steps"]):
            raise corrupt_journal(git, path, "rebase", "a step is not an object")
        data["steps"] = [Step(**checked_fields(Step, s, git, path, "rebase")) for s in data["steps"]]
        journal = cls(**data)
        if not 0 <= journal.pos <= len(journal.steps):
            raise corrupt_journal(git, path, "rebase", f"'pos' {journal.pos} is outside its {len(journal.steps)} steps")
        return journal

    def save(self, path: Path) -> None:
        write_json_atomic(path, asdict(self))


class Rebase:
    def __init__(self, git: Git, series: Series) -> None:
        self.git = git
        self.series = series
        self.path = rebase_journal(git)
        self.ledger = Ledger(series)
        self._onto_date = ""
        self._planned: dict[str, Planned] | None = None
        self._idx: Git | None = None  # the loop's index (``_reset_index``)
        self._tip_tree = ""
        self._present: set[str] = set()
        self._touched: list[str] = []
        self._hint_cache: dict[str, str] = {}
        self._mails: dict[str, Future] = {}  # entry -> its patch file's (message, author), being read
        self._pool = ThreadPoolExecutor(max_workers=1)  # the proof's fresh replay, beside the rebase
        self._fresh: dict[tuple, Future] = {}
        self.on_tip: Callable[[str, str], object] | None = None  # called with (new base, new tip) once it is made

    # ------------------------------------------------------------------ entry points
    def start(self, onto_rev: str, onto_commit: str, *, drop_merged: bool = False, drop: tuple[str, ...] = ()) -> dict:
        """``drop``: entries upstream holds, dropped from the start (recorded with ``merged_in``)."""
        git = self.git
        unknown = [name for name in drop if name not in {e.name for e in self.series.entries}]
        if unknown:
            raise C128Error(f"cannot rebase: --drop {unknown[0]}: the series has no such entry "
                            f"(its entries: {', '.join(e.name for e in self.series.entries)})")
        ensure_idle(git, "rebase")
        ensure_clean(git, "rebase")
        record = read_provenance(git.worktree)  # type: ignore[arg-type]
        old = record.get("upstream", {})
        if not old.get("commit") or git.rev_parse(old["commit"]) is None:
            raise C128Error(f"cannot rebase: the upstream base recorded in {PROVENANCE_PATH} is not in this repository")
        head = git.head() or ""
        self._fresh_replay(onto_rev, onto_commit, f"{old.get('rev', old['commit'][:12])}..{onto_rev}", drop)
        steps = self._steps(old["commit"], head, record)
        if not any(s.sha for s in steps):
            raise C128Error("cannot rebase: no c128patch entries on this branch")
        recovery = f"{RECOVERY_PREFIX}/{time.strftime('%Y%m%dT%H%M%S')}-{head[:8]}"
        git.run("update-ref", "-m", "c128patch rebase: recovery point", recovery, head)
        journal = Journal(onto_rev, onto_commit, old.get("rev", old["commit"][:12]), old["commit"], git.current_branch(),
                          head, recovery, str(self.series.root), drop_merged, steps)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        journal.upstream = dict(old)
        journal.layers = layer_folders(self.series)
        journal.head_before = onto_commit  # the branch and the work tree stay as they are until a stop or the end
        for step in steps:
            if step.kind == "entry" and step.name in drop:
                self._drop(journal, step, "")
        journal.save(self.path)
        return self._run(journal)

    def resume(self) -> dict:
        journal = self._journal()
        git = self.git
        if journal.pos >= len(journal.steps):  # cut short while finishing: what is in the tree is its checkout
            if git.status_porcelain():
                git.run("reset", "--quiet", "--hard")
            return self._run(journal)
        step = journal.steps[journal.pos]
        if journal.paused == "merged":  # the user keeps an entry that looked merged
            journal.paused = ""
            journal.save(self.path)
            return self._run(journal, keep=True)
        if journal.paused == "conflict" and (git.head() or "") == journal.head_before:
            unmerged = unmerged_paths(git)
            if unmerged:
                raise C128Error(f"cannot continue: conflicts remain in {', '.join(unmerged)}; resolve them and `git add` them")
            unstaged = git.out("diff", "--name-only").split()
            if unstaged:
                raise C128Error(f"cannot continue: unstaged changes in {', '.join(unstaged)}; `git add` the resolution "
                                "(or stash what is not part of it)")
            refuse_conflict_markers(git, "HEAD", None, "continue")  # before the ledger can record them
            tree = git.out("write-tree")
            phase, journal.paused, step.phase = step.phase, "", ""
            found = step.stop.get("taken") or {}
            item = self._plan(journal).get(step.name)
            if phase == "series" and found and item is not None and item.touched != [found["target"]]:
                git.run("reset", "--quiet", "--hard", "HEAD")  # the series gave the overlay another target: replay it
                step.status, step.stop, step.detail = "pending", {}, ""
                journal.save(self.path)
                return self._run(journal)
            if phase == "series" and not step.user_edit and tree == git.out("rev-parse", f"{journal.head_before}^{{tree}}"):
                git.run("reset", "--quiet", "--hard", "HEAD")  # resolved to upstream's side: nothing of ours is left
                step.status, step.applied = "dropped-as-merged", ""
                step.detail = ("empty: its conflict was resolved to upstream's side, so upstream holds it (merged)"
                               if not found else f"superseded: upstream's own {found['target']} is kept"
                               + (f" (created in {found['created']})" if found["created"] else ""))
                step.signals.append(asdict(Signal("became-empty", "resolved to upstream's side, it changes nothing")))
                self._advance(journal)
                return self._run(journal)
            if phase == "series":
                recorded = self.ledger.record(git, step.name, journal.old_rev, journal.onto_rev, self._saved_conflicts())
                step.ledger += recorded
                step.applied, step.series_tree = "resolved", tree
                step.detail = "resolved by hand" + ("; recorded in the ledger" if recorded else "")
                git.run("reset", "--quiet", "--hard", "HEAD")  # the resolution is kept as ``tree``
                self._after_series(journal, step)
                return self._run(journal)
            git.run("reset", "--quiet", "--hard", "HEAD")
            step.detail = "your edit re-resolved by hand" if step.kind == "entry" else "carried; resolved by hand"
            self._commit(journal, step, tree)
            return self._run(journal)
        if journal.paused == "conflict":  # the user committed the resolution: that commit is the entry's
            refuse_conflict_markers(git, journal.head_before, "HEAD", "continue",
                                    "fix it and amend the commit (git commit --amend)")
            journal.paused, step.phase = "", ""
            step.new_sha, step.detail = git.head() or "", "committed by hand"
            step.status = "replayed" if step.sha else "new"
            self._advance(journal, step.new_sha)
        elif self._stop_cut_short(journal):  # its conflict state is ours: the stop is made again
            git.run("reset", "--quiet", "--hard")
        elif git.status_porcelain():
            stash = shlex.join(["git", "-C", str(git.worktree), "stash", "-u"])
            raise C128Error("cannot continue: the tree has changes but no entry is stopped; "
                            f"stash them ({stash}) or undo with `{rebase_command(git.worktree, 'abort')}`")
        return self._run(journal)

    def _stop_cut_short(self, journal: Journal) -> bool:
        """Killed inside ``_stop``: HEAD detached where the stop checks out, changes only in the files
        the stopped entry's replay writes, and the journal not yet paused."""
        git = self.git
        if journal.paused or git.current_branch() or (git.head() or "") != journal.head_before:
            return False
        if journal.head_before == journal.orig_head or not git.status_porcelain():
            return False
        step = journal.steps[journal.pos]
        item = self._plan(journal).get(step.name)
        ours = set(item.patch.paths if item and item.patch else item.touched if item else [])
        if step.kind == "commit" or step.user_edit:
            ours |= set(self.git.out("diff", "--name-only", "--no-renames", f"{step.sha}^", step.sha).splitlines())
        return set(changed_paths(git)) <= ours

    def skip(self) -> dict:
        journal = self._journal()
        step = journal.steps[journal.pos]
        self._leave_stop(journal, "skip")
        step.status = "dropped-as-merged" if journal.paused == "merged" else "skipped"
        step.detail = step.detail if journal.paused == "merged" else "skipped by the user"
        step.phase = ""
        self._advance(journal)
        return self._run(journal)

    def drop(self, name: str) -> dict:
        """``--drop NAME`` at a stop: the entry it stopped at is dropped as merged upstream."""
        journal = self._journal()
        step = journal.steps[journal.pos] if journal.pos < len(journal.steps) else None
        if step is None or not journal.paused or step.kind != "entry" or step.name != name:
            at = f"stopped at entry '{step.name}'" if step is not None and journal.paused else "not stopped at an entry"
            raise C128Error(f"cannot drop '{name}': the rebase is {at}; alone, --drop names the entry the rebase "
                            f"stopped at (with --onto, the entries to drop from the start)")
        self._leave_stop(journal, "drop")
        self._drop(journal, step, journal.paused)
        self._advance(journal)
        return self._run(journal)

    def _leave_stop(self, journal: Journal, verb: str) -> None:
        """The stop's conflict state undone (what the rebase wrote); other changes are refused."""
        if journal.paused == "conflict":
            self.git.run("reset", "--quiet", "--hard", "HEAD")
        elif self.git.status_porcelain():
            raise C128Error(f"cannot {verb}: the tree has changes; stash them (git stash -u) first")

    def _drop(self, journal: Journal, step: Step, paused: Paused) -> None:
        """``step`` dropped as merged upstream by the user (``--drop``); its ``merged_in`` is the
        upstream commit the stop or a hint names, else the new base (``_merged_in``)."""
        found = step.stop.get("taken") or {}
        if paused == "merged":  # the content signals said so already
            step.detail = step.detail or "dropped by the user (--drop)"
        elif found:
            step.detail = (f"superseded: upstream's own {found['target']} is kept (--drop)"
                           + (f", created in {found['created']}" if found["created"] else ""))
        else:
            if not paused:  # from the start: the hints are what names the upstream commit
                item = self._plan(journal).get(step.name)
                if item is not None:
                    step.hints = [h.to_json() for h in upstream_hints(
                        self.git, item.entry, item.patch, journal.old_commit, journal.onto_commit,
                        cache=self._hint_cache, every=self._touched or None)]
            step.detail = "dropped: upstream holds it, the user said (--drop)"
        step.status, step.phase = "dropped-as-merged", ""

    def abort(self) -> dict:
        journal = self._journal()
        git = self.git
        if journal.pos < len(journal.steps) and self._stop_cut_short(journal):
            git.run("reset", "--quiet", "--hard")  # the cut-short stop's conflict state: the tool's own
        state = self._tree_state()
        mine = self._user_paths(journal, state)
        theirs = sorted(set(state) - set(mine))  # the tool's own changes: conflict markers, files it added
        git.run("reset", "--quiet")  # unmerged entries out of the way; the work tree stays
        tracked = [p for p in theirs if git.tree_entry("HEAD", p) is not None]
        if tracked:
            git.run("checkout", "--quiet", "HEAD", "--", *tracked)
        for path in set(theirs) - set(tracked):
            (git.worktree / path).unlink(missing_ok=True)  # type: ignore[operator]
        stash = ""
        if mine:  # never throw away what the user typed mid-rebase
            git.run("add", "--all", "--", *mine)
            stash = git.out("stash", "create", "c128patch rebase --abort: work in progress")
            if stash:
                git.run("stash", "store", "-m", "c128patch rebase --abort: work in progress", stash)
        git.run("reset", "--quiet", "--hard")
        if journal.orig_branch:
            git.run("checkout", "--quiet", journal.orig_branch)
            if git.head() != journal.orig_head:
                git.run("reset", "--quiet", "--hard", journal.orig_head)
        else:
            git.run("checkout", "--quiet", "--detach", journal.orig_head)
        self.path.unlink()
        (self.path.parent / "conflicts.json").unlink(missing_ok=True)
        return {"ok": True, "aborted": True, "branch": journal.orig_branch, "head": journal.orig_head,
                "recovery_ref": journal.recovery_ref, "stash": stash, "stashed": mine}

    # ------------------------------------------------------------------ what to replay
    def _steps(self, old_commit: str, head: str, record: dict) -> list[Step]:
        """The series' entries in order, each with the branch's commit and user edit, and the
        branch's own commits after the entry they followed."""
        git = self.git
        with tempfile.TemporaryDirectory(prefix="c128rebase-") as tmp:
            fresh: dict[str, tuple[str, str]] = {}
            replay_in_index(self.series, git, record.get("upstream", {}).get("rev", old_commit), old_commit,
                            Path(tmp) / "fresh.index", ledger=self.ledger, trees=fresh)
            verdicts = compare_commits(self.series, git, old_commit, head, Path(tmp), fresh)
        names = [v.commit.entry for v in verdicts if v.commit.entry]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise C128Error(f"cannot rebase: two commits carry '{ENTRY_TRAILER}: {twice[0]}'; squash them first")
        applied = {e.get("name") for e in record.get("entries", [])}
        in_series = {e.name for e in self.series.entries}
        by_entry, after = {}, {"": []}
        last = ""
        for v in verdicts:
            c = v.commit
            if v.kind in ("series", "user-edit") and c.entry in in_series:
                by_entry[c.entry] = v
                last = c.entry
                after.setdefault(last, [])
                continue
            step = Step(c.entry or c.subject, "commit", c.sha, c.subject, applied="carried")
            step.detail = "your commit, carried" if v.kind == "user-commit" else f"carried as it is: {v.detail}"
            after.setdefault(last, []).append(step)
        steps = list(after[""])
        for entry in self.series.entries:
            v = by_entry.get(entry.name)
            if v is not None:
                step = Step(entry.name, "entry", v.commit.sha, v.commit.subject)
                if v.kind == "user-edit":
                    step.edit_from, step.edit_to = v.before, v.after
                steps.append(step)
            elif entry.name in applied and any(c.commit.entry == entry.name for c in verdicts):
                pass  # an uncompared entry commit: carried as a commit step below
            elif entry.name in applied:
                steps.append(Step(entry.name, status="removed", detail="not on the branch (its commit was removed): "
                                                                      "not replayed"))
            else:
                steps.append(Step(entry.name, detail="new in the series since the branch was made"))
            steps += after.get(entry.name, [])
        return steps

    # ------------------------------------------------------------------ the loop
    def _journal(self) -> Journal:
        if not self.path.is_file():
            raise C128Error("no c128patch rebase is in progress here")
        return Journal.load(self.path, self.git)

    def _advance(self, journal: Journal, tip: str = "") -> None:
        journal.pos += 1
        journal.head_before = tip or journal.head_before
        journal.paused = ""
        journal.stop_state = {}
        journal.save(self.path)

    def _run(self, journal: Journal, keep: bool = False) -> dict:
        git = self.git
        planned = self._plan(journal)
        self._fresh_replay(journal.onto_rev, journal.onto_commit, journal.span, self._left_out(journal))
        merged_here = {e.name: e for e in merged_entries(self.series, git, journal.onto_commit)}
        check = MergedCheck(git, journal.old_commit, journal.onto_commit,
                            UpstreamIds(git, self.path.parent / "patch-ids.json"), [s.sha for s in journal.steps])
        self._reset_index(journal)
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
                _fault_point(step.name)
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

    def _plan(self, journal: Journal) -> dict[str, Planned]:
        if self._planned is None:
            self._planned = {p.entry.name: p for p in plan(self.series, self.git, journal.onto_commit)}
        return self._planned

    def _reset_index(self, journal: Journal) -> None:
        """The loop's index back at the tip's tree (it follows the tip while entries replay)."""
        git = self.git
        idx = index_git(git, self.path.parent / "rebase.index")
        idx.run("read-tree", journal.head_before)
        self._idx, self._tip_tree = idx, idx.out("write-tree")
        self._touched = sorted({path for item in self._plan(journal).values() for path in item.touched})
        self._present = set(idx.out("ls-files", "--", *self._touched).splitlines()) if self._touched else set()

    def _replay(self, journal: Journal, step: Step, item: Planned, check: MergedCheck, keep: bool) -> None:
        """The series' part of one entry on the tip, in the loop's index; a stop when it conflicts."""
        idx = self._idx
        assert idx is not None
        step.file, step.chosen_by = item.label, item.chosen_by
        signals = [] if keep else check.signals(item, journal.head_before, step.sha, idx, self._present)
        index_file = Path(idx.env["GIT_INDEX_FILE"])
        row = replay_entry(self.git, item, index_file, self._present, ledger=self.ledger, span=journal.span,
                           at=journal.onto_commit)
        tree = idx.out("write-tree") if row.status not in FAILED else ""
        if tree and tree == self._tip_tree:
            signals.append(Signal("became-empty", "replaying it on the new base changes nothing"))
        step.signals = [asdict(s) for s in signals]
        if keep and tree and "became-empty" in {s.kind for s in signals}:
            step.status, step.detail = "dropped-as-merged", "became empty on the new base"
            self._advance(journal)
            return
        if not keep and proposes_drop(signals):
            why = "; ".join(s.describe() for s in signals)
            step.detail = why
            self._reset_index(journal)
            if journal.drop_merged:
                step.status = "dropped-as-merged"
                self._advance(journal)
                return
            journal.paused, step.status = "merged", "pending"
            journal.save(self.path)
            self._write_reports(journal)
            raise ConflictError(f"entry '{step.name}' looks merged upstream ({why}); nothing was dropped",
                                hint=f"  drop it: {rebase_command(self.git.worktree, 'drop', step.name)}\n"
                                     f"  keep it: {rebase_command(self.git.worktree, 'continue')}\n"
                                     f"  undo:    {rebase_command(self.git.worktree, 'abort')}",
                                report=self.report(journal))
        step.ledger = [r.ref for r in row.resolutions]
        step.renamed = dict(row.renamed)
        step.hints = [h.to_json() for h in upstream_hints(self.git, item.entry, item.patch, journal.old_commit,
                                                          journal.onto_commit, row.renamed, self._hint_cache,
                                                          self._touched)]
        step.signals = [s for s in step.signals if s["kind"] != "pr-hint"]  # kept: a hint, not a drop signal
        if tree:
            step.applied, step.series_tree = row.status, tree
            step.detail = row.detail
            self._after_series(journal, step)
            return
        text = item.path.read_text() if item.patch is not None else ""
        self._stop(journal, step, "series", renamed_patch_text(text, row.renamed) if row.renamed else text,
                   item.label, row.detail, row.conflicts or ([item.entry.target] if item.patch is None else []))

    def _after_series(self, journal: Journal, step: Step) -> None:
        """Carry the user's edit (if any) onto the series' part, then commit the entry."""
        tree = step.series_tree
        if step.user_edit:
            delta = self._diff(step.edit_from, step.edit_to)
            merged = self._apply_on(tree, delta)
            if merged is None:
                self._stop(journal, step, "user-edit", delta, f"your edit of {step.name} ({step.sha[:12]})",
                           "your edit conflicts with the series' file on the new base")
            tree = merged
            step.detail = "; ".join(filter(None, [step.detail, "your edit carried"]))
        self._commit(journal, step, tree)

    def _carry(self, journal: Journal, step: Step) -> None:
        """A commit of the user's own (or one that cannot be compared with the series), as it is."""
        delta = self._diff(f"{step.sha}^", step.sha)
        tree = self._apply_on(self.git.out("rev-parse", f"{journal.head_before}^{{tree}}"), delta)
        if tree is None:
            self._stop(journal, step, "carried", delta, f"commit {step.sha[:12]} {step.subject!r}",
                       "the commit does not apply on the new base")
        self._commit(journal, step, tree)

    def _diff(self, before: str, after: str) -> str:
        return self.git.run("diff", "--full-index", "--binary", "--no-renames", before, after).stdout

    def _apply_on(self, tree: str, diff: str) -> str | None:
        """``diff`` applied to ``tree`` (strict, else 3-way) in an index; None when it conflicts."""
        if not diff:
            return tree
        with tempfile.TemporaryDirectory(prefix="c128rebase-") as tmp:
            idx = index_git(self.git, Path(tmp) / "index")
            idx.run("read-tree", tree)
            if idx.ok("apply", "--cached", input=diff) or idx.ok("apply", "--cached", "--3way", input=diff):
                return idx.out("write-tree")
        return None

    def _commit(self, journal: Journal, step: Step, tree: str) -> None:
        """Commit ``tree`` on HEAD as the step's commit and check it out; the step is done."""
        git = self.git
        date = self._date(journal)
        if step.kind == "entry" and not step.user_edit:
            message, author = self._patch_message(step, date)
        else:
            message = git.run("log", "-1", "--format=%B", step.sha).stdout
            author = tuple(git.out("log", "-1", f"--format={f}", step.sha) for f in ("%an", "%ae", "%aI"))
        env = {"GIT_AUTHOR_NAME": author[0], "GIT_AUTHOR_EMAIL": author[1], "GIT_AUTHOR_DATE": author[2],
               "GIT_COMMITTER_DATE": date}
        sha = git.with_env(**env).out("commit-tree", tree, "-p", journal.head_before, input=message)
        step.new_sha = sha
        if step.status in ("pending", "failing"):
            step.status = "resolved" if step.applied in ("resolved", "ledger") else "replayed" if step.sha else "new"
        if self._idx is not None and tree != step.series_tree:  # the loop's index follows the tip
            self._idx.run("read-tree", tree)
            self._present = set(self._idx.out("ls-files", "--", *self._present | set(self._touched)).splitlines())
        self._tip_tree = tree
        self._advance(journal, sha)

    def _patch_message(self, step: Step, date: str) -> tuple[str, tuple[str, str, str]]:
        """The message and author ``git am`` would give the step's file (plus the entry trailer)."""
        git = self.git
        if not step.file.startswith("patches/"):  # an overlay: as ``apply`` commits it
            return overlay_message(self.series.entry(step.name), self.series), (BOT_NAME, BOT_EMAIL, date)
        made = self._mails.get(step.name)
        if made is not None:
            return made.result()
        return self._mail(self.series.part(step.name)[0].root / step.file, step.name)  # a layer's file is in its layer

    def _mail(self, path: Path, name: str) -> tuple[str, tuple[str, str, str]]:
        git = self.git
        with tempfile.TemporaryDirectory(prefix="c128mail-") as tmp:
            info = git.run("mailinfo", f"{tmp}/msg", f"{tmp}/patch", input=path.read_text()).stdout
            body = Path(tmp, "msg").read_text()
        fields = dict(line.split(": ", 1) for line in info.splitlines() if ": " in line)
        message = git.run("stripspace", input=f"{fields.get('Subject', name)}\n\n{body}").stdout
        if f"\n{ENTRY_TRAILER}: " not in message:
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
        conflicted = unmerged_paths(git)
        conflicts = Ledger.conflicts(git, conflicted)
        resolved = self.ledger.replay(git, step.name, conflicts, journal.span) if phase == "series" else []
        left = unmerged_paths(git)
        self._save_conflicts([c for c in conflicts if c.path in left])
        report = StopReport(step.name, phase, label, resolved=resolved, unresolved=left, paths=left or list(paths or []))
        for c in conflicts:
            if c.path in left:
                report.blocks += analyze(git, c.path, c.text, diff, head=journal.head_before, old=journal.old_commit,
                                         onto=journal.onto_commit)
        step.stop, step.phase, step.status = asdict(report), phase, "failing"
        item = self._plan(journal).get(step.name) if phase == "series" else None
        extra = [f"  {h['line']}" for h in step.hints]
        if item is not None and item.patch is None and report.paths == [item.entry.target]:  # upstream's file there
            found = taken(git, self.series, item.entry, journal.old_commit, journal.onto_commit)
            step.stop["taken"] = found.to_json()
            extra = [f"  {line}" for line in found.lines(rebase_command(git.worktree, "continue"),
                                                         rebase_command(git.worktree, "drop", step.name))]
        step.ledger = [r.ref for r in resolved]
        step.upstream_commits = sorted({u for b in report.blocks for u in b.upstream})
        if left:
            step.detail = f"conflicts in {', '.join(left)}"
        else:
            reason = (proc.stderr.strip().splitlines() or [why])[-1] if proc is not None else why
            step.detail = f"{why}: {reason.removeprefix('error: ')}" if reason != why else why
        journal.paused = "conflict"
        journal.stop_state = self._tree_state()
        journal.save(self.path)
        self._write_reports(journal)
        tree = git.worktree
        where = "\n".join([f"  {line}" for line in report.lines()] + extra)
        raise ConflictError(
            f"entry '{step.name}' conflicts on {journal.onto_rev}"
            + (f" in {', '.join(left)}" if left else f": {step.detail}")
            + (f" ({'your edit' if phase == 'user-edit' else 'your commit'})" if phase != "series" else ""),
            hint=((where + "\n") if where else "")
            + f"  resolve: edit the files, `{shlex.join(['git', '-C', str(tree), 'add'])}` them, then "
              f"{rebase_command(tree, 'continue')}\n"
              f"  drop it: {rebase_command(tree, 'skip')}\n"
            + (f"  merged upstream: {rebase_command(tree, 'drop', step.name)} (drops it as merged, with merged_in)\n"
               if step.hints and phase == "series" else "")
            + f"  undo:    {rebase_command(tree, 'abort')} (back to {journal.orig_branch or journal.orig_head[:12]})\n"
              f"  report:  {self.path.parent / 'rebase-report.md'}",
            report=self.report(journal))

    def _tree_state(self) -> dict[str, str]:
        """path -> blob id of each changed or untracked path of the work tree ("" when deleted)."""
        git = self.git
        paths = [line[3:] for line in git.out("status", "--porcelain=v1", "--untracked-files=all",
                                              "--no-renames").splitlines()]
        present = [p for p in paths if (git.worktree / p).is_file()]  # type: ignore[operator]
        ids = git.out("hash-object", "--", *present).splitlines() if present else []
        return {**{p: "" for p in paths}, **dict(zip(present, ids))}

    def _user_paths(self, journal: Journal, now: dict[str, str]) -> list[str]:
        """Paths the user changed since the stop (all changed paths when not stopped)."""
        if journal.paused != "conflict":
            return sorted(now)
        return sorted(p for p in set(now) | set(journal.stop_state) if now.get(p) != journal.stop_state.get(p))

    def _save_conflicts(self, conflicts: list[Conflict]) -> None:
        """Keep the conflicted files as git left them: --continue records the resolution against them."""
        (self.path.parent / "conflicts.json").write_text(json.dumps([asdict(c) for c in conflicts]))

    def _saved_conflicts(self) -> list[Conflict]:
        path = self.path.parent / "conflicts.json"
        return [Conflict(**c) for c in json.loads(path.read_text())] if path.is_file() else []

    def _classify(self, steps: list[Step]) -> None:
        """Each replayed step against its old commit: unchanged (the same diff), context-only (the
        same added and removed lines, as ``git patch-id --stable`` counts them: whitespace and line
        numbers aside), content-changed. One git call for all of them."""
        todo = [s for s in steps if s.status == "replayed"]
        full = commit_diffs(self.git, [sha for s in todo for sha in (s.sha, s.new_sha)], "--full-index")
        drop_index = lambda d: re.sub(r"^index .*$", "", d, flags=re.M)  # noqa: E731
        for s in todo:
            if _changed_lines(full[s.sha]) != _changed_lines(full[s.new_sha]):
                s.status = "content-changed"
            else:
                s.status = "unchanged" if drop_index(full[s.sha]) == drop_index(full[s.new_sha]) else "context-only"

    # ------------------------------------------------------------------ the end
    def _finish(self, journal: Journal) -> dict:
        git = self.git
        self._classify(journal.steps)
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
                              "merged_in": _merged_in(s, journal.onto_commit)}
                             for s in journal.steps if s.status in ("dropped-as-merged", "skipped") and s.kind == "entry"]
        new_head = self._provenance_commit(journal, provenance.dumps(record))
        if self.on_tip is not None:
            self.on_tip(journal.onto_commit, new_head)
        carried = {s.new_sha for s in kept if s.kind == "commit"} | {s.new_sha for s in kept if s.user_edit}
        left_out = self._left_out(journal)
        fresh = self._fresh.get((journal.onto_commit, journal.span, tuple(sorted(left_out))))
        with ThreadPoolExecutor(max_workers=2) as pool:  # the proof reads objects only: it runs beside the checkout
            proving = pool.submit(lambda: prove(self.series, git, journal.onto_rev, journal.onto_commit, new_head,
                                                accept=lambda e: _accepted(e, carried), span=journal.span,
                                                without=left_out, fresh=fresh.result() if fresh else None))
            ranged = pool.submit(self._range_diff, journal, new_head)
            git.run("checkout", "--quiet", "--detach", new_head)  # the work tree is clean here
            renamed = self._new_branch_name(journal)
            if renamed and git.rev_parse(f"refs/heads/{renamed}") == new_head:  # renamed already before a kill
                self._attach(journal, renamed)
            elif journal.orig_branch:
                if git.rev_parse(f"refs/heads/{journal.orig_branch}") != new_head:  # (moved already before a kill)
                    git.run("update-ref", "-m", f"c128patch rebase onto {journal.onto_rev}",
                            f"refs/heads/{journal.orig_branch}", new_head, journal.orig_head)
                fault_point("after", "rebase-branch")
                self._attach(journal, journal.orig_branch)
            proof, range_diff = proving.result(), ranged.result()
        if proof.ok and renamed and git.current_branch() != renamed:  # named after its new base; the old tip stays
            git.run("update-ref", "-m", f"c128patch rebase onto {journal.onto_rev}", f"refs/heads/{renamed}", new_head,
                    "0" * 40)  # at the recovery ref
            self._attach(journal, renamed)
            git.run("update-ref", "-d", f"refs/heads/{journal.orig_branch}", new_head)
        report = self.report(journal, new_head, proof, range_diff)
        if renamed and git.current_branch() == renamed:
            report["branch"], report["renamed_branch"] = renamed, {"from": journal.orig_branch, "to": renamed}
        self._write_reports(journal, report)
        self.path.unlink()
        (self.path.parent / "conflicts.json").unlink(missing_ok=True)
        if not proof.ok:
            where = journal.orig_branch or "HEAD"
            shown = "\n".join(f"  {h.path} {h.header}" for d in proof.unattributed for h in d.hunks[:20])
            raise DifferenceError(
                f"rebase onto {journal.onto_rev} finished, but the tree is not proven: {proof.summary()}",
                hint=f"{shown}\n  {where} is kept as it is (report: {self.path.parent / 'rebase-report.md'})\n"
                     f"  undo: {shlex.join(['git', '-C', str(git.worktree), 'reset', '--hard', journal.recovery_ref])}",
                report=report)
        return report

    def _left_out(self, journal: Journal) -> list[str]:
        """The entries the new tip leaves out on purpose (the proof's fresh replay does too)."""
        return [s.name for s in journal.steps
                if s.kind == "entry" and s.status in ("dropped-as-merged", "skipped", "removed")]

    def _fresh_replay(self, rev: str, commit: str, span: str, without) -> None:
        """Start the proof's fresh replay on the new base (``equivalence.fresh_replay``) beside the
        rebase: it reads nothing of the branch. ``_finish`` takes it where nothing else was left out
        since; a stop leaves it unused."""
        key = (commit, span, tuple(sorted(without)))
        if key not in self._fresh:
            self._fresh[key] = self._pool.submit(fresh_replay, self.series, self.git, rev, commit, span=span,
                                                 without=list(without))

    def _attach(self, journal: Journal, branch: str) -> None:
        """HEAD (detached at the new tip) onto ``branch``, which points there: ``git checkout`` of the
        same commit without its pass over the work tree."""
        self.git.run("symbolic-ref", "-m", f"c128patch rebase onto {journal.onto_rev}: {branch}", "HEAD",
                     f"refs/heads/{branch}")

    def _new_branch_name(self, journal: Journal) -> str:
        """``c128/<new base>`` for a branch named after its old base as ``apply`` names it (``c128/<old
        base>``), when the new base has a name and no such branch is there already; else ""."""
        old, onto = journal.orig_branch, journal.onto_rev
        if not old or old != default_branch(journal.old_rev) or re.fullmatch(r"[0-9a-f]{7,40}", onto):
            return ""
        new = default_branch(onto)
        if new == old or not self.git.ok("check-ref-format", "--branch", new):
            return ""
        there = self.git.rev_parse(f"refs/heads/{new}")
        return new if there in (None, self.git.head()) else ""  # (HEAD: the new tip, detached)

    def _date(self, journal: Journal) -> str:
        """The new base's commit date: every commit the rebase makes carries it (reproducible ids).
        (``git log -1``: ``git show -s`` costs half a second on a release-sized commit.)"""
        if not self._onto_date:
            self._onto_date = self.git.out("log", "-1", "--format=%cI", journal.onto_commit)
        return self._onto_date

    def _provenance_commit(self, journal: Journal, text: str) -> str:
        """The provenance commit on the new tip, made without touching the work tree."""
        git = self.git
        blob = git.out("hash-object", "-w", "--stdin", input=text)
        with tempfile.TemporaryDirectory(prefix="c128rebase-") as tmp:
            idx = index_git(git, Path(tmp) / "index")
            idx.run("read-tree", journal.head_before)
            idx.run("update-index", "--add", "--cacheinfo", f"100644,{blob},{PROVENANCE_PATH}")
            tree = idx.out("write-tree")
        date = self._date(journal)
        message = (f"c128patch: provenance (series {self.series.name} rebased onto {journal.onto_rev})\n\n"
                   f"{ENTRY_TRAILER}: provenance\n")
        return git.with_env(GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date).out(
            "commit-tree", tree, "-p", journal.head_before, input=message)

    def _write_reports(self, journal: Journal, report: dict | None = None) -> None:
        report = report or self.report(journal)
        state = self.path.parent
        write_json_atomic(state / "rebase-report.json", report)
        (state / "rebase-report.md").write_text(render_markdown(report))

    # ------------------------------------------------------------------ report
    def report(self, journal: Journal, new_head: str | None = None, proof: Equivalence | None = None,
               range_diff: list[str] | None = None) -> dict:
        git = self.git
        added = git.out("log", "--format=%h %s", f"{journal.old_commit}..{journal.onto_commit}").splitlines()
        removed = git.out("log", "--format=%h %s", f"{journal.onto_commit}..{journal.old_commit}").splitlines()
        direction = "forward" if not removed else "backward" if not added else "sideways"
        out = {
            "ok": new_head is not None and (proof is None or proof.ok),
            "old_base": {"rev": journal.old_rev, "commit": journal.old_commit},
            "new_base": {"rev": journal.onto_rev, "commit": journal.onto_commit},
            "direction": direction,
            "upstream_commits_between": len(added),
            "upstream_commits": added[:200],
            "upstream_commits_removed": removed[:200],
            "entries": [asdict(s) for s in journal.steps],
            "paused": journal.paused,
            "recovery_ref": journal.recovery_ref,
            "branch": journal.orig_branch,
            "head": new_head or git.head(),
        }
        if proof is not None:
            out["equivalence"] = proof.to_json()
        if new_head:
            out["range_diff"] = self._range_diff(journal, new_head) if range_diff is None else range_diff
        return out

    def _range_diff(self, journal: Journal, new_head: str) -> list[str]:
        proc = self.git.run("range-diff", "--no-color", f"{journal.old_commit}..{journal.orig_head}",
                            f"{journal.onto_commit}..{new_head}", check=False)
        return [line for line in proc.stdout.splitlines() if re.match(r"^\s*(\d+|-):", line)]


def _merged_in(step: Step, onto: str) -> str:
    """The upstream commit a merged entry went in with: the one a signal names, else the new base.
    An entry skipped at a stop: the upstream commit a hint names, else the new base (a later rebase
    onto that upstream does not stop at it again)."""
    made = (step.stop.get("taken") or {}).get("commit", "")
    if (step.status == "skipped" and step.stop) or (step.status == "dropped-as-merged"
                                                    and step.detail.startswith(("empty:", "superseded:", "dropped:"))):
        return made or (step.hints[0]["commit"] if step.hints else onto)
    if step.status != "dropped-as-merged":
        return ""
    named = [s["commit"] for s in step.signals if s.get("commit") and s["kind"] == "patch-id"]
    return named[0] if named else onto


def _changed_lines(diff: str) -> list[tuple[str, tuple[str, ...]]]:
    """Each file of ``diff`` (sorted) with its added and removed lines, whitespace dropped."""
    files: dict[str, list[str]] = {}
    lines: list[str] = []
    header = False
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            lines, header = files.setdefault(line, []), True
        elif line.startswith("@@"):
            header = False
        elif line[:1] in ("+", "-") and not header:
            lines.append(line[0] + "".join(line[1:].split()))
    return sorted((name, tuple(changed)) for name, changed in files.items())


def _accepted(edit: Edit, carried: set[str]) -> bool:
    """An edit the rebase carried on purpose (from the old branch), on its new commit."""
    return edit.commit in carried


def render_markdown(report: dict) -> str:
    old, new = report["old_base"], report["new_base"]
    lines = [f"# c128patch rebase: {old['rev']} → {new['rev']} ({report['direction']})", ""]
    added, removed = report["upstream_commits"], report["upstream_commits_removed"]
    lines.append(f"{report['upstream_commits_between']} upstream commit(s) added between `{old['commit'][:12]}` and "
                 f"`{new['commit'][:12]}`" + (f", {len(removed)} left behind (backward)" if removed else "") + ".")
    lines += [""] + [f"- added: {c}" for c in added[:20]] + [f"- left behind: {c}" for c in removed[:20]]
    lines += ["", "| entry | status | file (chosen by) | detail |", "| --- | --- | --- | --- |"]
    for e in report["entries"]:
        detail = e["detail"] + (f" (ledger {', '.join(e['ledger'])})" if e["ledger"] else "")
        if e.get("edit_from"):
            detail += "; **user edit carried**"
        if e["signals"]:
            detail += "; signals: " + "; ".join(f"{s['kind']}: {s['detail']}" for s in e["signals"])
        file = f"{e['file']} ({e['chosen_by']})" if e.get("file") else e.get("kind", "")
        lines.append(f"| {e['name']} | {e['status']} | {file} | {detail} |")
    stopped = [e for e in report["entries"] if e.get("stop") and e["status"] == "failing"]
    for e in stopped:
        stop = e["stop"]
        lines += ["", f"## stopped at {e['name']} ({stop['phase']})", "", f"from {stop['file']}", ""]
        lines += [block_markdown(b) for b in stop["blocks"]]
        if stop["resolved"]:
            lines.append("- partly resolved by the ledger: " + ", ".join(f"{r['entry']}:{r['key']} ({r['path']})"
                                                                           for r in stop["resolved"]))
    proof = report.get("equivalence")
    if proof:
        lines += ["", "## proof", "", proof["summary"]]
        used = [r for e in proof["replay"]["entries"] for r in e["resolutions"]]
        lines += [f"- ledger resolution `{r['entry']}:{r['key']}` ({r['path']}), recorded on {r['recorded']}"
                  + (" (reused)" if r["reused"] else "") for r in used]
        lines += [f"- note: {n}" for n in proof["notes"]]
        for d in proof["differences"]:
            lines += ["", f"### {d['label'] or 'unattributed'}", "", "```diff"]
            lines += [f"{h['path']} {h['header']}" + ("\n" + h["text"].rstrip() if h["text"] else "") for h in d["hunks"][:20]]
            lines.append("```")
    if report.get("range_diff"):
        lines += ["", "## range-diff", "", "```", *report["range_diff"], "```"]
    return "\n".join(lines) + "\n"


def _fault_point(name: str) -> None:
    """Test hook (ops.faults): C128PATCH_FAULT=kill-before:<entry> / sigint-before:<entry> interrupts
    this process right before that entry is replayed."""
    fault_point("before", name)
