"""Is an entry already upstream? Content decides; a PR number in a subject is only a hint.

Signals for one entry on a new base (with the earlier entries replayed on it), each named in the
rebase report:

* ``reverse-apply``: the entry's change (the file the series chooses there, or its commit on the
  old branch) reverse-applies on it: the new base already has the entry's result;
* ``patch-id``: one upstream commit of the range makes the very same change to every file of the
  entry (per-file ``git patch-id --stable`` of ``--unified=0`` diffs, so neither context nor line
  numbers matter). Each (upstream commit, file) is diffed once; the ids are cached by commit id
  (``.git/c128patch/patch-ids.json``), so entries and later rebases reuse them;
* ``became-empty``: replaying the entry changes nothing (the replay reports it);
* ``overlay-identical``: an overlay's target exists upstream with our content;
* ``pr-hint``: an upstream commit's subject names a PR of the entry's ``upstream`` field. A hint,
  never enough: a drop is proposed only with one of the content signals above.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from c128patch.git import Git
from c128patch.jsonio import write_json_atomic
from c128patch.series.plan import Planned, blob_id, index_git

SignalKind = Literal["reverse-apply", "patch-id", "became-empty", "overlay-identical", "pr-hint"]
CONTENT: tuple[SignalKind, ...] = ("reverse-apply", "patch-id", "became-empty", "overlay-identical")
_PR = re.compile(r"#(\d+)")
_DIFF = re.compile(r"^diff --git a/(.*?) b/(.*)$", re.M)


@dataclass(frozen=True)
class Signal:
    kind: SignalKind
    detail: str
    commit: str = ""  # the upstream commit it points at, when it points at one

    @property
    def content(self) -> bool:
        return self.kind in CONTENT

    def describe(self) -> str:
        return f"{self.kind}: {self.detail}"


def proposes_drop(signals: list[Signal]) -> bool:
    return any(s.content for s in signals)


def per_file_ids(git: Git, diff: str) -> dict[str, str]:
    """path -> ``git patch-id --stable`` of that file's part of ``diff`` (one git call)."""
    starts = [m.start() for m in _DIFF.finditer(diff)]
    chunks, paths = [], []
    for i, start in enumerate(starts):
        part = diff[start: starts[i + 1] if i + 1 < len(starts) else len(diff)]
        paths.append(_DIFF.match(part).group(2))  # type: ignore[union-attr]
        chunks.append(f"commit {i:040x}\n{part}")
    if not chunks:
        return {}
    out = {}
    for line in git.run("patch-id", "--stable", input="".join(chunks)).stdout.splitlines():
        pid, fake = line.split()
        out[paths[int(fake, 16)]] = pid
    return out


class UpstreamIds:
    """Per-file patch-ids of upstream commits, each (commit, file) computed once and kept on disk
    (``""``: the commit does not change that file)."""

    def __init__(self, git: Git, cache: Path) -> None:
        self.git, self.cache = git, cache
        self._ids: dict[str, dict[str, str]] = json.loads(cache.read_text()) if cache.is_file() else {}

    def of(self, commit: str, paths: list[str]) -> dict[str, str]:
        known = self._ids.setdefault(commit, {})
        missing = [p for p in paths if p not in known]
        if missing:
            diff = self.git.run("show", "--format=", "--unified=0", "--no-renames", "--full-index", commit, "--",
                                *missing).stdout
            known.update({p: "" for p in missing} | per_file_ids(self.git, diff))
            write_json_atomic(self.cache, self._ids)
        return {p: known[p] for p in paths}


@dataclass
class MergedCheck:
    """The signals for the entries of one rebase range ``old..onto``."""

    git: Git
    old: str
    onto: str
    ids: UpstreamIds

    def _range_commits(self, paths: list[str]) -> list[str]:
        return self.git.out("log", "--format=%H", f"{self.old}..{self.onto}", "--", *paths).splitlines()

    def signals(self, item: Planned, head: str, old_commit: str, index_file: Path) -> list[Signal]:
        """Signals for ``item`` on ``head`` (the new base with the earlier entries); ``old_commit``:
        the entry's commit on the old branch ("" when it had none)."""
        out = self._pr_hints(item)
        if item.patch is None:
            blob = self.git.tree_entry(head, item.entry.target)
            if blob is not None and blob[2] == blob_id(item.path.read_bytes()):
                out.append(Signal("overlay-identical", f"{item.entry.target} exists upstream with our content"))
            return out
        idx = index_git(self.git, index_file)
        idx.run("read-tree", head)
        diffs = {"the series' file": item.path.read_text()}
        if old_commit:
            diffs["its commit on the old branch"] = self.git.run("show", "--format=", "--full-index", old_commit).stdout
        for what, diff in diffs.items():
            if diff.strip() and idx.ok("apply", "--cached", "--check", "-R", input=diff):
                out.append(Signal("reverse-apply", f"{what} reverse-applies on the new base"))
                break
        if old_commit:
            out += self._patch_id(old_commit)
        return out

    def _pr_hints(self, item: Planned) -> list[Signal]:
        out = []
        for number in _PR.findall(item.entry.upstream):
            hit = self.git.out("log", "--format=%H %s", "-E", f"--grep=\\(#{number}\\)", f"{self.old}..{self.onto}")
            if hit:
                sha, _, subject = hit.splitlines()[0].partition(" ")
                out.append(Signal("pr-hint", f"upstream commit {sha[:12]} {subject!r} names PR #{number}", sha))
        return out

    def _patch_id(self, old_commit: str) -> list[Signal]:
        diff = self.git.run("show", "--format=", "--unified=0", "--no-renames", "--full-index", old_commit).stdout
        ours = per_file_ids(self.git, diff)
        if not ours:
            return []
        for sha in self._range_commits(sorted(ours)):
            theirs = self.ids.of(sha, sorted(ours))
            if all(theirs.get(path) == pid for path, pid in ours.items()):
                return [Signal("patch-id", f"upstream commit {sha[:12]} makes the same change to "
                                           f"{', '.join(sorted(ours))}", sha)]
        return []
