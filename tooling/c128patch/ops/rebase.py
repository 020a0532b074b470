"""``rebase``: move a patched branch onto another upstream rev, entry by entry, resumably.

Each entry's commit is cherry-picked onto the new base (a real 3-way merge: its parent is the old
base). The state lives in a journal (``.git/c128patch/rebase.json``), written before every step, so
a conflict, a dirty tree or a killed process leaves something ``--continue``, ``--skip`` or
``--abort`` can finish. Resolutions are recorded in the series' ledger (``patches/resolutions/``,
ledger.py) and replayed for the same entry and conflict on any machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from c128patch.errors import C128Error, ConflictError
from c128patch.git import Git
from c128patch.jsonio import write_json_atomic
from c128patch.ops.refresh import _commits as entry_commits
from c128patch.ops.refresh import format_patch
from c128patch.ops.treestate import c128_state_dir, ensure_clean, ensure_idle, git_path, rebase_journal
from c128patch.series import provenance
from c128patch.series.ledger import Conflict, Ledger
from c128patch.series.manifest import Series
from c128patch.series.plan import ENTRY_TRAILER
from c128patch.series.provenance import PROVENANCE_PATH, read_provenance

PICK = ("-c", "merge.conflictStyle=merge", "-c", "core.editor=true", "-c", "rerere.enabled=false")
RECOVERY_PREFIX = "refs/c128patch/recovery"
_PR = re.compile(r"#(\d+)")


@dataclass
class Step:
    sha: str  # the entry's commit on the old branch
    name: str
    subject: str
    status: str = "pending"  # pending | unchanged | context-only | content-changed | resolved | dropped-as-merged | skipped | failing
    detail: str = ""
    new_sha: str = ""
    ledger: list[str] = field(default_factory=list)
    upstream_commits: list[str] = field(default_factory=list)


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
    head_before: str = ""
    paused: str = ""  # "" | "conflict" | "merged"

    @classmethod
    def load(cls, path: Path) -> "Journal":
        data = json.loads(path.read_text())
        data["steps"] = [Step(**s) for s in data["steps"]]
        return cls(**data)

    def save(self, path: Path) -> None:
        write_json_atomic(path, asdict(self))


class Rebase:
    def __init__(self, git: Git, series: Series) -> None:
        self.git = git
        self.series = series
        self.path = rebase_journal(git)

    # ------------------------------------------------------------------ entry points
    def start(self, onto_rev: str, onto_commit: str, *, drop_merged: bool = False) -> dict:
        git = self.git
        ensure_idle(git, "rebase")
        ensure_clean(git, "rebase")
        record = read_provenance(git.worktree)  # type: ignore[arg-type]
        old = record.get("upstream", {})
        if not old.get("commit") or git.rev_parse(old["commit"]) is None:
            raise C128Error(f"cannot rebase: the upstream base recorded in {PROVENANCE_PATH} is not in this repository")
        head = git.head() or ""
        steps = [Step(sha, name, git.out("log", "-1", "--format=%s", sha)) for sha, name in entry_commits(git, old["commit"])]
        if not steps:
            raise C128Error("cannot rebase: no c128patch entries on this branch")
        recovery = f"{RECOVERY_PREFIX}/{time.strftime('%Y%m%dT%H%M%S')}-{head[:8]}"
        git.run("update-ref", "-m", "c128patch rebase: recovery point", recovery, head)
        journal = Journal(onto_rev, onto_commit, old.get("rev", old["commit"][:12]), old["commit"], git.current_branch(),
                          head, recovery, str(self.series.root), drop_merged, steps)
        c128_state_dir(git).mkdir(parents=True, exist_ok=True)
        journal.save(self.path)
        git.run("checkout", "--quiet", "--detach", onto_commit)
        journal.head_before = onto_commit
        journal.save(self.path)
        return self._run(journal)

    def resume(self) -> dict:
        journal = self._journal()
        git = self.git
        step = journal.steps[journal.pos]
        if journal.paused == "merged":  # the user keeps an entry that looked merged: pick it
            journal.paused = ""
            journal.save(self.path)
            return self._run(journal, force_pick=True)
        if self._picking():
            unmerged = git.out("diff", "--name-only", "--diff-filter=U").split()
            if unmerged:
                raise C128Error(f"cannot continue: conflicts remain in {', '.join(unmerged)}; resolve them and `git add` them")
            unstaged = git.out("diff", "--name-only").split()
            if unstaged:
                raise C128Error(f"cannot continue: unstaged changes in {', '.join(unstaged)}; `git add` the resolution "
                                "(or stash what is not part of it)")
            conflicts = self._saved_conflicts()
            recorded = Ledger(self.series).record(git, step.name, journal.old_rev, journal.onto_rev, conflicts)
            self._commit_pick(journal, step)
            step.status, step.ledger = "resolved", recorded
            step.detail = "resolved by hand; recorded in the ledger"
            self._advance(journal)
        elif (git.head() or "") != journal.head_before:  # committed already (by the user, or before a kill)
            step.new_sha = git.head() or ""
            if not step.status or step.status in ("pending", "failing"):
                step.status = self._classify(step.sha, step.new_sha)
            self._advance(journal)
        elif git.status_porcelain():
            raise C128Error("cannot continue: the tree has changes but no pick is in progress; "
                            "stash them (git stash -u) or undo with `c128patch rebase --abort`")
        return self._run(journal)

    def skip(self) -> dict:
        journal = self._journal()
        step = journal.steps[journal.pos]
        if self._picking():
            self.git.run("cherry-pick", "--skip")
        elif (self.git.head() or "") != journal.head_before:
            raise C128Error("cannot skip: the entry is already committed; use --continue, or --abort")
        elif self.git.status_porcelain():
            raise C128Error("cannot skip: the tree has changes; stash them (git stash -u) first")
        step.status = "dropped-as-merged" if journal.paused == "merged" else "skipped"
        step.detail = step.detail or "skipped by the user"
        journal.paused = ""
        self._advance(journal)
        return self._run(journal)

    def abort(self) -> dict:
        journal = self._journal()
        git = self.git
        stash = ""
        if git.status_porcelain():  # never throw away what the user typed mid-rebase (resolutions too)
            git.run("add", "--all")
            stash = git.out("stash", "create", "c128patch rebase --abort: work in progress")
            if stash:
                git.run("stash", "store", "-m", "c128patch rebase --abort: work in progress", stash)
        if self._picking():
            git.run("cherry-pick", "--abort", check=False)
        git.run("reset", "--quiet", "--hard")
        if journal.orig_branch:
            git.run("checkout", "--quiet", journal.orig_branch)
            if git.head() != journal.orig_head:
                git.run("reset", "--quiet", "--hard", journal.orig_head)
        else:
            git.run("checkout", "--quiet", "--detach", journal.orig_head)
        self.path.unlink()
        (c128_state_dir(git) / "conflicts.json").unlink(missing_ok=True)
        return {"ok": True, "aborted": True, "branch": journal.orig_branch, "head": journal.orig_head,
                "recovery_ref": journal.recovery_ref, "stash": stash}

    # ------------------------------------------------------------------ the loop
    def _journal(self) -> Journal:
        if not self.path.is_file():
            raise C128Error("no c128patch rebase is in progress here")
        return Journal.load(self.path)

    def _picking(self) -> bool:
        return git_path(self.git, "CHERRY_PICK_HEAD").exists()

    def _advance(self, journal: Journal) -> None:
        journal.pos += 1
        journal.head_before = self.git.head() or ""
        journal.paused = ""
        journal.save(self.path)

    def _run(self, journal: Journal, force_pick: bool = False) -> dict:
        git = self.git
        date = git.out("show", "-s", "--format=%cI", journal.onto_commit)
        while journal.pos < len(journal.steps):
            step = journal.steps[journal.pos]
            journal.head_before = git.head() or ""
            journal.save(self.path)
            if not force_pick:
                merged = self._merged_reason(journal, step)
                if merged:
                    step.detail = merged
                    if journal.drop_merged:
                        step.status = "dropped-as-merged"
                        self._advance(journal)
                        continue
                    journal.paused = "merged"
                    step.status = "pending"
                    journal.save(self.path)
                    raise ConflictError(
                        f"entry '{step.name}' looks merged upstream ({merged}); nothing was dropped",
                        hint="  drop it: c128patch rebase --skip\n  keep it: c128patch rebase --continue\n"
                             "  undo:    c128patch rebase --abort",
                        report=self.report(journal))
            force_pick = False
            _fault_point(step.name)
            proc = git.with_env(GIT_COMMITTER_DATE=date).run(*PICK, "cherry-pick", "--allow-empty", step.sha,
                                                             check=False)
            output = proc.stdout + proc.stderr
            if proc.returncode == 0:
                step.new_sha = git.head() or ""
                if git.out("rev-parse", f"{step.new_sha}^{{tree}}") == git.out("rev-parse", f"{journal.head_before}^{{tree}}"):
                    git.run("reset", "--quiet", "--hard", journal.head_before)  # became empty
                    step.status, step.detail, step.new_sha = "dropped-as-merged", "became empty on the new base", ""
                else:
                    step.status = self._classify(step.sha, step.new_sha)
                self._advance(journal)
                continue
            if not self._picking():
                raise C128Error(f"cherry-pick of entry '{step.name}' failed: {output.strip().splitlines()[-1:]}")
            if not git.out("ls-files", "--unmerged") and git.ok("diff", "--cached", "--quiet"):
                git.run("cherry-pick", "--skip")  # the new base already has every change of it
                step.status, step.detail = "dropped-as-merged", "became empty on the new base"
                self._advance(journal)
                continue
            ledger = Ledger(self.series)
            conflicts = ledger.conflicts(git, git.out("diff", "--name-only", "--diff-filter=U").split())
            replayed = ledger.replay(git, step.name, conflicts)
            unmerged = git.out("diff", "--name-only", "--diff-filter=U").split()
            if not unmerged:  # the ledger held a resolution for every conflict
                self._commit_pick(journal, step)
                step.status, step.ledger, step.detail = "resolved", replayed, "resolved from the ledger"
                self._advance(journal)
                continue
            self._save_conflicts([c for c in conflicts if c.path in unmerged])
            step.status = "failing"
            step.detail = f"conflicts in {', '.join(unmerged)}"
            step.upstream_commits = git.out("log", "--format=%h %s", f"{journal.old_commit}..{journal.onto_commit}",
                                            "--", *unmerged).splitlines()
            journal.paused = "conflict"
            journal.save(self.path)
            tree = git.worktree
            raise ConflictError(
                f"entry '{step.name}' conflicts on {journal.onto_rev} in {', '.join(unmerged)}",
                hint=(f"  resolve: edit the files, `git -C {tree} add` them, then c128patch rebase --continue\n"
                      "  drop it: c128patch rebase --skip\n"
                      f"  undo:    c128patch rebase --abort (back to {journal.orig_branch or journal.orig_head[:12]})"),
                report=self.report(journal))
        return self._finish(journal)

    def _commit_pick(self, journal: Journal, step: Step) -> None:
        date = self.git.out("show", "-s", "--format=%cI", journal.onto_commit)
        self.git.with_env(GIT_COMMITTER_DATE=date).run(*PICK, "cherry-pick", "--continue")
        step.new_sha = self.git.head() or ""

    def _save_conflicts(self, conflicts: list[Conflict]) -> None:
        """Keep the conflicted files as git left them: --continue records the resolution against them."""
        (c128_state_dir(self.git) / "conflicts.json").write_text(json.dumps([asdict(c) for c in conflicts]))

    def _saved_conflicts(self) -> list[Conflict]:
        path = c128_state_dir(self.git) / "conflicts.json"
        return [Conflict(**c) for c in json.loads(path.read_text())] if path.is_file() else []

    def _classify(self, old_sha: str, new_sha: str) -> str:
        """unchanged (same diff), context-only (same added/removed lines), content-changed."""
        if self._change_id(old_sha) != self._change_id(new_sha):
            return "content-changed"
        drop_index = lambda d: re.sub(r"^index .*$", "", d, flags=re.M)  # noqa: E731
        old, new = (drop_index(self.git.run("show", "--format=", sha).stdout) for sha in (old_sha, new_sha))
        return "unchanged" if old == new else "context-only"

    def _change_id(self, sha: str) -> str:
        """git's patch-id of the diff without context lines: what the commit adds and removes."""
        diff = self.git.run("show", "--format=", "--unified=0", sha).stdout
        out = self.git.run("patch-id", "--stable", input=diff).stdout.split()
        return out[0] if out else ""

    def _merged_reason(self, journal: Journal, step: Step) -> str:
        """Why the new base seems to hold the entry already ("" when it does not)."""
        git = self.git
        entry = next((e for e in self.series.entries if e.name == step.name), None)
        rng = f"{journal.old_commit}..{journal.onto_commit}"
        if entry and entry.upstream:
            for number in _PR.findall(entry.upstream):
                hit = git.out("log", "--format=%h %s", "-E", f"--grep=\\(#{number}\\)", rng)
                if hit:
                    return f"upstream commit {hit.splitlines()[0]} names PR #{number}"
        diff = git.run("show", "--format=", step.sha).stdout
        if diff.strip():
            with_index = git.with_env(GIT_INDEX_FILE=str(c128_state_dir(git) / "merged-check.index"))
            with_index.run("read-tree", journal.head_before)
            reverse = with_index.run("apply", "--cached", "--check", "-R", input=diff, check=False)
            (c128_state_dir(git) / "merged-check.index").unlink(missing_ok=True)
            if reverse.returncode == 0:
                return "its diff reverse-applies on the new base"
            pid = self._change_id(step.sha)
            files = [l for l in git.out("show", "--format=", "--name-only", step.sha).splitlines() if l]
            for sha in git.out("log", "--format=%H", rng, "--", *files).splitlines():
                if self._change_id(sha) == pid:
                    return f"upstream commit {sha[:12]} has the same patch-id"
        return ""

    def _finish(self, journal: Journal) -> dict:
        git = self.git
        kept = [s for s in journal.steps if s.new_sha]
        old_prov = json.loads(git.blob(journal.orig_head, PROVENANCE_PATH) or b"{}")
        by_name = {e["name"]: e for e in old_prov.get("entries", [])}
        entries = []
        for s in kept:
            row = dict(by_name.get(s.name, {"name": s.name, "kind": "patch"}))
            row.update(commit=s.new_sha, applied=s.status)
            if row.get("kind") == "patch":
                row["sha256"] = hashlib.sha256(format_patch(git, s.new_sha, s.name)).hexdigest()
                row["variant_base"] = journal.onto_rev
            entries.append(row)
        new_record = dict(old_prov)
        new_record["upstream"] = {**new_record.get("upstream", {}), "rev": journal.onto_rev, "commit": journal.onto_commit}
        new_record["entries"] = entries
        new_record["rebased_from"] = {"rev": journal.old_rev, "commit": journal.old_commit}
        (git.worktree / PROVENANCE_PATH).write_text(provenance.dumps(new_record))  # type: ignore[operator]
        git.run("add", "--", PROVENANCE_PATH)
        date = git.out("show", "-s", "--format=%cI", journal.onto_commit)
        git.with_env(GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date).run(
            "commit", "--quiet", "--no-verify", "-m",
            f"c128patch: provenance (series {self.series.name} rebased onto {journal.onto_rev})\n\n{ENTRY_TRAILER}: provenance\n")
        new_head = git.head() or ""
        if journal.orig_branch:
            git.run("update-ref", "-m", f"c128patch rebase onto {journal.onto_rev}", f"refs/heads/{journal.orig_branch}",
                    new_head, journal.orig_head)
            git.run("checkout", "--quiet", journal.orig_branch)
        report = self.report(journal, new_head)
        state = c128_state_dir(git)
        (state / "rebase-report.json").write_text(json.dumps(report, indent=2) + "\n")
        (state / "rebase-report.md").write_text(render_markdown(report))
        self.path.unlink()
        (state / "conflicts.json").unlink(missing_ok=True)
        return report

    # ------------------------------------------------------------------ report
    def report(self, journal: Journal, new_head: str | None = None) -> dict:
        git = self.git
        between = git.out("log", "--format=%h %s", f"{journal.old_commit}..{journal.onto_commit}").splitlines()
        out = {
            "ok": new_head is not None,
            "old_base": {"rev": journal.old_rev, "commit": journal.old_commit},
            "new_base": {"rev": journal.onto_rev, "commit": journal.onto_commit},
            "upstream_commits_between": len(between),
            "upstream_commits": between[:200],
            "entries": [asdict(s) for s in journal.steps],
            "recovery_ref": journal.recovery_ref,
            "branch": journal.orig_branch,
            "head": new_head or git.head(),
        }
        if new_head:
            proc = git.run("range-diff", "--no-color", f"{journal.old_commit}..{journal.orig_head}",
                           f"{journal.onto_commit}..{new_head}", check=False)
            out["range_diff"] = [l for l in proc.stdout.splitlines() if re.match(r"^\s*(\d+|-):", l)]
        return out


def render_markdown(report: dict) -> str:
    old, new = report["old_base"], report["new_base"]
    lines = [f"# c128patch rebase: {old['rev']} → {new['rev']}", "",
             f"{report['upstream_commits_between']} upstream commit(s) between `{old['commit'][:12]}` and "
             f"`{new['commit'][:12]}`.", "", "| entry | status | detail |", "| --- | --- | --- |"]
    for e in report["entries"]:
        detail = e["detail"] + (f" (ledger {', '.join(e['ledger'])})" if e["ledger"] else "")
        if e["upstream_commits"]:
            detail += "; upstream commits on its files: " + "; ".join(e["upstream_commits"][:5])
        lines.append(f"| {e['name']} | {e['status']} | {detail} |")
    if report.get("range_diff"):
        lines += ["", "## range-diff", "", "```", *report["range_diff"], "```"]
    return "\n".join(lines) + "\n"


def _fault_point(name: str) -> None:
    """Test hook: C128PATCH_FAULT=kill-before:<entry> (SIGKILL) or sigint-before:<entry> (SIGINT)
    interrupts this process right before that entry's pick."""
    fault = os.environ.get("C128PATCH_FAULT", "")
    if fault == f"kill-before:{name}":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == f"sigint-before:{name}":
        os.kill(os.getpid(), signal.SIGINT)
