"""``status``: which series is applied to a tree, on which upstream, what drifted since, and whether
the tree equals a fresh apply of the series (``ops.equivalence``; every difference attributed to an
edit on the branch, or listed as unattributed)."""

from __future__ import annotations

import hashlib
import json

from c128patch.git import Git
from c128patch.ops.equivalence import prove
from c128patch.ops.treestate import rebase_journal
from c128patch.series.manifest import Series
from c128patch.series.provenance import PROVENANCE_PATH, read_provenance


def rebase_status(git: Git) -> dict | None:
    """Where a c128patch rebase in progress stands (None when there is none)."""
    path = rebase_journal(git)
    if not path.is_file():
        return None
    j = json.loads(path.read_text())
    steps = j["steps"]
    current = steps[j["pos"]]["name"] if j["pos"] < len(steps) else None
    return {"onto": j["onto_rev"], "from": j["old_rev"], "done": j["pos"], "total": len(steps),
            "current_entry": current, "paused": j.get("paused", ""), "branch": j["orig_branch"],
            "next": "c128patch rebase --continue | --skip | --abort"}


def tree_status(git: Git, series: Series | None = None) -> dict:
    tree = git.worktree
    assert tree is not None
    rebase = rebase_status(git)
    if rebase is not None and not (tree / PROVENANCE_PATH).is_file():
        return {"tree": str(tree), "branch": git.current_branch(), "rebase_in_progress": True, "rebase": rebase,
                "entries": [], "drift": []}
    record = read_provenance(tree)
    prov_commit = git.out("log", "-1", "--format=%H", "--", PROVENANCE_PATH)
    entries = record.get("entries", [])
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
            target = tree / e["target"]
            if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() != e.get("sha256"):
                files.setdefault(e["target"], "modified")
        if files:
            drift.append({"entry": e["name"], "files": files})
    out = {
        "tree": str(tree),
        "branch": git.current_branch(),
        "series": record.get("series", {}),
        "upstream": record.get("upstream", {}),
        "tool": record.get("tool", {}),
        "entries": [{"name": e["name"], "kind": e["kind"], "applied": e.get("applied", "")} for e in entries],
        "provenance_commit": prov_commit,
        "commits_since": git.count(f"{prov_commit}..HEAD") if prov_commit else 0,
        "drift": drift,
        "rebase_in_progress": rebase is not None,
        "rebase": rebase,
    }
    if series is not None:
        applied = record.get("series", {}).get("digest")
        out["series_current"] = {"version": series.version, "digest": series.digest(), "up_to_date": applied == series.digest()}
        upstream = record.get("upstream", {})
        if upstream.get("commit") and git.rev_parse(upstream["commit"]):
            proof = prove(series, git, upstream.get("rev") or upstream["commit"][:12], upstream["commit"])
            out["equivalence"] = proof.to_json()
            out["equals_series"] = proof.identical
    return out
