"""``rebase``: move a patched branch onto another upstream rev; the series decides what is replayed.

Each entry replays what ``apply`` would on the new base (``series.plan``'s file, strict, 3-way, the ledger:
``ops.replay``), never the old commit. What the user changed on an entry's commit (a *user edit*,
``equivalence.compare_commits``) is carried onto it; a commit of no entry is carried as it is, in its place.
A drop is proposed only on content evidence that upstream has the entry (``ops.merged``). The journal is
written before every step, so a stop (``git apply --3way`` in the work tree and a report), a dirty tree or a
kill leaves something ``--continue``, ``--skip``, ``--drop`` or ``--abort`` finishes. The end is proven equal
to a fresh apply but for what was carried (``ops.equivalence``); else exit 1, the branch kept, the undo said."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

from c128patch import procs
from c128patch.errors import C128Error
from c128patch.git import ls_tree
from c128patch.ops import proofs
from c128patch.ops.equivalence import compare_commits
from c128patch.ops.merged import Signal, entry_making, upstream_hints
from c128patch.ops.rebase_journal import Journal, Paused, Step, saved_conflicts
from c128patch.ops.rebase_loop import RebaseLoop
from c128patch.ops.replay import replay_in_index, unmerged_paths
from c128patch.ops.treestate import (
    RECOVERY_PREFIX,
    changed_paths,
    cut_checkout,
    ensure_clean,
    ensure_idle,
    fault_point,
    rebase_command,
    refuse_conflict_markers,
    tree_layers,
    tree_state,
)
from c128patch.series.layers import describe, layer_folders
from c128patch.series.plan import ENTRY_TRAILER, refuse_encoding_at, refuse_symlinks_at, written_paths
from c128patch.series.provenance import PROVENANCE_PATH, applied_digest, applied_layers, read_provenance, starts_stack
from c128patch.textsafe import shell_join, shell_quote


class Rebase(RebaseLoop):
    """The verbs: ``start`` (``--onto``), ``resume`` (``--continue``), ``skip``, ``drop``, ``abort``."""

    def start(self, onto_rev: str, onto_commit: str, *, drop_merged: bool = False, drop: tuple[str, ...] = (),
              if_needed: bool = False) -> dict:
        """``drop``: entries upstream holds, dropped from the start (recorded with ``merged_in``); ``if_needed``:
        a branch already on ``onto_commit`` with this series (and nothing to drop) is left as it is (``already_on``:
        as ``git rebase``, nothing to rewrite)."""
        git = self.git
        if unknown := [name for name in drop if name not in {e.name for e in self.series.entries}]:
            raise C128Error(f"cannot rebase: --drop {unknown[0]}: the series has no such entry "
                            f"(its entries: {', '.join(e.name for e in self.series.entries)})")
        ensure_idle(git, "rebase")
        ensure_clean(git, "rebase")
        record = read_provenance(git.worktree)  # type: ignore[arg-type]
        self._same_layers(record, onto_rev)
        old = record.get("upstream", {})
        if not old.get("commit") or git.rev_parse(old["commit"]) is None:
            raise C128Error(f"cannot rebase: the upstream base recorded in {PROVENANCE_PATH} is not in this repository")
        head = git.head() or ""
        old_rev = old.get("rev", old["commit"][:12])
        if (if_needed and not drop and not drop_merged and git.rev_parse(old["commit"]) == onto_commit
                and applied_digest(record) == self.series.digest()):
            return {"ok": True, "already_on": True, "branch": git.current_branch(), "head": head, "rev": onto_rev,
                    "commit": onto_commit, "stack": describe(self.series)}
        self._planning(onto_commit)  # (in the pool, beside the comparison of the branch's commits)
        steps = self._steps(old["commit"], head, record)
        if not any(s.sha for s in steps):
            raise C128Error("cannot rebase: no c128patch entries on this branch")
        planned = self._planning(onto_commit).result()
        refuse_symlinks_at(git, onto_commit, planned)  # before anything is written
        refuse_encoding_at(git, onto_commit, written_paths(planned))  # (the loop's check_paths_at: past its journal)
        self.ledger.check()  # (its rows are read only at a conflict, past the journal's first write)
        recovery = f"{RECOVERY_PREFIX}/{time.strftime('%Y%m%dT%H%M%S')}-{head[:8]}"
        git.run("update-ref", "-m", "c128patch rebase: recovery point", recovery, head)
        journal = Journal(onto_rev, onto_commit, old_rev, old["commit"], git.current_branch(), head, recovery,
                          str(self.series.root), drop_merged, steps, upstream=dict(old),
                          layers=layer_folders(self.series),
                          head_before=onto_commit)  # the branch and work tree stay as they are to a stop or the end
        self.state.mkdir(parents=True, exist_ok=True)
        for step in (s for s in steps if s.kind == "entry" and s.name in drop):
            self._drop(journal, step, "")
        try:
            fault_point("at", "rebase-start")
            journal.save(self.path)
        except BaseException:  # (a Ctrl-C, say) no rebase was started: no recovery point of one stays
            if not self.path.is_file():
                git.run("update-ref", "-d", recovery, head)
            raise
        return self._run(journal)

    def _same_layers(self, record: dict, onto_rev: str) -> None:
        """Refuse a stack that leaves out or reorders the tree's layers (a ``c128patch.toml`` naming others, say): the
        rebase would carry their entries as commits of the user's and record the other stack (helper 101)."""
        if starts_stack(record, self.series):  # the tree's, maybe with more on top
            return
        applied, effect = applied_layers(record), [layer.name for layer in self.series.layers]
        folders, ours = tree_layers(self.git), self.series.ours
        own = shell_join(["c128patch", "rebase", "--onto", onto_rev, "--tree", str(self.git.worktree), "--series",
                          str(ours.root), *(a for f in folders for a in ("--layer", str(f)))])
        raise C128Error(f"cannot rebase: the tree carries layer(s) {', '.join(applied)}, the layers in effect are "
                        f"{', '.join(effect) or 'none'}: the rebase would carry the tree's layer entries as commits of "
                        "yours. Rebase with the tree's own" + (f": {own}" if folders else " (name their folders with "
                                                               "--layer DIR)")
                        + "; for another stack, apply it on a new tree (c128patch apply --layer DIR --tree NEW); "
                        "nothing was changed")

    def resume(self) -> dict:
        journal = Journal.load(self.path, self.git)
        git = self.git
        if journal.pos >= len(journal.steps):  # cut short while finishing: the tree may hold half a checkout
            theirs, mine = cut_checkout(self.git, journal.head_before)
            if mine:
                raise C128Error(f"cannot continue: {len(mine)} path(s) changed since the rebase was cut short, "
                                f"not by it ({', '.join(mine[:3])}); move them away (git -C "
                                f"{shell_quote(str(git.worktree))} stash -u), then run this again")
            self._put_back(theirs)
            return self._run(journal)
        step = journal.steps[journal.pos]
        if journal.paused == "merged":  # the user keeps an entry that looked merged
            journal.paused = ""
            journal.save(self.path)
            return self._run(journal, keep=True)
        if journal.paused == "conflict" and (git.head() or "") == journal.head_before:
            return self._resolved(journal, step)
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
            stash = shell_join(["git", "-C", str(git.worktree), "stash", "-u"])
            raise C128Error("cannot continue: the tree has changes but no entry is stopped; "
                            f"stash them ({stash}) or undo with `{rebase_command(git.worktree, 'abort')}`")
        return self._run(journal)

    def _resolved(self, journal: Journal, step: Step) -> dict:
        """``--continue`` at a stop whose resolution is staged (HEAD where the stop left it)."""
        git = self.git
        if unmerged := unmerged_paths(git):
            raise C128Error(f"cannot continue: conflicts remain in {', '.join(unmerged)}; "
                            "resolve them and `git add` them")
        if unstaged := git.out("diff", "--name-only").split():
            raise C128Error(f"cannot continue: unstaged changes in {', '.join(unstaged)}; `git add` the resolution "
                            "(or stash what is not part of it)")
        refuse_conflict_markers(git, "HEAD", None, "continue")  # before the ledger can record them
        tree = git.out("write-tree")
        phase, journal.paused, step.phase = step.phase, "", ""
        found = step.stop.get("taken") or {}
        item = self._plan(journal).get(step.name)
        retarget = phase == "series" and found and item is not None and item.touched != [found["target"]]
        upstream_side = (phase == "series" and not step.user_edit
                         and tree == git.out("rev-parse", f"{journal.head_before}^{{tree}}"))
        recorded = (self.ledger.record(git, step.name, journal.old_rev, journal.onto_rev,
                                       saved_conflicts(self.state, git.worktree))  # type: ignore[arg-type]
                    if phase == "series" and not retarget and not upstream_side else [])
        git.run("reset", "--quiet", "--hard", "HEAD")  # what is kept of the resolution is ``tree``
        if retarget:  # the series gave the overlay another target: replay it
            step.status, step.stop, step.detail = "pending", {}, ""
            journal.save(self.path)
        elif upstream_side and not found and (older := self._older_than_its_base(step.name, journal.onto_commit)):
            step.status, step.applied = "skipped", ""  # on a release its own base contains: left out, not merged
            step.detail = (f"left out: its conflict was resolved to upstream's side on {journal.onto_rev}, older than "
                           f"its base {older} (not merged upstream: kept for the releases it applies to)")
            step.signals.append(asdict(Signal("became-empty", "resolved to upstream's side, it changes nothing")))
            self._advance(journal)
        elif upstream_side:  # resolved to upstream's side: nothing of ours is left
            step.status, step.applied = "dropped-as-merged", ""
            step.detail = ("empty: its conflict was resolved to upstream's side, so upstream holds it (merged)"
                           if not found else f"superseded: upstream's own {found['target']} is kept"
                           + (f" (created in {found['created']})" if found["created"] else ""))
            step.signals.append(asdict(Signal("became-empty", "resolved to upstream's side, it changes nothing")))
            self._advance(journal)
        elif phase == "series":
            step.ledger += recorded
            step.applied, step.series_tree = "resolved", tree
            step.detail = "resolved by hand" + ("; recorded in the ledger" if recorded else "")
            self._carry(journal, step)
        else:
            step.detail = "your edit re-resolved by hand" if step.kind == "entry" else "carried; resolved by hand"
            self._commit(journal, step, tree)
        return self._run(journal)

    def _stop_cut_short(self, journal: Journal) -> bool:
        """Killed inside ``_stop``: not yet paused, HEAD detached there, only the entry's files changed."""
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

    def skip(self, drop: str | None = None) -> dict:
        """``--skip``: the stopped step skipped; ``--drop NAME`` (``drop``): dropped as merged upstream; it goes on."""
        verb, journal = "skip" if drop is None else "drop", Journal.load(self.path, self.git)
        step = journal.steps[journal.pos] if journal.pos < len(journal.steps) else None
        if step is None and verb == "skip":
            raise C128Error("cannot skip: every entry is done (the rebase was cut short while finishing): resume with "
                            f"`{rebase_command(self.git.cwd, 'continue')}`")
        if verb == "drop" and (step is None or not journal.paused or step.kind != "entry" or step.name != drop):
            at = f"stopped at entry '{step.name}'" if step is not None and journal.paused else "not stopped at an entry"
            raise C128Error(f"cannot drop '{drop}': the rebase is {at}; alone, --drop names the entry the rebase "
                            f"stopped at (with --onto, the entries to drop from the start)")
        assert step is not None
        older = self._older_than_its_base(step.name, journal.onto_commit) if step.kind == "entry" else ""
        if verb == "drop" and older and journal.paused == "conflict":
            raise C128Error(f"cannot drop '{drop}' as merged upstream: {journal.onto_rev} is older than its base "
                            f"{older}, which needs it (merged_in there would drop it from {older} too); leave it out "
                            f"on {journal.onto_rev} instead: {rebase_command(self.git.cwd, 'skip')}")
        if journal.paused == "conflict":  # the stop's conflict state undone (what the rebase wrote)
            self.git.run("reset", "--quiet", "--hard", "HEAD")
        elif self.git.status_porcelain():
            raise C128Error(f"cannot {verb}: the tree has changes; stash them (git stash -u) first")
        if verb == "drop":
            self._drop(journal, step, journal.paused)
        else:
            step.status = "dropped-as-merged" if journal.paused == "merged" else "skipped"
            step.detail = step.detail if journal.paused == "merged" else "skipped by the user" + (
                f" (older than its base {older}: not merged upstream)" if older else "")
            step.phase = ""
        self._advance(journal)
        return self._run(journal)

    def _drop(self, journal: Journal, step: Step, paused: Paused) -> None:
        """``step`` dropped as merged upstream by the user (``--drop``; ``Step.merged_in`` says where)."""
        found = step.stop.get("taken") or {}
        if paused == "merged":  # the content signals said so already
            step.detail = step.detail or "dropped by the user (--drop)"
        elif found:
            step.detail = (f"superseded: upstream's own {found['target']} is kept (--drop)"
                           + (f", created in {found['created']}" if found["created"] else ""))
        else:
            step.detail = "dropped: upstream holds it, the user said (--drop)"
            item = None if paused else self._plan(journal).get(step.name)  # from the start: hints name the commit
            if item is not None:
                step.hints = [h.to_json() for h in upstream_hints(
                    self.git, item.entry, item.patch, journal.old_commit, journal.onto_commit,
                    cache=self._hint_cache, every=self._touched or None)]
        step.status, step.phase = "dropped-as-merged", ""

    def abort(self) -> dict:
        journal = Journal.load(self.path, self.git)
        git = self.git
        if journal.pos < len(journal.steps) and self._stop_cut_short(journal):
            git.run("reset", "--quiet", "--hard")  # the cut-short stop's conflict state: the tool's own
        state, stopped = tree_state(git), journal.stop_state  # the user's paths: all, or those changed since the stop
        if journal.pos >= len(journal.steps):  # cut short while finishing: half a checkout of the new tip is ours
            theirs, mine = cut_checkout(self.git, journal.head_before)
        else:
            mine = (sorted(p for p in set(state) | set(stopped) if state.get(p) != stopped.get(p))
                    if journal.paused == "conflict" else sorted(state))
            theirs = sorted(set(state) - set(mine))  # the tool's own changes: conflict markers, files it added
        git.run("reset", "--quiet")  # unmerged entries out of the way; the work tree stays
        self._put_back(theirs)
        stash = ""
        if mine:  # never throw away what the user typed mid-rebase
            git.run("add", "--all", "--", *mine)
            if stash := git.out("stash", "create", "c128patch rebase --abort: work in progress"):
                git.run("stash", "store", "-m", "c128patch rebase --abort: work in progress", stash)
        git.run("reset", "--quiet", "--hard")
        if journal.orig_branch:
            git.run("checkout", "--quiet", journal.orig_branch)
            if git.head() != journal.orig_head:
                git.run("reset", "--quiet", "--hard", journal.orig_head)
        else:
            git.run("checkout", "--quiet", "--detach", journal.orig_head)
        self._forget()
        return {"ok": True, "aborted": True, "branch": journal.orig_branch, "head": journal.orig_head,
                "recovery_ref": journal.recovery_ref, "stash": stash, "stashed": mine}

    def _put_back(self, paths: list[str]) -> None:
        """``paths`` as HEAD has them (the tool's own changes): checked out where HEAD has them, else removed."""
        git = self.git
        if tracked := sorted(ls_tree(git, "HEAD", paths)) if paths else []:
            git.run("checkout", "--quiet", "HEAD", "--", *tracked)
        for path in set(paths) - set(tracked):
            (git.worktree / path).unlink(missing_ok=True)  # type: ignore[operator]

    def _steps(self, old_commit: str, head: str, record: dict) -> list[Step]:
        """The entries in order, each with its commit and user edit; the user's commits after their entry."""
        git, rev = self.git, record.get("upstream", {}).get("rev", old_commit)
        with procs.scratch("c128rebase-") as tmp:  # the replay the branch's proof recorded, else
            fresh = proofs.recorded_trees(self.state, proofs.proof_key(git, self.series, rev, old_commit, head))
            if fresh is None:  # one made now
                fresh = {}
                replay_in_index(self.series, git, rev, old_commit, Path(tmp) / "fresh.index", ledger=self.ledger,
                                trees=fresh)
            verdicts = compare_commits(self.series, git, old_commit, head, Path(tmp), fresh)
        names = [v.commit.entry for v in verdicts if v.commit.entry]
        if twice := sorted({n for n in names if names.count(n) > 1}):
            raise C128Error(f"cannot rebase: two commits carry '{ENTRY_TRAILER}: {twice[0]}'; squash them first")
        applied = {e.get("name") for e in record.get("entries", [])}
        in_series = {e.name for e in self.series.entries}
        by_entry: dict = {}
        after: dict[str, list[Step]] = {}  # entry -> the commits carried after it ("": before every entry)
        last = ""
        for v in verdicts:
            c = v.commit
            if v.kind in ("series", "user-edit") and c.entry in in_series:
                by_entry[c.entry], last = v, c.entry
                continue
            after.setdefault(last, []).append(Step(c.entry or c.subject, "commit", c.sha, c.subject, applied="carried",
                                                   detail="your commit, carried" if v.kind == "user-commit"
                                                   else f"carried as it is: {v.detail}"))
        # an entry new to the branch whose change a commit of the user's makes (a layer's entry taken from it by
        # add-entry): that commit is the entry's, replayed as it, not carried before it (which empties the entry)
        new = {e.name for e in self.series.entries if e.name not in applied and e.name not in by_entry}
        for v in verdicts if new else []:
            if v.kind == "user-commit" and (name := entry_making(git, self.series, v.commit.sha, new)):
                by_entry[name] = v
                new.discard(name)
                after = {k: [c for c in carried if c.sha != v.commit.sha] for k, carried in after.items()}
        # the commits above the branch's last entry stay above every entry (one left out before, a skip, and
        # replayed now, goes below them: the printed `add-entry --from-commit HEAD~N` counts on it)
        tail = after.pop(last, []) if last else []
        steps = after.get("", [])
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
        return steps + tail
