"""``apply``: check out an upstream rev on a new branch and replay the series, one commit per entry.

Resumable and undoable like ``git am``. The journal (``<git dir>/c128patch/apply.json``) is saved
before every step (``clone``, ``checkout``, one per run of entries, ``provenance``) and removed with
the provenance commit. A run is one entry, or consecutive patches carrying their entry trailer up to
a fault point (tests), applied by one ``git am``; where it stops, the entries before are recorded and
the one it stopped at is applied alone, as any entry. A step marks itself ``in_step`` before it
touches anything, so what it left half done after a kill is known to be ours: ``apply --continue``
puts the tree back at the step's start and redoes it (fixed dates and identity: the same commits).
``apply --abort`` restores the original branch or HEAD, deletes the new branch, the recovery ref
and a clone it made; changes that are not the interrupted step's own are stashed, never dropped (a clone it
made holding some is kept, detached at the rev, the new branch deleted).
One operation per repository at a time (``treestate.repo_lock``). A finished apply must equal a
fresh replay of the series (``ops.equivalence``), else it fails (exit 1) with the hunks and the
undo. On a conflict the branch stays at the last entry that applied, the failing entry, file and
hunk named; a resolution made with ``git am`` is taken by ``apply --continue`` as the entry (no
conflict markers). Nothing is written through a symlink, and patches may not create symlinks
(``plan``).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

from c128patch.errors import C128Error, ConflictError, DifferenceError, Interrupted
from c128patch.git import Git, environment_problem, stripspace
from c128patch.jsonio import write_json_atomic
from c128patch.ops import proofs
from c128patch.ops.equivalence import entry_trees, fresh_replay, prove
from c128patch.ops.replay import branch_commits, have_blobs, preimages, write_preimages
from c128patch.ops.treestate import (
    RECOVERY_PREFIX,
    apply_commands,
    apply_journal,
    changed_paths,
    checked_fields,
    cut_checkout,
    ensure_clean,
    ensure_idle,
    fault_named,
    fault_point,
    git_command,
    git_paths,
    own_index_lock,
    read_journal,
    refuse_cloning,
    refuse_conflict_markers,
    remember_layers,
    repo_lock,
)
from c128patch.progress import NullReporter, Reporter
from c128patch.series import provenance
from c128patch.series.layers import SEP, layer_args, layer_folders, overlap_note, recorded_stack
from c128patch.series.manifest import Series, default_series_root
from c128patch.series.patchfile import PatchInfo
from c128patch.series.paths import check_under, confine, symlink_on_path
from c128patch.series.plan import ENTRY_TRAILER, Planned, check_paths_at, merged_entries, overlay_message, plan
from c128patch.textsafe import shell_join, shell_quote
from c128patch.upstream.source import Target, discard_fresh_tree, fetch_into

# git checkout's line for a blob it could not read: it exits 0, the file missing (a damaged source: "does not apply")
_UNREAD = re.compile(r"(?:unable to read sha1 file|invalid object) [^\n]{0,200}")

PHASES = ("clone", "checkout", "entries", "provenance")
RESUME_NOTE = " (fix that, then resume)"  # the machine failed mid-apply (a fresh clone's is removed: no resume)


@dataclass
class ApplyResult:
    tree: str
    rev: str
    upstream_commit: str
    branch: str
    head: str = ""
    recovery_ref: str = ""
    orig_branch: str | None = None
    orig_head: str | None = None
    orig_unreachable: int = 0  # commits of a detached HEAD that no branch, tag or remote holds
    entries: list[dict] = field(default_factory=list)
    provenance: str = provenance.PROVENANCE_PATH
    equivalence: dict = field(default_factory=dict)  # the proof: the tree against a fresh replay of the series
    already_applied: bool = False  # the branch held this series on this rev already: nothing was done
    commits_on_top: int = 0
    checked_out: bool = True

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class ApplyJournal:
    rev: str
    upstream_commit: str
    branch: str
    series_root: str
    series_digest: str
    upstream_info: dict
    names: list[str]  # the entries, in order
    fresh_clone: bool = False
    tree_existed: bool = False  # fresh clone into a folder that was there (empty) before
    source: str = ""  # fresh clone: the repository it was cloned from
    orig_branch: str | None = None
    orig_head: str | None = None
    orig_unreachable: int = 0
    recovery_ref: str = ""
    phase: str = "clone"  # one of PHASES
    head_before: str = ""  # HEAD before the step in progress
    in_step: bool = False  # a step started and is not recorded: what it left is ours to clean
    step_paths: list[str] = field(default_factory=list)  # what that step writes
    paused: str = ""  # "" | "conflict"
    entries: list[dict] = field(default_factory=list)  # rows of the entries committed, in order
    layers: list[str] = field(default_factory=list)  # the layer folders applied after the series, in order
    cloning: str = ""  # the apply cloning into the tree (``procs.owner_tag``), until it holds the tree's lock

    @classmethod
    def new(cls, series: Series, target: Target, branch: str, planned: list[Planned], **state: object) -> ApplyJournal:
        """The journal of an apply of ``planned`` (``series`` on ``target``) to ``branch``, not started."""
        return cls(target.rev, target.commit, branch, str(series.root), series.digest(), target.to_json(),
                   [p.entry.name for p in planned], layers=layer_folders(series), **state)  # type: ignore[arg-type]

    @classmethod
    def load(cls, git: Git, path: Path) -> ApplyJournal:
        if not path.is_file():
            raise C128Error(f"no c128patch apply is in progress in {git.cwd.resolve()}")
        journal = cls(**checked_fields(cls, read_journal(git, path, "apply"), git, path, "apply"))
        if journal.phase not in PHASES or not all(isinstance(r, dict) and isinstance(r.get("name"), str)
                                                  for r in journal.entries) or journal.done > journal.total:
            raise C128Error(f"cannot read the c128patch apply journal {path} (bad phase or entries)")
        return journal

    def save(self, path: Path) -> None:
        write_json_atomic(path, asdict(self), sync=False)  # in the git dir (jsonio.write_atomic)

    @property
    def done(self) -> int:
        return len(self.entries)

    @property
    def total(self) -> int:
        return len(self.names)


def _failure_detail(git: Git, item: Planned, output: str) -> tuple[str, str]:
    """(file, hunk description) of the first failing hunk, as git reports it."""
    patch: PatchInfo = item.patch  # type: ignore[assignment]
    lines = (output + "\n" + git.run("apply", "--check", "--verbose", str(item.path), check=False).stderr).splitlines()
    for line in lines:
        if "patch failed:" in line:
            path, _, num = line.split("patch failed:", 1)[1].strip().rpartition(":")
            hunk = patch.hunk_at(path, int(num)) if num.isdigit() else None
            return path, f"hunk #{hunk[0]} {hunk[1]}" if hunk else f"at line {num}"
        what = "file missing upstream" if "does not exist in index" in line or "No such file" in line else \
            "file already exists upstream" if "already exists" in line else ""
        if what:
            return line.split(":")[1].strip() if ":" in line else "?", what
    conflict = next((line.rsplit(" ", 1)[-1] for line in lines if line.startswith("CONFLICT")), "")
    return (conflict, "3-way merge conflict") if conflict else ((patch.files or ["?"])[0], "does not apply")


def already_applied(series: Series, git: Git, branch: str, target: Target) -> ApplyResult | None:
    """The earlier apply when ``branch`` holds this series on ``target`` (provenance at or below its tip), else None."""
    tip = git.rev_parse(f"refs/heads/{branch}")
    if tip is None:
        return None
    prov_commit = git.out("log", "-1", "--format=%H", tip, "--", provenance.PROVENANCE_PATH)
    record = provenance.committed(git, tip) if prov_commit else None
    if record is None or provenance.applied_digest(record) != series.digest() or \
            record.get("upstream", {}).get("commit") != target.commit:
        return None
    rows = [{"name": e["name"], "kind": e["kind"], "file": e.get("file", e.get("source", "")), "status": "applied",
             "applied": e.get("applied", ""), "commit": e.get("commit", "")} for e in record.get("entries", [])]
    return ApplyResult(str(git.worktree), target.rev, target.commit, branch, head=tip, entries=rows,
                       already_applied=True, commits_on_top=users_commits(git, prov_commit, tip, record),
                       checked_out=git.current_branch() == branch)


def users_commits(git: Git, prov_commit: str, tip: str, record: dict) -> int:
    """The user's commits on a patched branch: above its provenance commit, and those a rebase carried below it
    (its record's ``carried``: commits and entries with an edit of the user's folded in)."""
    return git.count(f"{prov_commit}..{tip}") + len(record.get("carried") or [])


@contextlib.contextmanager
def interrupts_said(tree: Path) -> Iterator[None]:
    """A Ctrl-C in the block becomes the error that says how to resume or undo the apply in ``tree``."""
    try:
        with own_index_lock(tree):
            yield
    except KeyboardInterrupt as stop:
        try:
            kept = apply_journal(Git(worktree=tree)).is_file()
        except (C128Error, OSError):  # (a clone an abort removed)
            kept = False
        if not kept:  # not begun (nothing changed), or an abort done: no journal to resume by
            raise
        resume, undo = apply_commands(tree)
        raise Interrupted.by(stop, f"the apply journal is intact; resume with `{resume}` or undo with `{undo}`") \
            from None


def _row(item: Planned, **more: str) -> dict:
    return {"name": item.entry.name, "kind": item.entry.kind, "file": item.label, **more}


class Apply:
    def __init__(self, git: Git, series: Series | None = None, reporter: Reporter = NullReporter()) -> None:
        assert git.worktree is not None
        self.git = git
        self.tree = git.worktree.resolve()
        self.series = series
        self.reporter = reporter
        self.path = apply_journal(git)
        self._hooks: str | None = None  # the tree's hooks folder (core.hooksPath) relative to it, "" when outside

    def start(self, target: Target, *, branch: str | None = None, fresh_clone: bool = False,
              planned: list[Planned] | None = None) -> ApplyResult:
        git, series = self.git, self.series
        assert series is not None
        branch = branch or target.branch
        if not git.ok("check-ref-format", "--branch", branch):
            raise C128Error(f"invalid branch name: {branch!r}; pass one with --branch NAME")
        with repo_lock(git, "apply"):
            seeded = fresh_clone and self.path.is_file()
            if not fresh_clone:
                ensure_idle(git, "apply")
                done = already_applied(series, git, branch, target)
                if done is not None:
                    return done
                ensure_clean(git, "apply")
            if git.rev_parse(f"refs/heads/{branch}"):
                checked_out, g = git.current_branch() == branch, ["git", "-C", str(self.tree)]
                delete = shell_join([*g, "branch", "-D", branch])
                if checked_out:  # a checked-out branch cannot be deleted: the fix detaches first
                    delete = shell_join([*g, "checkout", "--quiet", "--detach"]) + " && " + delete
                raise C128Error(f"branch {branch} already exists in {self.tree} (not this series on {target.rev}"
                                f"{'; it is checked out' if checked_out else ''}); pass --branch NAME or delete it "
                                f"({delete}); nothing was changed")
            # Everything that can be checked without touching the tree is checked first.
            if planned is None:
                planned = plan(series, git, target.commit)
                check_paths_at(git, target.commit, planned)
            self._check_worktree_paths(planned)
            journal = ApplyJournal.load(git, self.path) if seeded else ApplyJournal.new(
                series, target, branch, planned, fresh_clone=fresh_clone, phase="clone" if fresh_clone else "checkout")
            journal.cloning = ""  # the tree's lock is ours now
            if not fresh_clone:
                journal.orig_branch, journal.orig_head = git.current_branch(), git.head()
                if journal.orig_head:
                    journal.recovery_ref = f"{RECOVERY_PREFIX}/{time.strftime('%Y%m%dT%H%M%S')}-{journal.orig_head[:8]}"
                    if journal.orig_branch is None:  # a detached HEAD: are its commits held anywhere else?
                        journal.orig_unreachable = int(git.out("rev-list", "--count", journal.orig_head, "--not",
                                                               "--branches", "--tags", "--remotes"))
            journal.save(self.path)
            if journal.recovery_ref:
                git.run("update-ref", "-m", "c128patch apply: recovery point", journal.recovery_ref, journal.orig_head)
            return self._guarded(journal, planned)

    def recorded(self) -> Series:
        """The stack the journal names (``resume``'s without a series given): the CLI says its layers first."""
        journal = ApplyJournal.load(self.git, self.path)
        try:
            return recorded_stack(journal.series_root, journal.layers, self.path)
        except C128Error as exc:  # (a folder moved since the stop: "make one with layer new" is no way on)
            raise C128Error(f"{exc.message}; the apply in {self.tree} goes on with the series and layers its journal "
                            f"names: put it back, or undo the apply: `{apply_commands(self.tree)[1]}`") from None

    def resume(self) -> ApplyResult:
        git = self.git
        with interrupts_said(self.tree), repo_lock(git, "apply"):
            journal = ApplyJournal.load(git, self.path)
            refuse_cloning(self.tree, journal.cloning)
            series = self.series or recorded_stack(journal.series_root, journal.layers, self.path)
            self.series = series
            if series.digest() != journal.series_digest:
                _resume, undo = apply_commands(self.tree)
                raise C128Error(f"cannot continue: the series in {series.root} changed since this apply started; "
                                f"undo it ({undo}) and apply again")
            planned = plan(series, git, journal.upstream_commit)
            if journal.in_step:
                self._undo_step(journal)
            elif journal.phase == "entries":
                self._take_resolution(journal, planned)
            return self._guarded(journal, planned)

    def abort(self) -> dict:
        git = self.git
        with interrupts_said(self.tree), repo_lock(git, "apply"):
            journal = ApplyJournal.load(git, self.path)
            refuse_cloning(self.tree, journal.cloning)
            done = {"ok": True, "aborted": True, "tree": str(self.tree), "removed_clone": False}
            git.run("am", "--abort", check=False)  # (none in progress: git refuses, changing nothing)
            ours = set(journal.step_paths) if journal.in_step else set()
            if journal.in_step and journal.phase == "checkout":  # cut short inside it: half a checkout is ours
                empty = journal.fresh_clone and not journal.orig_head  # a clone it made: checked out into nothing
                since = git.out("hash-object", "-t", "tree", "/dev/null") if empty else "HEAD"
                ours |= set(cut_checkout(git, journal.upstream_commit, since)[0])
            theirs = [p for p in changed_paths(git) if p not in ours]
            if journal.fresh_clone and not theirs:  # (the journal is input: a tree holding work is never removed)
                if not discard_fresh_tree(self.tree, journal.tree_existed):
                    raise C128Error(f"the clone {self.tree} this apply made could not be removed whole (too few open "
                                    "files, a read-only disk?): remove it by hand")
                return done | {"removed_clone": True, "branch": None, "head": None, "stash": "", "kept_clone": False,
                               "rev": journal.rev, "reapply": ""}
            stash = ""
            if theirs:  # never throw away what the user typed
                git.run("stash", "push", "--include-untracked", "--quiet", "-m",
                        "c128patch apply --abort: work in progress", "--", *theirs)
                stash = git.out("rev-parse", "refs/stash")
            self._reset("HEAD", sorted(ours))
            kept = journal.fresh_clone and not journal.orig_head  # a clone it made, kept for the work stashed
            if journal.orig_branch:
                git.run("checkout", "--quiet", journal.orig_branch)
            elif journal.orig_head or kept:  # (the kept clone: at the rev, clean, none of the series applied)
                git.run("checkout", "--quiet", "--detach", journal.orig_head or journal.upstream_commit)
            if git.rev_parse(f"refs/heads/{journal.branch}") and git.current_branch() != journal.branch:
                git.run("update-ref", "-d", f"refs/heads/{journal.branch}")
            if journal.recovery_ref:
                git.run("update-ref", "-d", journal.recovery_ref)
            self.path.unlink()
            return done | {"branch": journal.orig_branch, "head": git.head() if kept else journal.orig_head,
                           "stash": stash, "kept_clone": kept, "rev": journal.rev,
                           "reapply": self._reapply(journal) if kept else ""}

    def _reapply(self, journal: ApplyJournal) -> str:
        """The command that applies the stack of ``journal`` again, into this tree, from the same upstream."""
        info = journal.upstream_info
        repo = {"url": info.get("url") or "", "path": journal.source}.get(str(info.get("source")), "")
        target = Target(journal.rev, journal.upstream_commit)
        series = Path(journal.series_root)
        own = series.resolve() == default_series_root().resolve()
        return shell_join(["c128patch", "apply", "--sglang-rev", journal.rev, *(["--repo", repo] if repo else []),
                           *(["--branch", journal.branch] if journal.branch != target.branch else []),
                           "--tree", str(self.tree), *([] if own else ["--series", str(series)]),
                           *(a for layer in journal.layers for a in ("--layer", layer))])

    def _guarded(self, journal: ApplyJournal, planned: list[Planned]) -> ApplyResult:
        """Run the rest; a failure other than a conflict says how to resume or undo (the journal stays)."""
        try:
            return self._run(journal, planned)
        except ConflictError:
            raise
        except C128Error as exc:
            if self.path.is_file():
                resume, undo = apply_commands(self.tree)
                exc.hint = ((exc.hint + "\n") if exc.hint else "") + f"  resume: {resume}\n  undo:   {undo}"
            raise

    def _run(self, journal: ApplyJournal, planned: list[Planned]) -> ApplyResult:
        git, series = self.git, self.series
        assert series is not None
        dated = self._dated(journal)
        head = None  # HEAD as the last step of this process left it (None: read it)
        if journal.phase == "clone":
            fault_point("at", "clone")
            if git.rev_parse(journal.upstream_commit) is None:  # the clone was cut short: fetch what it lacks
                fetch_into(git, journal.source, journal.upstream_commit)
            journal.phase = "checkout"
            journal.save(self.path)
        if journal.phase == "checkout":
            self.reporter.step(f"checking out {journal.rev} on {journal.branch}")
            redo = journal.in_step  # cut short before: what is there is ours
            self._begin(journal, [])
            fault_point("at", "apply-checkout")  # C128PATCH_FAULT=kill-at:apply-checkout (ops.treestate)
            done = git.run("checkout", "--quiet", *(["--force", "-B"] if redo else ["-b"]), journal.branch,
                           journal.upstream_commit)
            if unread := _UNREAD.search(done.stderr):  # git exits 0 with a file it could not read left out
                raise C128Error(f"git checkout of {journal.rev} could not read every file ({unread.group(0)})")
            head = journal.upstream_commit  # (the commit the checkout made HEAD)
            journal.phase, journal.in_step, journal.head_before = "entries", False, head
            journal.save(self.path)
        if journal.phase == "entries":
            while journal.done < len(planned):
                run = self._run_at(planned, journal.done)
                fault_point("before", run[0].entry.name)
                self.reporter.step(f"applying {run[0].entry.name}"
                                   + (f" .. {run[-1].entry.name} ({len(run)} entries)" if len(run) > 1 else ""))
                self._begin(journal, [p for item in run for p in (item.patch.paths if item.patch else
                                                                   [item.entry.target])], head)
                done = self._apply_run(journal, run, planned, dated)
                fault_point("after", run[len(done) - 1].entry.name)  # (where a run stops early, none is named)
                self._record(journal, run, done)
                head = done[-1][1]
            journal.phase = "provenance"
            journal.save(self.path)
        self.reporter.step("writing provenance")
        self._begin(journal, [provenance.PROVENANCE_PATH], head)
        record = provenance.build(series, planned, journal.upstream_info, journal.entries)
        self._write(provenance.PROVENANCE_PATH, provenance.dumps(record).encode(), "the provenance record",
                    f"cannot write {provenance.PROVENANCE_PATH} in {self.tree}")
        fault_point("at", "provenance")
        self._commit_file(dated, journal.head_before, provenance.PROVENANCE_PATH,
                          f"c128patch: provenance (series {series.name} {series.version} on {journal.rev})\n\n"
                          f"{ENTRY_TRAILER}: provenance\n")
        fault_point("after", "provenance")
        # before the proof: a signal in it leaves a tree whose status finds its layers
        remember_layers(git, series, self.path.parent)
        self.path.unlink()
        result = self._result(journal)
        self.reporter.step("proving the tree against a fresh replay of the series")
        try:  # the journal is gone: a signal here has nothing to resume or undo by it
            fault_point("at", "proof")
            fresh = fresh_replay(series, git, journal.rev, journal.upstream_commit,  # its trees: the branch's, checked
                                 known=entry_trees(git, journal.upstream_commit, result.head), planned=planned)
            proof = prove(series, git, journal.rev, journal.upstream_commit, result.head, accept=lambda edit: False,
                          fresh=fresh)
        except KeyboardInterrupt as stop:
            raise Interrupted.by(stop, f"the series is applied on {journal.branch} in {self.tree} but its proof was "
                                       "cut short (no outcome); prove it with "
                                       f"`{shell_join(['c128patch', 'status', '--tree', str(self.tree)])}`, or undo it "
                                       f"with `{self._undo_finished(journal)}`") from None
        result.equivalence = proof.to_json()
        if not proof.ok:
            shown = "\n".join(f"  {h.path} {h.header}" for d in proof.unattributed for h in d.hunks[:20])
            raise DifferenceError(f"applied to {journal.rev}, but the tree is not what the series says: "
                                  f"{proof.summary()}",
                                  hint=f"{shown}\n  {journal.branch} is kept as it is for inspection\n"
                                       + self._keep(journal, series)
                                       + f"  undo: {self._undo_finished(journal)}", report=result.to_json())
        if proof.identical:  # recorded for `status` (identical whatever edits a caller accepts)
            key = proofs.proof_key(git, series, journal.rev, journal.upstream_commit, result.head)
            proofs.record(self.path.parent, key, result.equivalence, fresh[2])  # its trees: for a rebase
        return result

    def _dated(self, journal: ApplyJournal) -> Git:
        """Git committing at the upstream commit's date (``show -s`` costs 0.5 s on a release commit)."""
        date = self.git.out("log", "-1", "--format=%cI", journal.upstream_commit)
        return self.git.with_env(GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)

    def _begin(self, journal: ApplyJournal, paths: list[str], head: str | None = None) -> None:
        """A step starts: marked before it touches anything, so what it leaves half done is known to be ours.
        ``head``: HEAD as the step before, in this process, left it (None: read it)."""
        head = self.git.head() or "" if head is None else head
        journal.head_before, journal.in_step, journal.step_paths = head, True, paths
        journal.save(self.path)

    def _keep(self, journal: ApplyJournal, series: Series) -> str:
        """How a hand resolution becomes the series' file for the rev (a variant): refresh, which writes a copy of the
        tool's own series, never the tool's checkout or installed package (its entries resolved by hand)."""
        resolved = [e["name"] for e in journal.entries if e.get("applied") == "resolved"]
        if not resolved:
            return ""
        tools = series.ours.root == default_series_root().resolve()  # the tool's checkout or installed package
        own = tools and any(SEP not in n for n in resolved)  # a copy of it takes the variant: refresh never writes it
        copy = "~/c128patch-series"
        where = [] if tools and not own else ["--series", copy if own else str(series.ours.root)]
        keep = shell_join(["c128patch", "refresh", "--accept-differences", "--variant", "--tree", str(self.tree),
                           *where, *layer_args(series)])
        if own:  # (the copy's ``~`` unquoted: the shell expands it)
            keep = f"cp -R {shell_quote(str(series.ours.root))} {copy} && " + keep.replace(f"'{copy}'", copy)
        return f"  keep your resolution of {', '.join(resolved)} as its file for {journal.rev}:\n    {keep}\n"

    def _undo_finished(self, journal: ApplyJournal) -> str:
        """The commands that take a finished apply away (its journal is gone)."""
        if journal.fresh_clone:
            return shell_join(["rm", "-rf", str(self.tree)])
        g = ["git", "-C", str(self.tree)]
        back = [journal.orig_branch] if journal.orig_branch else ["--detach", journal.orig_head or "HEAD"]
        return f"{shell_join([*g, 'checkout', *back])} && {shell_join([*g, 'branch', '-D', journal.branch])}"

    def _run_at(self, planned: list[Planned], start: int) -> list[Planned]:
        """The entries one step applies from ``planned[start]`` (module docstring)."""
        run: list[Planned] = []
        for item in planned[start:]:
            joins = item.patch is not None and bool(item.patch.trailers.get(ENTRY_TRAILER))
            if run and (not joins or fault_named("before", item.entry.name)):
                break
            run.append(item)
            if not joins or fault_named("after", item.entry.name):
                break
        return run

    def _apply_run(self, journal: ApplyJournal, run: list[Planned], planned: list[Planned],
                   dated: Git) -> list[tuple[str, str]]:
        """(how it applied, its commit) of each entry of ``run`` applied, in order: all of them, or those before
        the one ``git am`` stopped at, or, where it stopped at the first, that one applied alone."""
        git = self.git
        if len(run) > 1:
            self._check_worktree_paths(run)
            proc = dated.run("am", "--3way", "--committer-date-is-author-date", *(str(i.path) for i in run),
                             check=False)
            made = branch_commits(git, journal.head_before)
            if [c.entry for c in made] == [i.entry.name for i in run][:len(made)] and \
                    (proc.returncode == 0) == (len(made) == len(run)):  # one commit per file, as one by one
                ways = ["3way" if "\nFalling back to patching base and 3-way" in said else "clean"
                        for said in re.split(r"^Applying: ", proc.stdout, flags=re.M)[1:]]  # what it says per patch
                if proc.returncode != 0:
                    git.run("am", "--quit")  # the commits made stay; the stopped patch's merge goes
                    self._reset("HEAD", journal.step_paths)
                if made:
                    return [(ways[i], c.sha) for i, c in enumerate(made)]
            else:  # not one commit per file (a file of several messages): its first entry alone, as before
                git.run("am", "--abort", check=False)
                self._reset(journal.head_before, journal.step_paths)
        return [self._apply_entry(journal, run[0], planned, dated)]

    def _apply_entry(self, journal: ApplyJournal, item: Planned, planned: list[Planned],
                     dated: Git) -> tuple[str, str]:
        """(how ``item`` applied, its commit)."""
        git, series = self.git, self.series
        assert series is not None
        if item.patch is None:
            self._write(item.entry.target, item.path.read_bytes(), f"overlay '{item.entry.name}'",
                        f"cannot apply entry '{item.entry.name}' in {self.tree}: cannot write {item.entry.target}")
            return "clean", self._commit_file(dated, journal.head_before, item.entry.target,
                                              overlay_message(item.entry, series))
        self._check_worktree_paths([item])
        proc = dated.run("am", "--3way", "--committer-date-is-author-date", str(item.path), check=False)
        if proc.returncode != 0 and not have_blobs(git, preimages(item.patch)) and \
                write_preimages(series, git, item):  # its 3-way merge's base, as check has it (ops.replay)
            git.run("am", "--abort", check=False)
            proc = dated.run("am", "--3way", "--committer-date-is-author-date", str(item.path), check=False)
        output = proc.stdout + proc.stderr
        loose = False
        if proc.returncode != 0:  # as ``check`` replays it: again, ignoring whitespace changes upstream made
            git.run("am", "--abort", check=False)
            problem = environment_problem(output)
            if problem:  # the machine, not the series: no conflict to resolve
                raise C128Error(f"cannot apply entry '{item.entry.name}' in {self.tree}: "
                                f"{problem.removeprefix('error: ')}{RESUME_NOTE}")
            retry = dated.run("am", "--ignore-whitespace", "--committer-date-is-author-date", str(item.path),
                              check=False)
            if retry.returncode != 0:
                git.run("am", "--abort", check=False)
                raise self._conflict(journal, item, planned, output)
            loose = True
        if not item.patch.trailers.get(ENTRY_TRAILER):
            dated.run("commit", "--quiet", "--amend", "--no-edit", "--no-verify",
                      "--trailer", f"{ENTRY_TRAILER}: {item.entry.name}")
        commit = self._claims(journal, item)
        return ("whitespace" if loose else "3way" if "Falling back to patching base and 3-way" in output else "clean",
                commit)

    def _commit_file(self, dated: Git, head: str, rel: str, message: str) -> str:
        """``rel``, written in the tree, committed on ``head`` (HEAD) with ``message``: the commit ``git add --force``
        then ``git commit -m`` make (whatever an ignore file says; the message cleaned as they clean it:
        ``git.stripspace``), by plumbing that reads that one file: add and commit each refreshed the whole index (~5,800
        files, racily clean just after the checkout: ~50 ms each, twice for each overlay and the provenance). The
        index and work tree are left as ``git commit`` leaves them (clean); where the operator's git converts line ends,
        the file is written again as their checkout writes it (left LF, their `git commit -a` of an edit to it died
        under core.safecrlf: "LF would be replaced by CRLF"). Returns the commit."""
        self.git.run("update-index", "--add", "--", rel)  # (update-index reads no ignore file)
        commit = dated.out("commit-tree", self.git.out("write-tree"), "-p", head, input=stripspace(message))
        self.git.run("update-ref", "-m", f"commit: {message.partition(chr(10))[0]}", "HEAD", commit, head)
        if self.git.converts_eol():  # (checkout-index skips a file whose stat matches its index entry)
            confine(self.tree, rel, "a file c128patch wrote").unlink()
            self.git.run("checkout-index", "-u", "--", rel)
        return commit

    def _claims(self, journal: ApplyJournal, item: Planned, resolved: bool = False) -> str:
        """Each commit the step made (one per message of the file) carries ``item``'s entry trailer only, as git reads
        it (whatever the patch's message said, in any spelling or encoding); else refused, nothing of it kept (a hand
        resolution: kept). Returns the last one (HEAD)."""
        made = branch_commits(self.git, journal.head_before)
        if not made or any(c.entry != item.entry.name for c in made):
            if not resolved:
                self._reset(journal.head_before, journal.step_paths)
            raise C128Error(f"entry '{item.entry.name}': its patch made commit(s) carrying {ENTRY_TRAILER} "
                            f"{', '.join(repr(c.entry) for c in made)}, not '{item.entry.name}' only; "
                            + ("fix its message, then resume" if resolved else "nothing of it was kept"))
        return made[-1].sha

    def _check_worktree_paths(self, planned: list[Planned]) -> None:
        """Refuse a path through a symlink in the tree as it is now, or under the operator's ``core.hooksPath``."""
        if self._hooks is None:
            hooks, tree = self.git.operator_hooks_dir(), os.path.realpath(self.tree)
            inside = hooks is not None and os.path.commonpath([tree, os.path.realpath(hooks)]) == tree
            self._hooks = os.path.relpath(os.path.realpath(hooks), tree) if hooks is not None and inside else ""
        for item in planned:
            for path in item.patch.paths if item.patch else [item.entry.target]:
                check_under(path, self._hooks, f"entry '{item.entry.name}'")
                link = symlink_on_path(self.tree, self.tree / path)
                if link is not None:
                    raise C128Error(f"unsafe path in entry '{item.entry.name}': {path} goes through the symlink "
                                    f"{link.relative_to(self.tree)} in {self.tree}; nothing was written through it")

    def _record(self, journal: ApplyJournal, items: list[Planned], done: list[tuple[str, str]]) -> None:
        """The entries of ``items`` ``done`` (how each applied, its commit) in the journal, the step ended."""
        for item, (applied, commit) in zip(items, done):
            journal.entries.append(_row(item, applied=applied, status="applied", commit=commit))
        journal.head_before, journal.in_step, journal.paused = done[-1][1], False, ""
        journal.save(self.path)

    def _write(self, rel: str, data: bytes, what: str, failure: str) -> None:
        dest = confine(self.tree, rel, what)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        except OSError as exc:  # the machine, not the series: no conflict to resolve
            raise C128Error(f"{failure}: {exc.strerror}{RESUME_NOTE}") from None

    def _conflict(self, journal: ApplyJournal, item: Planned, planned: list[Planned], output: str) -> ConflictError:
        path, hunk = _failure_detail(self.git, item, output)
        i, q = journal.done, shell_quote(str(item.path))
        journal.in_step, journal.paused = False, "conflict"
        journal.save(self.path)
        last = planned[i - 1].entry.name if i else f"upstream {journal.rev}"
        result = self._result(journal)
        result.entries.append(_row(item, status="conflict", failed_file=path, failed_hunk=hunk))
        result.entries += [{"name": p.entry.name, "kind": p.entry.kind,
                            "status": "not-reached"} for p in planned[i + 1:]]
        resume, undo = apply_commands(self.tree)
        back = journal.orig_branch or (journal.orig_head or "")[:12]  # none in a clone the apply made
        g = git_command(self.tree)
        return ConflictError(
            f"entry '{item.entry.name}' ({item.label}) does not apply to {journal.rev}: {path} {hunk}"
            + overlap_note(self.series, planned[:i], item, [path, *item.touched], journal.rev,
                           lambda rel: (self.git.blob("HEAD", rel) or b"").decode(errors="replace")),
            hint=(
                f"{journal.branch} is left at the last good entry ({last})"
                + (f"; your branch {back} is untouched.\n" if back else ".\n") +
                f"  inspect: {g} am -3 {q}   (then {g} status; {g} am --abort)\n"
                f"  resolve: {g} am -3 {q}, edit the files, {g} add them, {g} am --continue; then "
                f"{resume}\n"
                f"           (a hand resolution is not the series: the apply ends, reported unproven)\n"
                f"  undo:    {undo}"
                + (f"\n  recovery ref: {journal.recovery_ref}" if journal.recovery_ref else "")
            ),
            report=result.to_json(),
        )

    def _reset(self, head: str, ours: list[str]) -> None:
        """Back to ``head``, the files the step wrote (``ours``) removed; no paths would mean every untracked file."""
        self.git.run("reset", "--quiet", "--hard", head)
        if ours:
            self.git.run("clean", "-fq", "--", *ours)

    def _undo_step(self, journal: ApplyJournal) -> None:
        """Put the tree back where the interrupted step started (a checkout stays marked: redone with --force)."""
        git = self.git
        git.run("am", "--abort", check=False)
        if journal.phase == "checkout":
            return
        ours = journal.step_paths
        theirs = [p for p in changed_paths(git) if p not in ours]
        if theirs:
            stash = shell_join(["git", "-C", str(self.tree), "stash", "-u"])
            raise C128Error(f"cannot continue: {self.tree} has changes the interrupted step did not make "
                            f"({', '.join(theirs[:3])}); stash them ({stash}) and retry")
        self._reset(journal.head_before, ours)
        journal.in_step = False
        journal.save(self.path)

    def _take_resolution(self, journal: ApplyJournal, planned: list[Planned]) -> None:
        """After a stop: HEAD is where the journal left it, or one commit on it (the user's resolution)."""
        git, tree = self.git, self.tree
        g = git_command(tree)
        resume, undo = apply_commands(tree)
        if git_paths(git, ["rebase-apply"])[0].exists():
            raise C128Error(f"cannot continue: a git am is in progress in {tree}; finish it ({g} am --continue) "
                            f"or drop it ({g} am --abort), then {resume}")
        head = git.head() or ""
        if head != journal.head_before:
            parents = git.out("rev-list", "--parents", "-n", "1", head).split()[1:]
            if journal.paused != "conflict" or parents != [journal.head_before] or journal.done >= journal.total:
                raise C128Error(f"cannot continue: HEAD of {tree} moved since the apply stopped (expected "
                                f"{journal.head_before[:12]} or one commit on it); undo with {undo}")
            refuse_conflict_markers(git, journal.head_before, head, "continue")
            item = planned[journal.done]
            if item.patch is None:
                raise C128Error(f"cannot continue: entry '{item.entry.name}' is an overlay; it is not resolved by hand")
            if f"{ENTRY_TRAILER}: {item.entry.name}" not in git.out("log", "-1", "--format=%B", head):
                self._dated(journal).run("commit", "--quiet", "--amend", "--no-edit", "--no-verify", "--trailer",
                                         f"{ENTRY_TRAILER}: {item.entry.name}")
            self._claims(journal, item, resolved=True)
            self._record(journal, [item], [("resolved", git.head() or "")])
        ensure_clean(git, "continue the apply")

    def _result(self, journal: ApplyJournal) -> ApplyResult:
        skipped = [{"name": e.name, "kind": e.kind, "status": "skipped",
                    "detail": f"merged upstream in {e.merged_in[:12]}"}
                   for e in merged_entries(self.series, self.git, journal.upstream_commit)] if self.series else []
        return ApplyResult(str(self.tree), journal.rev, journal.upstream_commit, journal.branch, self.git.head() or "",
                           journal.recovery_ref, journal.orig_branch, journal.orig_head, journal.orig_unreachable,
                           skipped + [dict(r) for r in journal.entries])
