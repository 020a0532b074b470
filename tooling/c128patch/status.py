"""``status``: which series is applied to a tree, on which upstream, and what drifted since."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .errors import C128Error
from .git import Git
from .manifest import Series
from .provenance import PROVENANCE_PATH
from .treestate import rebase_journal


def read_provenance(tree: Path) -> dict:
    path = tree / PROVENANCE_PATH
    if not path.is_file():
        raise C128Error(f"no c128patch series is applied in {tree} (no {PROVENANCE_PATH})")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise C128Error(f"{path}: provenance file is not valid JSON ({exc.msg})") from exc


def tree_status(git: Git, series: Series | None = None) -> dict:
    tree = git.worktree
    assert tree is not None
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
        "rebase_in_progress": rebase_journal(git).is_file(),
    }
    if series is not None:
        applied = record.get("series", {}).get("digest")
        out["series_current"] = {"version": series.version, "digest": series.digest(), "up_to_date": applied == series.digest()}
    return out
