"""Is a patched tree what the series says? The proof ``apply``, ``rebase``, ``status`` and ``refresh`` give.

The tree at ``head`` (its provenance file aside) is compared with a fresh replay of the series on
the same upstream commit, in a temporary index (``ops.replay``: with the ledger's recorded
resolutions). Every difference must be explained by an edit (a ``Verdict``): a ``user-edit`` (an entry commit
of the branch differs from what the series' file gives on its parent) or a ``user-commit`` (a
commit that carries no entry of the series). The edits are replayed, in branch order, on the fresh
tree, and the hunks each one adds are attributed to it; what is left is *unattributed*, listed hunk
by hunk, and the tree is not proven. A caller may accept only some edits (``rebase`` accepts those
the branch had before it started); a refused edit stays in the unattributed rest, named.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Literal, Sequence

from unidiff import PatchSet

from c128patch import procs
from c128patch.git import Git
from c128patch.ops.replay import (
    FAILED,
    BranchCommit,
    RevCheck,
    Trees,
    branch_commits,
    own_pairs,
    replay_entry,
    replay_in_index,
)
from c128patch.series.layers import describe
from c128patch.series.ledger import Ledger, Resolution
from c128patch.series.manifest import Series
from c128patch.series.patchfile import hunk_header, read_patch
from c128patch.series.plan import Planned, choose, index_git, merged_entries, verify_file
from c128patch.series.provenance import PROVENANCE_PATH
from c128patch.textsafe import some

DifferenceKind = Literal["user-edit", "user-commit", "unattributed"]
VerdictKind = Literal["series", "user-edit", "user-commit", "uncompared"]


@dataclass(frozen=True)
class Hunk:
    path: str
    header: str  # "@@ -a,b +c,d @@ context"
    text: str  # the hunk as git diff prints it


@dataclass
class Difference:
    kind: DifferenceKind
    label: str  # what it is attributed to ("" when unattributed)
    hunks: list[Hunk]
    note: str = ""

    @property
    def files(self) -> list[str]:
        return sorted({h.path for h in self.hunks})


@dataclass
class Equivalence:
    """The verdict on one tree; ``summary()`` is the line every command prints."""

    series: str  # "c128patch 2"
    rev: str
    commit: str
    head: str
    fresh_tree: str
    tree: str  # head's tree, provenance file aside
    replay: RevCheck
    differences: list[Difference] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    without: list[str] = field(default_factory=list)  # entries left out of the fresh replay (skipped, dropped)

    @property
    def identical(self) -> bool:
        return self.replay.ok and self.fresh_tree == self.tree

    @property
    def unattributed(self) -> list[Difference]:
        return [d for d in self.differences if d.kind == "unattributed"]

    @property
    def ok(self) -> bool:
        return self.replay.ok and not self.unattributed

    @property
    def ledger(self) -> list[Resolution]:
        return [r for e in self.replay.entries for r in e.resolutions]

    def summary(self) -> str:
        series = self.series + (f" without {', '.join(self.without)}" if self.without else "")
        fresh = f"a fresh apply of series {series} on {self.rev}"
        if self.ledger:
            fresh += " with ledger resolutions " + ", ".join(r.ref for r in self.ledger)
        if not self.replay.ok:
            failed = [e for e in self.replay.entries if e.status in FAILED]
            why = f"entry {failed[0].name}: {failed[0].detail}" if failed else self.replay.error
            return f"cannot prove: the series does not replay on {self.rev} ({why})"
        if self.identical:
            return f"identical to {fresh}"
        if not self.unattributed:
            return f"equals {fresh} but for " + "; ".join(f"{d.label} ({some(d.files, 3)})" for d in self.differences)
        first = self.unattributed[0].hunks[0]
        return (f"differs from {fresh}: unattributed change in {some(self.unattributed[0].files, 3)} "
                f"(first: {first.path} {first.header})")

    def to_json(self) -> dict:
        return asdict(self) | {"summary": self.summary(), "identical": self.identical, "ok": self.ok}


def hunks_between(git: Git, before: str, after: str) -> list[Hunk]:
    out = []
    for pf in PatchSet(git.run("diff", "--no-color", "--no-renames", "--no-ext-diff", before, after).stdout):
        if pf.is_binary_file or not len(pf):
            out.append(Hunk(pf.path, "(binary or mode change)", ""))
        out += [Hunk(pf.path, hunk_header(h, section=True), str(h)) for h in pf]
    return out


def tree_diff(git: Git, before: str, after: str) -> str:
    """What changes ``before`` into ``after`` (trees or commits), as an edit is carried: binary, no renames."""
    return git.run("diff", "--full-index", "--binary", "--no-renames", before, after).stdout


def apply_cached(idx: Git, diff: str) -> bool:
    """``diff`` applied to ``idx``'s index: strict, else 3-way."""
    return idx.ok("apply", "--cached", input=diff) or idx.ok("apply", "--cached", "--3way", input=diff)


def tree_without_provenance(git: Git, head: str, index_file: Path, like: str = "") -> str:
    """The tree of ``head`` less the provenance file. ``like``: a tree it is expected to be (the fresh replay's),
    taken where ``head``'s tree differs from it by that file added and nothing else (one diff-tree; a read-tree of
    the whole tree, an update-index and a write-tree otherwise: ~60 ms of apply's proof)."""
    if like and git.run("diff-tree", "-r", "-z", "--no-renames", "--name-status", like, head).stdout == \
            f"A\0{PROVENANCE_PATH}\0":  # (only "added": a ``like`` holding the file is not head's tree less it)
        return like
    idx = index_git(git, index_file)
    idx.run("read-tree", head)
    idx.run("update-index", "--force-remove", "--", PROVENANCE_PATH)
    return idx.out("write-tree")


@dataclass(frozen=True)
class Verdict:
    """One commit of a branch against the series: an edit the series does not make (``before`` -> ``after``)?"""

    commit: BranchCommit
    kind: VerdictKind
    before: str  # the tree the series gives (user-edit), or the parent's tree (user-commit)
    after: str  # the commit's tree
    detail: str = ""

    @property
    def label(self) -> str:
        c = self.commit
        if self.kind == "user-edit":
            return f"user edit on entry {c.entry} (commit {c.sha[:12]})"
        return f"user commit {c.sha[:12]} {c.entry or c.subject!r}"


def compare_commits(series: Series, git: Git, base: str, head: str, scratch: Path,
                    fresh: Trees | None = None) -> list[Verdict]:
    """Each commit of ``base..head`` but the provenance one against the series; ``fresh``: a replay's trees."""
    entries = {e.name: e for e in series.entries}
    merged = {e.name for e in merged_entries(series, git, base)}
    ledger, index_file = Ledger(series), scratch / "branch.index"
    commits = branch_commits(git, base, head)
    trees = {c.sha: c.tree for c in commits}
    out = []
    for c in (c for c in commits if c.entry != "provenance"):
        before = trees.get(c.parent) or git.out("rev-parse", f"{c.parent}^{{tree}}")
        entry = entries.get(c.entry)
        if entry is None or entry.name in merged:
            out.append(Verdict(c, "user-commit", before, c.tree))
            continue
        if (fresh or {}).get(c.entry) == (before, c.tree):
            out.append(Verdict(c, "series", c.tree, c.tree))
            continue
        variant = choose(series, git, entry, c.parent).variant if entry.is_patch else None
        path = verify_file(series, entry, variant)
        item = Planned(entry, variant, path, read_patch(path) if entry.is_patch else None)
        index_git(git, index_file).run("read-tree", c.parent)
        present = set(git.out("ls-tree", "-r", "--name-only", c.parent, "--", *item.touched).splitlines())
        row = replay_entry(git, item, index_file, present, ledger=ledger, at=c.parent, series=series)
        if row.status in FAILED:
            out.append(Verdict(c, "uncompared", "", c.tree,
                               f"{item.label} does not replay on the commit's parent: {row.detail}"))
            continue
        expected = index_git(git, index_file).out("write-tree")
        out.append(Verdict(c, "series" if expected == c.tree else "user-edit", expected, c.tree))
    return out


def entry_trees(git: Git, base: str, head: str) -> Trees:
    """Each entry commit of ``base..head`` (its name on one commit only): (its parent's tree, its tree)."""
    commits = branch_commits(git, base, head)
    trees = {base: git.out("rev-parse", f"{base}^{{tree}}"), **{c.sha: c.tree for c in commits}}
    names = [c.entry for c in commits]
    return {c.entry: (trees[c.parent], c.tree) for c in commits
            if c.entry and names.count(c.entry) == 1 and c.parent in trees}


def fresh_replay(series: Series, git: Git, rev: str, commit: str, *, span: str = "",
                 without: Sequence[str] = (), planned: list[Planned] | None = None,
                 each: bool = True, known: Trees | None = None) -> tuple[RevCheck, str, Trees]:
    """``prove``'s fresh replay (rows, tree, each entry's trees: {} where not ``each``); it reads nothing of the
    branch, so may run first; ``planned``: the ``plan`` of ``series`` less ``without`` on ``commit``, made already;
    ``known``: a branch's ``entry_trees``, taken where they are the replay's own (``ops.replay.own_pairs``, else
    ``ops.replay.replay_run``)."""
    series = series.without(set(without)) if without else series
    with procs.scratch("c128fresh-") as tmp:
        index_file = Path(tmp) / "fresh.index"
        if each and known:  # the branch's trees, where they are the replay's: no write-tree per entry
            anchors: dict[str, str] = {}
            replay, planned = replay_in_index(series, git, rev, commit, index_file, ledger=Ledger(series), span=span,
                                              planned=planned, anchors=anchors)
            final = index_git(git, index_file).out("write-tree")
            own = own_pairs(git, planned, replay.entries, git.out("rev-parse", f"{commit}^{{tree}}"), final,
                            known, anchors) if replay.ok else None
            if own is not None:
                return replay, final, own
            index_file.unlink(missing_ok=True)
        trees: Trees | None = {} if each else None
        replay, _ = replay_in_index(series, git, rev, commit, index_file, ledger=Ledger(series), span=span,
                                    trees=trees, planned=planned, known=known)
        return replay, index_git(git, index_file).out("write-tree"), trees or {}


def prove(series: Series, git: Git, rev: str, commit: str, head: str = "HEAD", *,
          accept: Callable[[Verdict], bool] | None = None, span: str = "", without: Sequence[str] = (),
          fresh: tuple[RevCheck, str, Trees] | None = None) -> Equivalence:
    """``head`` against a fresh replay (module docstring); ``accept``: the edits that may explain a difference."""
    head = git.out("rev-parse", head)
    # each entry's trees (a write-tree per entry) only where the trees differ
    replay, fresh_tree, trees = fresh or fresh_replay(series, git, rev, commit, span=span, without=without, each=False)
    series = series.without(set(without)) if without else series
    with procs.scratch("c128prove-") as tmp:
        scratch = Path(tmp)
        tree = tree_without_provenance(git, head, scratch / "head.index", like=fresh_tree)
        result = Equivalence(describe(series).removeprefix("series "), rev, commit, head, fresh_tree, tree, replay,
                             without=list(without))
        if fresh_tree == tree:
            return result
        trees = trees if fresh else fresh_replay(series, git, rev, commit, span=span)[2]  # (series: less without)
        verdicts = compare_commits(series, git, commit, head, scratch, trees)
        result.notes = [f"entry {v.commit.entry} (commit {v.commit.sha[:12]}) could not be compared with the "
                        f"series: {v.detail}" for v in verdicts if v.kind == "uncompared"]
        idx = index_git(git, scratch / "edits.index")
        idx.run("read-tree", fresh_tree)
        current = fresh_tree
        for edit in (v for v in verdicts if v.kind in ("user-edit", "user-commit")):
            if accept is not None and not accept(edit):
                result.notes.append(f"{edit.label}: not an edit the branch had; its changes count as unattributed")
            elif not apply_cached(idx, tree_diff(git, edit.before, edit.after)):
                idx.run("read-tree", current)
                result.notes.append(f"{edit.label}: does not replay on the fresh tree; "
                                    "its changes count as unattributed")
            else:
                new = idx.out("write-tree")
                result.differences.append(Difference(edit.kind, edit.label, hunks_between(git, current, new)))
                current = new
        rest = hunks_between(git, current, tree)
        if rest:
            result.differences.append(Difference("unattributed", "", rest, "; ".join(result.notes)))
        return result
