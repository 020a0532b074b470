"""``status``: the series applied to a tree, its upstream, the drift since, whether HEAD equals a fresh apply, an
apply or rebase running or stopped (with resume/undo) and the recovery refs, read fresh each time; but the proof is
read from its record (``ops.proofs``) while its key holds, else (or ``prove_again``) made again and recorded."""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict
from pathlib import Path

from c128patch.git import Git
from c128patch.ops import proofs
from c128patch.ops.treestate import RECOVERY_PREFIX, apply_commands, git_paths, rebase_command, running, worktree_state
from c128patch.series.layers import describe
from c128patch.series.manifest import MAX_SERIES_FILE, Series
from c128patch.series.provenance import PROVENANCE_PATH, applied_digest, read_provenance, starts_stack
from c128patch.textsafe import shell_join


def rebase_status(git: Git, path: Path) -> dict:
    """Where the c128patch rebase whose journal is ``path`` stands."""
    from c128patch.ops.rebase_journal import Journal  # only when one is in progress: status stays light

    j = Journal.load(path, git)
    return {"onto": j.onto_rev, "from": j.old_rev, "done": j.pos, "total": len(j.steps),
            "current_entry": j.steps[j.pos].name if j.pos < len(j.steps) else None, "paused": j.paused,
            "branch": j.orig_branch, "resume": rebase_command(git.cwd, "continue"),
            "skip": rebase_command(git.cwd, "skip") if j.pos < len(j.steps) else None,  # (finishing: none to skip)
            "undo": rebase_command(git.cwd, "abort")}


def apply_status(git: Git, path: Path) -> dict:
    """Where the c128patch apply (stopped, or running) whose journal is ``path`` stands."""
    from c128patch.ops.applier import ApplyJournal

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
                       + (f"; next: {nxt}" if nxt and j.phase == "entries" else "")
                       + ("; resume prints how to resolve it (git am -3, edit, add, am --continue) until it is"
                          if j.paused == "conflict" else ""),
            "resume": resume, "undo": undo}


def _drift(git: Git, prov_commit: str, entries: list[dict]) -> list[dict]:
    """Per entry, its files changed since the provenance commit (an overlay no later entry edits also by its bytes)."""
    paths = sorted({p for e in entries for p in e.get("files", [])})
    changed: dict[str, str] = {}
    if prov_commit and paths:
        for line in git.out("diff", "--name-status", "--no-renames", prov_commit, "--", *paths).splitlines():
            status, name = line.split("\t", 1)
            changed[name] = {"M": "modified", "D": "deleted", "A": "added"}.get(status[0], status)
    drift = []
    last = [e for i, e in enumerate(entries) if e.get("kind") == "overlay"
            and not any(e.get("target") in x.get("files", []) for x in entries[i + 1:])]
    # (an overlay a later entry edits, a layer's, holds its bytes only before that entry: as a fresh apply)
    edited = _edited_overlays(git, prov_commit, [e for e in last if (git.cwd / e["target"]).is_file()])
    for e in entries:
        files = {p: changed[p] for p in e.get("files", []) if p in changed}
        if e["name"] in edited:
            files.setdefault(e["target"], "modified")
        if files:
            drift.append({"entry": e["name"], "files": files})
    return drift


def _edited_overlays(git: Git, prov_commit: str, overlays: list[dict]) -> set[str]:
    """The overlays (of ``overlays``, each a file in the tree) whose bytes are not what apply wrote; where the
    operator's git converts line ends, as their git reads the file, against the provenance commit's blob (HEAD where
    ``prov_commit`` is "": HEAD is it): apply leaves such a file as their checkout writes it (CRLF), "modified" by
    its bytes."""
    if overlays and git.converts_eol():
        paths = [e["target"] for e in overlays]
        now = git.out("hash-object", "--", *paths).split()
        applied = dict(line.split("\t", 1)[::-1] for line in git.lines("ls-tree", prov_commit or "HEAD", "--", *paths))
        return {e["name"] for e, blob in zip(overlays, now) if applied.get(e["target"], "").split()[-1:] != [blob]}
    return {e["name"] for e in overlays if (git.cwd / e["target"]).stat().st_size > MAX_SERIES_FILE  # (not read)
            or hashlib.sha256((git.cwd / e["target"]).read_bytes()).hexdigest() != e.get("sha256")}


def _proof(git: Git, series: Series, state: Path, key: dict[str, str], prove_again: bool,
           without: list[str], objects: Path) -> dict:
    """``equivalence`` (HEAD against ``series`` on the upstream ``key`` names, less the entries ``without`` that the
    provenance says a rebase left out) and ``proof``: "recorded", or "computed" (and recorded); nothing when the
    upstream commit is not in the repository. A repository whose ``objects`` cannot be written (a read-only mount) is
    proven with the replay's objects in a scratch store (git's hash-object -w failed there: status exited 2)."""
    proof = None if prove_again else proofs.recorded(state, key)
    if proof is None and key["upstream"] and git.rev_parse(key["upstream"]):
        from c128patch import procs
        from c128patch.ops.equivalence import prove  # the replay: only on a miss

        with procs.scratch("c128objects-") as store:
            if not os.access(objects, os.W_OK):
                git = git.with_env(GIT_OBJECT_DIRECTORY=store, GIT_ALTERNATE_OBJECT_DIRECTORIES=str(objects.resolve()))
            proof = prove(series, git, key["rev"], key["upstream"], key["head"], without=without).to_json()
        proofs.record(state, key, proof)
        return {"equivalence": proof, "proof": "computed"}
    return {"equivalence": proof, "proof": "recorded"} if proof else {}


def tree_status(git: Git, series: Series | None = None, prove_again: bool = False) -> dict:
    """What ``status`` reports of the tree in ``git`` (with ``series``: whether it equals a fresh apply)."""
    tree = git.cwd
    lock, state, objects, common = git_paths(git, ["index.lock", "c128patch", "objects"], "--git-common-dir")
    rebase = rebase_status(git, state / "rebase.json") if (state / "rebase.json").is_file() else None
    apply = apply_status(git, state / "apply.json") if (state / "apply.json").is_file() else None
    holder = running(common)
    headers, uncommitted = worktree_state(git)
    branch = headers.get("branch.head", "(detached)")
    # HEAD before an apply or rebase, newest first; split at "\n" only (a subject's U+2028, NEL or CR cut a record)
    refs = git.lines("for-each-ref", "--sort=-refname", "--format=%(refname)%00%(objectname)%00%(contents:subject)",
                     RECOVERY_PREFIX)
    out = {
        "index_lock": {"path": str(lock), "c128patch_running": holder is not None,  # left by a killed run
                       "clear": shell_join(["rm", "-f", str(lock)])} if lock.exists() else None,
        "tree": str(tree), "branch": None if branch == "(detached)" else branch,
        "running": asdict(holder) if holder else None,
        "apply_in_progress": apply is not None, "apply": apply, "rebase_in_progress": rebase is not None,
        "rebase": rebase, "recovery_refs": [dict(zip(("ref", "commit", "subject"), ref.split("\0"))) for ref in refs],
        "uncommitted": uncommitted,  # not on the branch: the proof covers HEAD
        "equals_series": False, "entries": [], "drift": [],
    }
    if (rebase or apply or holder) and not (tree / PROVENANCE_PATH).is_file():
        return out
    record = read_provenance(tree)
    prov_commit, _, prov_tree = git.out("log", "-1", "--format=%H %T", "--", PROVENANCE_PATH).partition(" ")
    since = prov_commit if prov_commit != headers["branch.oid"] or uncommitted else ""  # "": no drift to look for
    entries = record.get("entries", [])
    out.update({key: record.get(key, {}) for key in ("series", "upstream", "tool")})
    out.update(layers=record.get("layers", []), provenance_commit=prov_commit, drift=_drift(git, since, entries),
               entries=[{"name": e["name"], "kind": e["kind"], "applied": e.get("applied", "")} for e in entries],
               commits_since=git.count(f"{since}..HEAD") if since else 0)
    if series is not None:
        commit = str(out["upstream"].get("commit") or "")
        rev = str(out["upstream"].get("rev") or "") or commit[:12]
        key = proofs.proof_key(git, series, rev, commit, headers["branch.oid"], "" if since else prov_tree)
        out["series_current"] = {"version": series.version, "digest": key["digest"], "stack": describe(series),
                                 "up_to_date": applied_digest(record) == key["digest"],
                                 # the layers in effect do not start with the tree's (a c128patch.toml naming
                                 # others): a rebase with them would make the tree's layer entries the user's commits
                                 "layers_differ": not starts_stack(record, series)}
        left_out = [str(d.get("name")) for d in record.get("dropped", [])  # as refresh proves it (a rebase's skip)
                    if isinstance(d, dict) and d.get("status") in ("dropped-as-merged", "skipped")]
        out.update(_proof(git, series, state, key, prove_again, left_out, objects))
        identical = out.get("equivalence", {}).get("identical") is True
        out["equals_series"] = identical and not out["uncommitted"] and not out["drift"]
    return out


def patched_branches(git: Git) -> list[str]:
    """The branches of ``git``'s repository whose tip holds a provenance record (the newest first), in two git calls.
    A branch name is data: split on newlines only (git allows U+00A0 or U+2028 in one)."""
    if git.run("rev-parse", "--git-dir", check=False).returncode != 0:
        return []
    refs = git.out("for-each-ref", "--sort=-committerdate", "--format=%(refname)", "refs/heads/").split("\n")
    refs = [r for r in refs if r]
    found = git.run("cat-file", "--batch-check=%(objecttype)", input="".join(f"{r}:{PROVENANCE_PATH}\n" for r in refs),
                    check=False).stdout.split("\n")
    return [r.removeprefix("refs/heads/") for r, kind in zip(refs, found) if kind == "blob"]
