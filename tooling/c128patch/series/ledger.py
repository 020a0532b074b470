"""The resolution ledger: conflict resolutions made during rebases, kept in the series repo.

A conflict is keyed by its entry and by a hash of its conflict blocks (marker labels normalized, so
the key does not depend on commit ids). Its resolution is stored as a small unified diff from the
conflicted file to the resolved one: only the conflict regions and their context lines, never a
whole upstream file. On a later rebase, a conflict with the same key is resolved by applying that
diff with ``git apply`` (strict: it only fits the very same conflicted text), and staged.
"""

from __future__ import annotations

import difflib
import hashlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import tomli_w

from c128patch.git import Git
from c128patch.series.manifest import Series

_MARKER = re.compile(r"^(<{7}|={7}|>{7}|\|{7})(?: .*)?$", re.M)


def normalize_markers(text: str) -> str:
    """Conflict markers without their labels (which name commits)."""
    return _MARKER.sub(lambda m: m.group(1), text)


def conflict_key(path: str, text: str) -> str:
    """A hash of the conflict blocks of ``text`` (markers normalized), and the path."""
    blocks, inside, current = [], False, []
    for line in normalize_markers(text).splitlines():
        if line == "<" * 7:
            inside, current = True, [line]
        elif inside:
            current.append(line)
            if line == ">" * 7:
                blocks.append("\n".join(current))
                inside = False
    h = hashlib.sha256(path.encode() + b"\0" + "\0".join(blocks).encode())
    return h.hexdigest()[:20]


@dataclass
class Conflict:
    path: str
    key: str
    text: str  # the conflicted file, markers normalized


class Ledger:
    def __init__(self, series: Series) -> None:
        self.root = series.patches_dir / "resolutions"
        self.index = self.root / "ledger.toml"

    def rows(self) -> list[dict]:
        if not self.index.is_file():
            return []
        return list(tomllib.loads(self.index.read_text()).get("resolutions", []))

    def _diff_path(self, entry: str, key: str) -> Path:
        return self.root / entry / f"{key}.diff"

    def conflicts(self, git: Git, paths: list[str]) -> list[Conflict]:
        """The unmerged files as they stand, markers normalized in the work tree too."""
        out = []
        for path in paths:
            file = git.worktree / path  # type: ignore[operator]
            text = normalize_markers(file.read_text())
            file.write_text(text)
            out.append(Conflict(path, conflict_key(path, text), text))
        return out

    def replay(self, git: Git, entry: str, conflicts: list[Conflict]) -> list[str]:
        """Resolve every conflict this entry has a recorded resolution for; returns their refs."""
        refs = []
        for c in conflicts:
            diff = self._diff_path(entry, c.key)
            if diff.is_file() and git.ok("apply", str(diff)):
                git.run("add", "--", c.path)
                refs.append(f"{entry}:{c.key}")
        return refs

    def record(self, git: Git, entry: str, from_rev: str, onto_rev: str, conflicts: list[Conflict]) -> list[str]:
        """Keep how the user resolved ``conflicts`` (their staged content), as diffs."""
        rows = [r for r in self.rows() if not (r["entry"] == entry and r["key"] in {c.key for c in conflicts})]
        refs = []
        for c in conflicts:
            resolved = git.run("show", f":{c.path}", check=False).stdout
            diff = "".join(difflib.unified_diff(c.text.splitlines(keepends=True), resolved.splitlines(keepends=True),
                                                f"a/{c.path}", f"b/{c.path}", n=3))
            if not diff:
                continue
            target = self._diff_path(entry, c.key)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(diff)
            rows.append({"entry": entry, "key": c.key, "file": c.path, "from": from_rev, "onto": onto_rev})
            refs.append(f"{entry}:{c.key}")
        if refs:
            rows.sort(key=lambda r: (r["entry"], r["file"], r["key"]))
            self.index.write_text(tomli_w.dumps({"resolutions": rows}))
        return refs
