"""A rebase's steps and journal (``.git/c128patch/rebase.json``), written before every step; a stop also keeps
what it wrote in the work tree (``stop_state``) and the conflicts git left."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from c128patch.errors import C128Error
from c128patch.git import Git
from c128patch.jsonio import read_json, write_json_atomic
from c128patch.ops.treestate import checked_fields, corrupt_journal, read_journal, rebase_command
from c128patch.series.ledger import Conflict
from c128patch.series.paths import check_relpath

StepKind = Literal["entry", "commit"]
Status = Literal["pending", "replayed", "unchanged", "context-only", "content-changed", "new", "resolved",
                 "dropped-as-merged", "skipped", "removed", "failing"]
Phase = Literal["", "series", "user-edit", "carried"]
Paused = Literal["", "conflict", "merged"]
LEFT_OUT: tuple[Status, ...] = ("dropped-as-merged", "skipped", "removed")  # entries the new tip leaves out
DONE: tuple[Status, ...] = ("replayed", "unchanged", "context-only", "content-changed", "new", "resolved", *LEFT_OUT)


@dataclass
class Step:
    name: str
    kind: StepKind = "entry"
    sha: str = ""  # its commit on the old branch ("" when the branch had none)
    subject: str = ""
    status: Status = "pending"
    detail: str = ""
    new_sha: str = ""
    file: str = ""  # the series' file replayed (entries)
    chosen_by: str = ""
    applied: str = ""  # clean | 3way | ledger | resolved (by hand) | carried
    edit_from: str = ""  # a user edit: the tree the series gives on the old commit's parent ...
    edit_to: str = ""  # ... and the old commit's tree
    series_tree: str = ""  # the tree after the series' part on the new branch
    phase: Phase = ""  # where a stop is
    ledger: list[str] = field(default_factory=list)
    signals: list[dict] = field(default_factory=list)
    upstream_commits: list[str] = field(default_factory=list)
    stop: dict = field(default_factory=dict)  # the StopReport of a stop
    renamed: dict = field(default_factory=dict)  # path in the file -> where upstream moved it (ops.replay)
    hints: list = field(default_factory=list)  # ops.merged: upstream commits that may now do what it does

    @property
    def user_edit(self) -> bool:
        return bool(self.edit_from)

    def merged_in(self, onto: str) -> str:
        """The upstream commit a merged (or at a stop skipped) entry went in with, as named, else ``onto``."""
        made = (self.stop.get("taken") or {}).get("commit", "")
        if (self.status == "skipped" and self.stop) or (
                self.status == "dropped-as-merged" and self.detail.startswith(("empty:", "superseded:", "dropped:"))):
            return made or (self.hints[0]["commit"] if self.hints else onto)
        if self.status != "dropped-as-merged":
            return ""
        return next((s["commit"] for s in self.signals if s.get("commit") and s["kind"] == "patch-id"), onto)


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
    # the new branch's tip before the current step (HEAD goes there only at a stop and at the end)
    head_before: str = ""
    paused: Paused = ""
    stop_state: dict[str, str] = field(default_factory=dict)  # path -> blob the stop left in the work tree
    upstream: dict = field(default_factory=dict)  # the old provenance's upstream record (its fields are kept)
    layers: list[str] = field(default_factory=list)  # the layer folders replayed after the series (series.layers)

    @property
    def span(self) -> str:
        return f"{self.old_rev}..{self.onto_rev}"

    @property
    def left_out(self) -> list[str]:
        """The entries the new tip leaves out on purpose (the proof's fresh replay does too)."""
        return [s.name for s in self.steps if s.kind == "entry" and s.status in LEFT_OUT]

    @classmethod
    def load(cls, path: Path, git: Git) -> "Journal":
        """The journal at ``path``; a damaged one is a one-line error that says how to forget it."""
        if not path.is_file():
            raise C128Error("no c128patch rebase is in progress here")
        data = checked_fields(cls, read_journal(git, path, "rebase"), git, path, "rebase")
        if not all(isinstance(s, dict) for s in data["steps"]):
            raise corrupt_journal(git, path, "rebase", "a step is not an object")
        data["steps"] = [Step(**checked_fields(Step, s, git, path, "rebase")) for s in data["steps"]]
        journal = cls(**data)
        if not 0 <= journal.pos <= len(journal.steps):
            raise corrupt_journal(git, path, "rebase", f"'pos' {journal.pos} is outside its {len(journal.steps)} steps")
        return journal

    def save(self, path: Path) -> None:
        write_json_atomic(path, asdict(self), sync=False)  # in the git dir (jsonio.write_atomic)


def save_conflicts(state: Path, conflicts: list[Conflict]) -> None:
    """Keep the conflicted files as git left them: --continue records the resolution against them."""
    write_json_atomic(state / "conflicts.json", [asdict(c) for c in conflicts])


def saved_conflicts(state: Path, tree: Path) -> list[Conflict]:
    """What ``save_conflicts`` kept: input (a file in the git dir), each a tree path and strings, else an error (with
    the undo for ``tree``: a bare `c128patch rebase --abort` works only from inside it)."""
    path = state / "conflicts.json"
    if not path.exists():
        return []
    rows, keys = read_json(path, list), ["path", "key", "text", "match"]
    undo = f"`{rebase_command(tree, 'abort')}` undoes the rebase"
    try:
        made = [Conflict.of(check_relpath(c["path"], str(path)), c["text"]) for c in rows or []
                if isinstance(c, dict) and sorted(c) == sorted(keys) and all(isinstance(v, str) for v in c.values())]
    except C128Error as exc:
        raise C128Error(f"{exc.message}; {undo}") from None
    if rows is None or [asdict(c) for c in made] != rows:  # each key is its text's: none filed under another's
        raise C128Error(f"{path}: not the conflicts this rebase saved (damaged or edited); {undo}")
    return made
