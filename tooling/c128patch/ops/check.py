"""``check``: does the series apply to a rev? Replayed in a temporary index; nothing is checked out."""

from __future__ import annotations

import concurrent.futures
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from c128patch.errors import C128Error
from c128patch.git import Git
from c128patch.series.manifest import Series
from c128patch.series.plan import Planned, check_paths_at, index_git, plan


@dataclass
class EntryCheck:
    name: str
    kind: str
    file: str
    status: str  # clean | 3way | conflict | collision | skipped
    detail: str = ""


@dataclass
class RevCheck:
    rev: str
    commit: str
    ok: bool = True
    entries: list[EntryCheck] = field(default_factory=list)
    error: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def _first_error(text: str) -> str:
    for line in text.splitlines():
        if "patch failed:" in line or "does not exist" in line or "already exists" in line:
            return line.removeprefix("error: ").strip()
    lines = [l for l in text.splitlines() if l.strip()]
    return lines[-1].removeprefix("error: ").strip() if lines else ""


def _replay_patch(idx: Git, item: Planned, index_file: Path) -> EntryCheck:
    row = EntryCheck(item.entry.name, item.entry.kind, item.label, "clean")
    path = str(item.path)
    strict = idx.run("apply", "--cached", path, check=False)  # all or nothing: a failure changes no entry
    if strict.returncode == 0:
        return row
    saved = index_file.read_bytes()
    three = idx.run("apply", "--cached", "--3way", path, check=False)
    if three.returncode == 0:
        row.status, row.detail = "3way", "applies only with a 3-way merge"
        return row
    row.status, row.detail = "conflict", _first_error(strict.stderr)
    # Back to the index before this entry: later entries are checked on top of the rest.
    index_file.write_bytes(saved)
    return row


def _replay_overlay(idx: Git, item: Planned) -> EntryCheck:
    row = EntryCheck(item.entry.name, item.entry.kind, item.label, "clean")
    if idx.out("ls-files", "--", item.entry.target):
        row.status, row.detail = "collision", f"{item.entry.target} already exists"
        return row
    sha = idx.out("hash-object", "-w", "--", str(item.path))
    idx.run("update-index", "--add", "--cacheinfo", f"100644,{sha},{item.entry.target}")
    return row


def replay_in_index(series: Series, git: Git, rev: str, commit: str, index_file: Path) -> tuple[RevCheck, list[Planned]]:
    """Replay the series on ``commit`` into the index file ``index_file`` (nothing is checked out)."""
    result = RevCheck(rev, commit)
    try:
        planned = plan(series, git, commit)
        present = check_paths_at(git, commit, [p for p in planned if p.patch is not None])
    except C128Error as exc:
        result.ok, result.error = False, exc.message
        return result, []
    idx = index_git(git, index_file)
    idx.run("read-tree", commit)
    for item in planned:
        missing = [f for f in item.patch.needs if f not in present] if item.patch is not None else []
        if missing:  # not even a 3-way merge can patch a file that is not there
            row = EntryCheck(item.entry.name, item.entry.kind, item.label, "conflict", f"{missing[0]}: does not exist")
        elif item.patch is not None:
            row = _replay_patch(idx, item, index_file)
        else:
            row = _replay_overlay(idx, item)
        present.update(item.touched)
        result.entries.append(row)
        if row.status in ("conflict", "collision"):
            result.ok = False
    return result, planned


def check_rev(series: Series, git: Git, rev: str, commit: str) -> RevCheck:
    with tempfile.TemporaryDirectory(prefix="c128check-") as tmp:
        return replay_in_index(series, git, rev, commit, Path(tmp) / "index")[0]


def check_revs(series: Series, git: Git, revs: list[tuple[str, str]], jobs: int | None = None) -> list[RevCheck]:
    """``check_rev`` for many (rev, commit) pairs, in parallel (git does the work; each has its own index)."""
    jobs = jobs or min(8, os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(lambda rc: check_rev(series, git, *rc), revs))
