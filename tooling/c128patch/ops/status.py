"""``status``: the series applied to a tree, its upstream, the drift since, whether HEAD equals a fresh apply
(``ops.equivalence``), an apply or rebase running or stopped (with resume/undo) and the recovery refs."""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import asdict

from c128patch.git import Git
from c128patch.ops.applier import RECOVERY_PREFIX, ApplyJournal
from c128patch.ops.equivalence import prove
from c128patch.ops.rebase import Journal
from c128patch.ops.treestate import (
    apply_commands,
    apply_journal,
    changed_paths,
    git_path,
    rebase_command,
    rebase_journal,
    running,
)
from c128patch.series import provenance
from c128patch.series.manifest import Series
from c128patch.series.provenance import PROVENANCE_PATH, read_provenance
from c128patch.upstream.source import Target


def rebase_status(git: Git) -> dict | None:
    """Where a c128patch rebase in progress stands (None when there is none)."""
    path = rebase_journal(git)
    if not path.is_file():
        return None
    j = Journal.load(path, git)
    return {"onto": j.onto_rev, "from": j.old_rev, "done": j.pos, "total": len(j.steps),
            "current_entry": j.steps[j.pos].name if j.pos < len(j.steps) else None, "paused": j.paused,
            "branch": j.orig_branch, "resume": rebase_command(git.cwd, "continue"),
            "skip": rebase_command(git.cwd, "skip"), "undo": rebase_command(git.cwd, "abort")}


def apply_status(git: Git) -> dict | None:
    """Where a c128patch apply that stopped (or is running) stands (None when there is none)."""
    path = apply_journal(git)
    if not path.is_file():
        return None
    j = ApplyJournal.load(git, path)
    resume, undo = apply_commands(git.cwd)
    nxt = j.names[j.done] if j.done < j.total else None
    how = "stopped at a conflict" if j.paused == "conflict" else "was interrupted"
    where = {"clone": " (cloning)", "checkout": " (checking out)",
             "provenance": " (writing provenance)"}.get(j.phase, "")
    return {"rev": j.rev, "branch": j.branch, "done": j.done, "total": j.total, "phase": j.phase, "paused": j.paused,
            "next_entry": nxt, "fresh_clone": j.fresh_clone, "orig_branch": j.orig_branch, "orig_head": j.orig_head,
            "recovery_ref": j.recovery_ref,
            "summary": f"an apply {how} after entry {j.done} of {j.total}{where}"
                       + (f"; next: {nxt}" if nxt and j.phase == "entries" else ""),
            "resume": resume, "undo": undo}


def recovery_refs(git: Git) -> list[dict]:
    """Every recovery ref (HEAD before an apply or rebase), newest first."""
    fmt = "%(refname)%00%(objectname)%00%(contents:subject)"
    return [dict(zip(("ref", "commit", "subject"), line.split("\0")))
            for line in git.out("for-each-ref", "--sort=-refname", f"--format={fmt}", RECOVERY_PREFIX).splitlines()]


def _drift(git: Git, prov_commit: str, entries: list[dict]) -> list[dict]:
    """Per entry, its files changed since the provenance commit (an overlay also by its bytes)."""
    paths = sorted({p for e in entries for p in e.get("files", [])})
    changed: dict[str, str] = {}
    if prov_commit and paths:
        for line in git.out("diff", "--name-status", "--no-renames", prov_commit, "--", *paths).splitlines():
            status, name = line.split("\t", 1)
            changed[name] = {"M": "modified", "D": "deleted", "A": "added"}.get(status[0], status)
    drift = []
    for e in entries:
        files = {p: changed[p] for p in e.get("files", []) if p in changed}
        if e.get("kind") == "overlay":
            target = git.cwd / e["target"]
            if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() != e.get("sha256"):
                files.setdefault(e["target"], "modified")
        if files:
            drift.append({"entry": e["name"], "files": files})
    return drift


def tree_status(git: Git, series: Series | None = None) -> dict:
    """What ``status`` reports of the tree in ``git`` (with ``series``: whether it equals a fresh apply)."""
    tree, lock = git.cwd, git_path(git, "index.lock")
    rebase, apply, holder = rebase_status(git), apply_status(git), running(git)
    common = {
        "index_lock": {"path": str(lock), "c128patch_running": holder is not None,  # left by a killed run
                       "clear": shlex.join(["rm", "-f", str(lock)])} if lock.exists() else None,
        "tree": str(tree),
        "branch": git.current_branch(),
        "running": asdict(holder) if holder else None,
        "apply_in_progress": apply is not None,
        "apply": apply,
        "rebase_in_progress": rebase is not None,
        "rebase": rebase,
        "recovery_refs": recovery_refs(git),
        "uncommitted": changed_paths(git),  # not on the branch: the proof below covers HEAD
        "equals_series": False,
    }
    if (rebase is not None or apply is not None or holder is not None) and not (tree / PROVENANCE_PATH).is_file():
        return {**common, "entries": [], "drift": []}
    record = read_provenance(tree)
    prov_commit = git.out("log", "-1", "--format=%H", "--", PROVENANCE_PATH)
    entries = record.get("entries", [])
    drift = _drift(git, prov_commit, entries)
    out = {
        **common,
        **{key: record.get(key, {}) for key in ("series", "upstream", "tool")},
        "layers": record.get("layers", []),
        "entries": [{"name": e["name"], "kind": e["kind"], "applied": e.get("applied", "")} for e in entries],
        "provenance_commit": prov_commit,
        "commits_since": git.count(f"{prov_commit}..HEAD") if prov_commit else 0,
        "drift": drift,
    }
    if series is not None:
        out["series_current"] = {"version": series.version, "digest": series.digest(),
                                 "up_to_date": provenance.applied_digest(record) == series.digest()}
        target = Target.from_json(record.get("upstream", {}))  # the upstream the record says it was applied to
        if target.commit and git.rev_parse(target.commit):
            proof = prove(series, git, target.rev or target.commit[:12], target.commit)
            out["equivalence"] = proof.to_json()
            out["equals_series"] = proof.identical and not out["uncommitted"] and not drift
    return out
