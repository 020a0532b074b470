"""What a stop tells the user. For each block of a file ``git apply --3way`` left conflicted (``analyze``):
where its upstream side sits on the new base (HEAD, 1-based), the entry's hunk it holds, the range's
upstream commits that last touched those lines (``git blame``; for an empty side or a backward rebase,
the range's commits that touched the file), and where the code the hunk edits now lives when its
context is found elsewhere (upstream moved it: taking the empty side would silently lose the change).

For an overlay whose target path upstream took (``taken``): keeping ours would replace upstream's module under every
upstream importer (gates off too). It names the upstream commit that created the file, the upstream files importing
it (``git grep`` of the new base for the dotted module, or a header's name), the entries of ours importing ours, and
so the way through: ``rename`` (entries import ours: another ``target`` in series.toml, then ``rebase --continue``)
or ``drop`` (nothing does: ``rebase --skip`` drops it as superseded, recording ``merged_in``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from unidiff import PatchSet, UnidiffParseError

from c128patch.git import Git
from c128patch.series.ledger import Resolution
from c128patch.series.manifest import Entry, Series
from c128patch.series.patchfile import hunk_header, read_patch
from c128patch.textsafe import md

TREE_ROOT = "python"
_OURS, _SEP, _THEIRS = "<" * 7, "=" * 7, ">" * 7
_BLAME_HEADER = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})? \d+ \d+(?: \d+)?")
_BLOCK = re.compile(r"^<{7}\n((?:.*\n)*?)={7}\n((?:.*\n)*?)>{7}$", re.M)


@dataclass(frozen=True)
class Block:
    path: str
    lines: tuple[int, int]  # (first, last) on HEAD; last == first - 1 when the upstream side is empty
    hunk: str
    upstream: tuple[str, ...]  # "abc123456789 subject"
    moved_to: int | None
    empty: bool
    behind: str = ""  # a backward rebase: the rev it goes to (an ancestor of the old base), which may lack code yet

    def describe(self) -> str:
        first, last = self.lines
        where = (f"{self.path}:{first}" if last == first else f"{self.path}:{first}-{last}" if last > first
                 else f"{self.path}: after line {last}")
        more = " ..." if len(self.upstream) > 3 else ""
        return (f"{where}: hunk {self.hunk or '(not matched)'}"
                + (f"; the upstream side is empty ({empty_why(self.behind)})" if self.empty else "")
                + (f"; the code this hunk edits now lives at line {self.moved_to}" if self.moved_to else "")
                + (f"; upstream: {'; '.join(self.upstream[:3])}{more}" if self.upstream else ""))


def empty_why(behind: str) -> str:
    """Why a block's upstream side is empty: an older rev (``behind``) lacks the code yet, else upstream removed it."""
    return (f"{behind} does not have the code this hunk edits yet" if behind
            else "upstream removed the code this hunk edits")


@dataclass
class StopReport:
    """Everything about one stop of a rebase (also written to the Markdown and JSON reports)."""

    entry: str
    phase: str  # "series" (the series' file), "user-edit" (the branch's edit), "carried" (a user commit)
    file: str  # the patch file, or what the diff came from
    blocks: list[Block] = field(default_factory=list)
    resolved: list[Resolution] = field(default_factory=list)  # by the ledger, at this stop
    unresolved: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)  # the tree files it stopped at (also without blocks)

    def lines(self) -> list[str]:
        out = [b.describe() for b in self.blocks]
        if self.resolved:
            out.append("partly resolved by the ledger: " + "; ".join(r.describe() for r in self.resolved)
                       + f"; still conflicted: {', '.join(self.unresolved)}")
        return out


def _find(haystack: list[str], needle: list[str], near: int) -> int | None:
    """Index of the occurrence of ``needle`` (not empty) in ``haystack`` nearest ``near``."""
    if not needle:
        return None
    hits = [i for i in range(len(haystack) - len(needle) + 1) if haystack[i: i + len(needle)] == needle]
    return min(hits, key=lambda i: abs(i - near)) if hits else None


def _moved(head: list[str], hunk, at: int, span: int) -> int | None:
    """Where the hunk's pre-image is found in ``head`` when away from the block at line index ``at``, else None."""
    pre = [(k, line.value.strip()) for k, line in enumerate(line for line in hunk if not line.is_added)]
    pre = [(k, v) for k, v in pre if len(v) >= 8]
    if len(pre) < 2:
        return None
    stripped = [line.strip() for line in head]
    starts: dict[int, int] = {}
    for k, value in pre:
        for i, line in enumerate(stripped):
            if line == value:
                starts[i - k] = starts.get(i - k, 0) + 1
    if not starts:
        return None
    best = max(starts, key=lambda s: (starts[s], -abs(s - at)))
    if starts[best] < max(2, (len(pre) * 3 + 4) // 5) or abs(best - at) <= span:
        return None
    return best + 1


def analyze(git: Git, path: str, text: str, diff: str, *, head: str, old: str, onto: str,
            rev: str = "") -> list[Block]:
    """The blocks of ``path``'s conflicted ``text``, ``diff`` being what was merged into HEAD (``rev``: ``onto``'s
    name)."""
    head_lines = (git.blob(head, path) or b"").decode(errors="replace").splitlines()
    forward = git.is_ancestor(old, onto)
    behind = (rev or onto[:12]) if not forward and git.is_ancestor(onto, old) else ""
    span = f"{old}..{onto}" if forward else f"{onto}..{old}"
    in_range = set(git.lines("rev-list", span, "--", path))
    touched = tuple(git.lines("log", "--format=%h %s", span, "--", path))
    try:
        hunks = [h for pf in PatchSet(diff) if pf.path.removeprefix("a/").removeprefix("b/") == path for h in pf]
    except UnidiffParseError:
        hunks = []
    merged_lines = text.splitlines()
    out = []
    for m in _BLOCK.finditer(text):  # (line index of its first marker, upstream side, entry side)
        start, ours, theirs = text.count("\n", 0, m.start()), m[1].splitlines(), m[2].splitlines()
        before = [line for line in merged_lines[max(0, start - 3): start] if line not in (_OURS, _SEP, _THEIRS)]
        pos = _find(head_lines, ours, start) if ours else None
        if pos is None:  # empty upstream side: place the block after the lines before it
            anchor = _find(head_lines, before, start)
            pos = (anchor + len(before)) if anchor is not None else start
        first, last = pos + 1, pos + len(ours)
        upstream = touched
        if ours and forward:
            # porcelain: a header per line ("<id> <orig> <final>[ <count>]"), the commit's fields (its summary
            # and author: upstream's text) and the line itself after a tab (a blank one: a bare tab). Split at
            # "\n" only (a summary holding U+2028 forged a line), and only header lines name an id.
            blame = git.lines("blame", "--porcelain", "-L", f"{first},{last}", head, "--", path, check=False)
            shas = {line.split(" ", 1)[0] for line in blame if _BLAME_HEADER.fullmatch(line)}
            hits = [c for c in shas if c in in_range]
            upstream = tuple(git.lines("log", "--no-walk", "--format=%h %s", *hits)) if hits else ()
        end = start + len(ours) + len(theirs) + 3
        # its hunk: the one sharing the most lines with the block and the lines around it; of equals, the nearest
        block = {line.strip() for line in merged_lines[max(0, start - 3): end + 3]
                 if line.strip() and line not in (_OURS, _SEP, _THEIRS)}
        best = max([(len(block & {line.value.strip() for line in h if line.value.strip()}),
                     -abs(h.source_start - first), i) for i, h in enumerate(hunks)], default=(0, 0, -1))
        hunk = hunks[best[2]] if best[0] else None
        moved = _moved(head_lines, hunk, pos, len(ours) + len(theirs) + 6) if hunk is not None else None
        header = hunk_header(hunk, section=True) if hunk is not None else ""
        out.append(Block(path, (first, last), header, upstream, moved, not ours, behind if not ours else ""))
    return out


def block_markdown(b: dict, why: str = "") -> str:
    """One conflict block of a stop report (``Block.to_json``) as a Markdown list item."""
    first, last = b["lines"]
    where = f"lines {first}-{last}" if last >= first else f"after line {last}"
    return (f"- {md(b['path'])} {where} on the new base: hunk {md(b['hunk'] or '?')}"  # upstream's text: data
            + (f"; **the upstream side is empty** ({empty_why(b['behind'])})" if b["empty"] and b.get("behind")
               else f"; **the upstream side is empty**{why}" if b["empty"] else "")
            + (f"; the code this hunk edits now lives at line {b['moved_to']}" if b["moved_to"] else "")
            + (f"; upstream: {'; '.join(map(md, b['upstream'][:5]))}" if b["upstream"] else ""))


@dataclass
class Taken:
    target: str
    created: str  # "abc123456789 subject" of the upstream commit that added the file ("" when not found)
    importers: list[str] = field(default_factory=list)  # upstream files importing it, on the new base
    ours: list[str] = field(default_factory=list)  # entries of the series importing our module
    way: str = "drop"  # "rename" or "drop"
    commit: str = ""  # the full id of ``created``

    def lines(self, rename: str, skip: str) -> list[str]:
        return [f"upstream created {self.target}" + (f" in {self.created}" if self.created else "")
                + (f"; imported upstream by {', '.join(self.importers[:5])}" if self.importers else
                   "; nothing upstream imports it"),
                f"way through: rename our target (entries {', '.join(self.ours)} import ours): set another target "
                f"in series.toml, point them at it, then {rename}" if self.way == "rename" else
                f"way through: drop ours as superseded by upstream's file (nothing of ours imports it): {skip}"]


def _patterns(target: str) -> list[str]:
    """Extended regexes that find an import of ``target`` (a header: its file name in an include)."""
    path = PurePosixPath(target)
    parts = list(path.with_suffix("").parts[1:]) if path.suffix == ".py" and path.parts[0] == TREE_ROOT else []
    module = ".".join(parts[:-1] if parts[-1:] == ["__init__"] else parts)  # imported as, ``python/`` left out
    if not module:
        return [re.escape(path.name)]
    parent, _, name = module.rpartition(".")
    return [rf"(from|import)[[:space:]]+{re.escape(module)}([^A-Za-z0-9_]|$)",
            rf"from[[:space:]]+{re.escape(parent)}[[:space:]]+import.*[^A-Za-z0-9_]{re.escape(name)}([^A-Za-z0-9_]|$)"]


def taken(git: Git, series: Series, entry: Entry, old: str, onto: str) -> Taken:
    """Who made ``entry``'s overlay target upstream in ``old..onto``, who imports it there and here, the way through."""
    target = entry.target
    made = git.named("log", "-1", "--diff-filter=A", "--format=%H %h %s", f"{old}..{onto}", "--", target) or \
        git.named("log", "-1", "--diff-filter=A", "--format=%H %h %s", onto, "--", target)
    commit, _, created = made.partition(" ")
    args = [a for p in _patterns(target) for a in ("-e", p)]
    hits = git.run("grep", "-l", "-E", *args, onto, "--", TREE_ROOT, check=False).stdout.splitlines()
    importers = sorted({h.split(":", 1)[1] for h in hits if ":" in h} - {target})
    found = re.compile("|".join(p.replace("[[:space:]]", r"\s") for p in _patterns(target)))
    ours = []
    for other in (e for e in series.entries if e.name != entry.name):
        paths = [(v, series.file_of(other, v)) for v in other.patch_files() or [None]]
        texts = ["\n".join(read_patch(p).added) if v else p.read_text(errors="replace")  # what it adds
                 for v, p in paths if p.is_file()]
        if any(found.search(text) for text in texts):
            ours.append(other.name)
    return Taken(target, created, importers, ours, "rename" if ours else "drop", commit)
