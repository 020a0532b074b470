"""Replay entries of the series on an index: no checkout, nothing of the user's touched.

A patch is tried strictly (``git apply --cached``, all or nothing), then with a 3-way merge. Where
that conflicts and a ledger is given, the ledger's resolutions are tried on the conflicted files as
git makes them in a work tree (a scratch folder holding only the patch's files, so their keys are
the ones a rebase stop records). Still conflicted, the patch is retried ignoring whitespace changes
(``--ignore-whitespace``, then a 3-way merge ignoring them), then ignoring line breaks (below): an
upstream reformat of the lines it touches is carried, marked ``whitespace``. A file the patch
needs that upstream renamed (deleted in the target's history, found again by git's copy detection
of its preimage blob) is patched at its new path. An overlay is added whole; it collides with a
file upstream already has. ``replay_in_index`` replays the whole series on one upstream commit; consecutive plain
patches go into one ``git apply --cached`` (``replay_run``: git applies each on the ones before, all or nothing),
each replayed alone as above where that refuses them.

Re-wrapped context (``rewrapped``: lines upstream joined or split, as black joins a call onto one line or splits one
over several): each hunk is found in upstream's file by its preimage with every whitespace character left out, line
breaks too, and a comma before a closing bracket (the trailing comma black adds when it splits a call and drops when
it joins one). The hunk's context may start or end inside a line upstream joined, but its change must begin and end
at line boundaries of upstream's file, and each line that starts at the same place in both must be indented the same
(a re-indented block is no re-wrap). The lines the hunk removes, as upstream wrapped them, are replaced by the lines
it adds, as the patch has them; upstream's wrapping of everything around them is kept. Where the text occurs more
than once, the place nearest the hunk's own line is taken. One hunk that does not fit fails the patch.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Literal

from unidiff import PatchedFile

from c128patch import exitcodes, procs
from c128patch.errors import C128Error
from c128patch.git import Git, ReadMemo, recalled, remembered
from c128patch.series.ledger import Ledger, Resolution
from c128patch.series.manifest import Series
from c128patch.series.patchfile import NULL_BLOB, PatchInfo, read_patch
from c128patch.series.paths import check_relpath
from c128patch.series.plan import (
    ENTRY_TRAILER,
    LazyIndex,
    Planned,
    blob_id,
    check_paths_at,
    index_git,
    merged_entries,
    plain_patch,
    plain_paths,
    plan,
    refuse_symlinks_at,
    write_blobs,
    written_blob,
)

Outcome = Literal["clean", "3way", "ledger", "whitespace", "conflict", "collision", "skipped"]
FAILED: tuple[Outcome, ...] = ("conflict", "collision")
Trees = dict[str, tuple[str, str]]  # entry -> (tree before it, tree after it)
_DROPPED = re.compile(r",(?=[)\]}])")  # a comma before a closing bracket (``rewrapped``)


@dataclass
class EntryCheck:
    name: str
    kind: str
    file: str
    status: Outcome
    detail: str = ""
    chosen_by: str = ""  # the rule that chose the file (series.plan)
    conflicts: list[str] = field(default_factory=list)  # files the 3-way merge leaves conflicted
    resolutions: list[Resolution] = field(default_factory=list)  # ledger rows that resolved them
    renamed: dict[str, str] = field(default_factory=dict)  # path in the patch -> where upstream moved it
    hints: list[str] = field(default_factory=list)  # "upstream may now handle this: <commit>" (ops.merged)

    @classmethod
    def of(cls, item: Planned, status: Outcome, detail: str = "", **more: object) -> EntryCheck:
        return cls(item.entry.name, item.entry.kind, item.label, status, detail, item.chosen_by,
                   **more)  # type: ignore[arg-type]


@dataclass
class Verdict:
    """What one verb would do on a rev (``ops.check.predict``): its exit code and the entry that stops it."""

    exit: int = exitcodes.OK
    entry: str = ""
    detail: str = ""


@dataclass
class RevCheck:
    rev: str
    commit: str
    ok: bool = True
    entries: list[EntryCheck] = field(default_factory=list)
    error: str = ""
    apply: Verdict = field(default_factory=Verdict)  # `check` fills these in (ops.check.predict)
    wheel: Verdict | None = None  # None: not a release, no wheel to patch
    note: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def unmerged_paths(git: Git) -> list[str]:
    return sorted({line.split("\t", 1)[1] for line in git.out("ls-files", "-u").splitlines()})


def staged(idx: Git, paths: list[str] | None = None) -> dict[str, tuple[str, str]]:
    """path -> (mode, blob) of ``paths`` (None: every path) in ``idx``'s index."""
    rows = idx.out("ls-files", "-s", *(["--", *paths] if paths is not None else [])).splitlines()
    return {r.split("\t", 1)[1]: (r.split()[0], r.split()[1]) for r in rows}


def stage(idx: Git, files: dict[str, tuple[str, str]], check: bool = True) -> bool:
    """Put ``files`` (path -> (mode, blob)) in ``idx``'s index; False: git refused one (``check=False``)."""
    return not files or idx.run("update-index", "--add", *[a for p, (mode, blob) in files.items()
                                                          for a in ("--cacheinfo", f"{mode},{blob},{p}")],
                                check=check).returncode == 0


def have_blobs(git: Git, blobs: Iterable[str]) -> bool:
    """Does the repository hold every one of ``blobs`` (the null blob aside)?"""
    return all(git.ok("cat-file", "-e", f"{b}^{{blob}}") for b in blobs if b != NULL_BLOB)


def scratch_git(git: Git, index_file: Path, folder: Path) -> Git:
    """``git`` on the index ``index_file`` with ``folder`` as its work tree (emptied first)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    git_dir = git.git_dir or Path(git.out("rev-parse", "--absolute-git-dir"))
    return Git(worktree=folder, git_dir=git_dir,
               env={**git.env, "GIT_INDEX_FILE": str(index_file), "GIT_WORK_TREE": str(folder)})


WS_MERGE = "a 3-way merge ignoring whitespace changes"
REWRAP = "its context lines upstream re-wrapped (joined or split) were matched ignoring line breaks"


def preimages(patch: PatchInfo) -> list[str]:
    """The blobs a 3-way merge of ``patch`` reads as its base (its ``index`` lines' preimages; none for a new file)."""
    return sorted({b for b, _ in patch.blobs.values() if b != NULL_BLOB})


def write_preimages(series: Series, git: Git, item: Planned) -> bool:
    """Write into ``git``'s objects the preimage blobs of ``item``'s patch (``preimages``) it lacks, made the one way
    they were: the entries of ``series`` before ``item``'s replayed on the commit its file was made on (its variant's
    ``commit``, else ``base``), in a scratch index. A layer entry made on v0.5.23 reads environ.py as our series leaves
    it there; that blob was in the release cache only once something had replayed the series on v0.5.23, so a 3-way
    merge on an older release applied or stopped by what the cache held. True: ``git`` holds them all now."""
    if item.patch is None or item.variant is None:
        return True
    wanted = preimages(item.patch)
    if have_blobs(git, wanted):
        return True
    names = [e.name for e in series.entries]
    if item.entry.name not in names:
        return False
    variant = item.variant

    def write() -> bool:
        base = (variant.commit and git.rev_parse(variant.commit)) or git.rev_parse(variant.base)
        if not base:
            return False
        earlier = series.without(set(names[names.index(item.entry.name):]))
        if earlier.entries:
            with procs.scratch("c128pre-") as tmp:  # (its blobs stay in git's objects)
                replay_in_index(earlier, git, variant.base, base, Path(tmp) / "index")
        return have_blobs(git, wanted)

    key = (str(git.git_dir or git.worktree), series.digest(), item.entry.name, str(item.path),
           blob_id(item.path.read_bytes()))
    if key in _UNMADE:  # (a replay that could not make them is not tried again by this process)
        return False
    made = remembered(git, ("preimages", *key), write)
    if not made:
        _UNMADE.add(key)
    return made


_UNMADE: set[tuple] = set()


def replay_patch(git: Git, item: Planned, index_file: Path, *, ledger: Ledger | None = None,
                 span: str = "", renamed: dict[str, str] | None = None, series: Series | None = None) -> EntryCheck:
    """``item`` on the index (module docstring); a failure leaves the index as it was before the entry. ``series``
    (the one ``item`` is of): its preimages written before a 3-way merge (``write_preimages``), so the merge's
    outcome is the same whatever ``git`` held."""
    assert item.patch is not None
    idx = index_git(git, index_file)
    row = EntryCheck.of(item, "clean", renamed=dict(renamed or {}))
    patch, needs, info = item.path, item.patch.needs, item.patch
    if renamed:
        patch = index_file.parent / f"renamed-{item.entry.name}.patch"
        patch.write_text(renamed_patch_text(item.path.read_text(), renamed))
        needs, info = [renamed.get(p, p) for p in needs], read_patch(patch)
    strict = idx.run("apply", "--cached", str(patch), check=False)  # all or nothing: a failure changes no entry
    if strict.returncode == 0:
        return row
    saved = index_file.read_bytes()
    if series is not None:
        write_preimages(series, git, item)
    three = idx.run("apply", "--cached", "--3way", str(patch), check=False)
    if three.returncode == 0:
        row.status, row.detail = "3way", "applies only with a 3-way merge"
        return row
    row.conflicts = unmerged_paths(idx)
    if row.conflicts and ledger is not None and ledger.has(item.entry.name):
        index_file.write_bytes(saved)  # redone in a scratch tree of its files: conflict keys as a rebase stop has them
        sgit = scratch_git(git, index_file, index_file.parent / "scratch")
        there = sgit.out("ls-files", "--", *needs).splitlines() if needs else []
        if there:
            sgit.run("checkout-index", "-u", "--", *there)
        sgit.run("apply", "--3way", str(patch), check=False)
        row.resolutions = ledger.replay(sgit, item.entry.name, Ledger.conflicts(sgit, unmerged_paths(sgit)), span)
        row.conflicts = unmerged_paths(sgit)
        if not row.conflicts:
            row.status = "ledger"
            row.detail = "3-way conflicts resolved by the ledger: " + "; ".join(r.describe() for r in row.resolutions)
            return row
    loose = (("applies only ignoring whitespace changes upstream made",
              lambda: idx.ok("apply", "--cached", "--ignore-whitespace", str(patch))),
             (f"{WS_MERGE} merges it", lambda: whitespace_merge(git, info, index_file, patch)),
             (REWRAP, lambda: rewrap_merge(git, info, index_file)))
    for detail, merged in loose:  # an upstream reformat of the lines it touches is carried
        index_file.write_bytes(saved)
        if merged():
            row.status, row.detail = "whitespace", f"whitespace-merged: {detail}"
            row.conflicts, row.resolutions = [], []
            return row
    index_file.write_bytes(saved)  # later entries are replayed on top of the rest
    row.status = "conflict"
    lines = [line for line in (three.stderr.strip() or strict.stderr).splitlines() if line.strip()]
    found = [line for line in lines if "patch failed:" in line or "does not exist" in line or "already exists" in line]
    row.detail = (found or lines or ["error: "])[0 if found else -1].removeprefix("error: ").strip()
    if row.conflicts:
        row.detail = f"3-way merge conflicts in {', '.join(row.conflicts)}" + (
            " (the ledger resolved only " + ", ".join(r.path for r in row.resolutions) + ")" if row.resolutions else "")
    return row


def whitespace_merge(git: Git, info: PatchInfo, index_file: Path, patch: Path) -> bool:
    """``merge-recursive --ignore-space-change`` of preimage, patch and index, in a scratch tree; True: merged."""
    pre = info.blobs
    if len(pre) != len(info.files) or not have_blobs(git, (b for b, _ in pre.values())):
        return False
    folder = index_file.parent / "ws-merge"
    shutil.rmtree(folder, ignore_errors=True)

    def trees() -> tuple[str, str] | None:  # the preimage, and the patch applied to it
        base = index_git(git, folder / "base.index")  # none yet: empty
        stage(base, {path: ("100644", blob) for path, (blob, _) in pre.items() if blob != NULL_BLOB})
        before = base.out("write-tree")
        return (before, base.out("write-tree")) if base.ok("apply", "--cached", str(patch)) else None

    sgit = scratch_git(git, folder / "theirs.index", folder / "tree")  # a new index: empty
    made = remembered(git, ("ws-merge trees", str(patch), blob_id(patch.read_bytes())), trees)
    if made is None:
        return False
    idx = index_git(git, index_file)
    stage(sgit, staged(idx, info.files))
    theirs = sgit.out("write-tree")
    sgit.run("checkout-index", "--all", "--force", "-u")
    if not sgit.ok("merge-recursive", "--ignore-space-change", "--no-renames", made[0], "--", theirs, made[1]):
        return False
    merged = staged(sgit)
    gone = [p for p in info.files if p not in merged]
    if gone:
        idx.run("update-index", "--force-remove", "--", *gone)
    return stage(idx, merged, check=False)  # (the caller restores the index where it fails)


def rewrap_merge(git: Git, info: PatchInfo, index_file: Path) -> bool:
    """``info``'s hunks placed ignoring line breaks (``rewrapped``); False leaves the index as it was."""
    files = list(info.patchset)
    if not files or any(pf.is_added_file or pf.is_removed_file or pf.is_binary_file or pf.is_rename
                        or pf.source_file[2:] != pf.target_file[2:] for pf in files):
        return False
    idx = index_git(git, index_file)
    out = {}
    for pf in files:
        listed = staged(idx, [pf.path]).get(pf.path)
        try:
            new = rewrapped(git.run("cat-file", "blob", listed[1], binary=True).stdout.decode(), pf) if listed else None
        except UnicodeDecodeError:
            return False
        if listed is None or new is None:
            return False
        out[pf.path] = (listed[0], new)
    stage(idx, {path: (mode, git.run("hash-object", "-w", "--stdin", input=new.encode(), binary=True).stdout.decode()
                       .strip()) for path, (mode, new) in out.items()})
    return True


def _stream(lines: list[str]) -> tuple[str, list[int]]:
    """The lines' text without whitespace (a blank line: one mark) and each line's offset in it, then the end."""
    parts = ["".join(line.split()) or "\n" for line in lines]
    text = "".join(parts)
    cut = [m.start() for m in _DROPPED.finditer(text)]  # a comma before a closing bracket
    starts, at, k = [], 0, 0
    for part in [*parts, ""]:
        while k < len(cut) and cut[k] < at:
            k += 1
        starts.append(at - k)
        at += len(part)
    return _DROPPED.sub("", text), starts


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _place(lines: list[str], pre: list[str], cut: tuple[int, int], near: int) -> tuple[int, int] | None:
    """The lines (first, end) of ``lines`` that ``pre[cut[0]:cut[1]]`` covers, the nearest to line ``near``."""
    text, starts = _stream(lines)
    ptext, pstarts = _stream(pre)
    line_at: dict[int, list[int]] = {}
    for i, offset in enumerate(starts):
        line_at.setdefault(offset, []).append(i)
    tries = [(ptext, pstarts)]
    if ptext.endswith(","):  # its last line's comma, which a closing bracket after the hunk drops upstream
        tries.append((ptext[:-1], [min(o, len(ptext) - 1) for o in pstarts]))
    found = []
    for ptext, pstarts in tries:
        q = text.find(ptext) if ptext else -1
        while q >= 0:
            first, end = line_at.get(q + pstarts[cut[0]], []), line_at.get(q + pstarts[cut[1]], [])
            aligned = all(_indent(lines[line_at[q + pstarts[k]][0]]) == _indent(pre[k]) for k in range(len(pre))
                          if pre[k].strip() and line_at.get(q + pstarts[k], [len(lines)])[0] < len(lines))
            if len(first) == 1 and len(end) == 1 and aligned:
                found.append((first[0], end[0]))
            q = text.find(ptext, q + 1)
    return min(found, key=lambda f: abs(f[0] - near)) if found else None


def rewrapped(text: str, pf: PatchedFile) -> str | None:
    """``text`` with the hunks of ``pf`` placed as the module says; None when one does not fit."""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        return None
    shift = 0
    for hunk in pf:
        kinds = [line.line_type for line in hunk]
        if "\\" in kinds or not any(k in "+-" for k in kinds):
            return None
        first = next(i for i, k in enumerate(kinds) if k in "+-")
        last = max(i for i, k in enumerate(kinds) if k in "+-")
        pre = [line.value for line in hunk if not line.is_added]
        lead = sum(1 for k in kinds[:first] if k == " ")
        middle = list(hunk)[first: last + 1]
        removed = sum(1 for line in middle if not line.is_added)
        place = _place(lines, pre, (lead, lead + removed), hunk.source_start - 1 + lead + shift)
        if place is None:
            return None
        start, end = place
        added = [line.value for line in middle if not line.is_removed]
        lines[start:end] = added
        shift = start + len(added) - (hunk.source_start - 1 + lead + removed)
    return "".join(lines)


def renamed_patch_text(text: str, renamed: dict[str, str]) -> str:
    """``text`` (a git patch) with the paths of ``renamed`` changed in its file headers only."""
    olds = "|".join(re.escape(old) for old in renamed)
    text = re.sub(rf"^diff --git a/({olds}) b/\1$", lambda m: f"diff --git a/{renamed[m[1]]} b/{renamed[m[1]]}", text,
                  flags=re.M)
    return re.sub(rf"^(--- a/|\+\+\+ b/)({olds})$", lambda m: m[1] + renamed[m[2]], text, flags=re.M)


def follow_renames(git: Git, item: Planned, index_file: Path, missing: list[str], at: str,
                   lazy: LazyIndex | None = None) -> dict[str, str]:
    """Where upstream (deleted in ``at``'s history) moved each of ``missing``, by copy detection; {} unless all."""
    assert item.patch is not None
    pre = {p: item.patch.blobs[p][0] for p in missing if p in item.patch.blobs}
    if not at or len(pre) != len(missing) or not have_blobs(git, pre.values()) or \
            not all(git.out("log", "-1", "--format=%H", "--diff-filter=D", at, "--", p) for p in pre):
        return {}
    tree = (lazy.flush() if lazy is not None else index_git(git, index_file)).out("write-tree")
    probe = index_git(git, index_file.parent / "renames.index")
    probe.run("read-tree", tree)
    stage(probe, {p: ("100644", b) for p, b in pre.items()})
    fields = git.out("diff-tree", "-r", "-z", "--find-copies-harder", "-C70%", "--diff-filter=C", tree,
                     probe.out("write-tree")).split("\0")
    found = {fields[i + 2]: fields[i + 1] for i, meta in enumerate(fields)
             if meta.startswith(":") and meta.split()[-1].startswith("C") and i + 2 < len(fields)
             and fields[i + 2] in pre and fields[i + 1] not in pre and _followable(fields[i + 1])}
    return found if len(found) == len(missing) else {}


def _followable(path: str) -> bool:
    """A path upstream moved a file to that a patch may name: ``check_relpath``'s rules (a newline in it wrote lines
    of its own into the renamed patch; a byte that is not UTF-8 no manifest can hold)."""
    try:
        return bool(check_relpath(path, "a path upstream moved a file to"))
    except C128Error:
        return False


def replay_patch_shared(git: Git, item: Planned, index_file: Path, lazy: LazyIndex,
                        series: Series | None = None) -> EntryCheck:
    """``replay_patch`` on the index in memory, its outcome shared by every rev whose index holds the same there."""
    assert item.patch is not None
    paths = item.patch.paths
    found = tuple(have_blobs(git, [b]) for b, _ in item.patch.blobs.values() if b != NULL_BLOB)

    def replay() -> tuple:
        probed = recalled(git, ("probe apply", *key[1:]))  # the plan's probe applied it strictly on the same paths
        if probed is not None and probed["strict"] and probed["after"] is not None:
            return "clean", "", [], probed, False
        lazy.flush(paths)
        row = replay_patch(git, item, index_file, series=series)
        record: dict = {"after": None}
        if row.status not in FAILED:  # a failure leaves the index as it was
            lazy.changed(paths, record)
        return row.status, row.detail, list(row.conflicts), record, row.status in FAILED

    key = ("replay", str(item.path), blob_id(item.path.read_bytes()), lazy.key(paths), found)
    outcome = remembered(git, key, replay)
    if not outcome[4] and outcome[3]["after"] is None and lazy.stale.isdisjoint(paths):
        outcome = replay()  # another rev replays it now and has not read the result back yet
    status, detail, conflicts, record, failed = outcome
    if not failed and record["after"] is not None:
        for path, entries in record["after"].items():
            lazy.set(path, entries)
    return EntryCheck.of(item, status, detail, conflicts=list(conflicts))


def replay_entry(git: Git, item: Planned, index_file: Path, present: set[str], *, ledger: Ledger | None = None,
                 span: str = "", at: str = "", lazy: LazyIndex | None = None,
                 series: Series | None = None) -> EntryCheck:
    """One entry on the index; ``present``: a superset of its paths (kept up to date); ``at``: its upstream commit;
    ``series``: the one it is of (``replay_patch``)."""
    missing = [f for f in item.patch.needs if f not in present] if item.patch is not None else []
    if missing and series is not None:  # renames are found by the preimages' content
        write_preimages(series, git, item)
    renamed = follow_renames(git, item, index_file, missing, at, lazy) if missing else {}
    if missing and not renamed:  # not even a 3-way merge can patch a file that is not there
        row = EntryCheck.of(item, "conflict", f"{missing[0]}: does not exist", conflicts=missing[:1])
    elif item.patch is not None:
        if lazy is not None and not renamed and plain_patch(item.patch):
            row = replay_patch_shared(git, item, index_file, lazy, series)
        else:
            if lazy is not None:
                lazy.flush()
            row = replay_patch(git, item, index_file, ledger=ledger, span=span, renamed=renamed, series=series)
            if lazy is not None:
                lazy.changed([renamed.get(p, p) for p in item.patch.paths])
        if renamed:
            moved = "; ".join(f"{a} -> {b}" for a, b in renamed.items())
            row.detail = "; ".join(filter(None, [f"followed upstream's rename {moved}", row.detail]))
            present.update(renamed.values())
    else:  # an overlay, added whole: it collides with a file (or folder) the index holds
        idx, target, row = index_git(git, index_file), item.entry.target, EntryCheck.of(item, "clean")
        may_hold = target in present or any(p.startswith(target + "/") for p in present)
        if may_hold and (lazy.holds(target) if lazy is not None else idx.out("ls-files", "--", target)):
            row.status, row.detail = "collision", f"{target} already exists"
        elif lazy is not None:
            lazy.set(target, (("100644", written_blob(idx, item.path), "0"),))
        else:
            stage(idx, {target: ("100644", written_blob(idx, item.path))})
    present.update(item.touched)
    return row


def _run_from(items: list[Planned | None], present: set[str], known: Trees | None) -> list[Planned]:
    """The entries from ``items[0]`` that ``replay_run`` may take together: plain patches whose files are there (no
    rename to follow); with ``known``, each with its trees there and no path of an earlier one."""
    run: list[Planned] = []
    seen, here = set(), set(present)
    for item in items:
        patch = item.patch if item is not None else None
        if item is None or patch is None or not plain_patch(patch) or not plain_paths(patch.paths) or \
                any(p not in here for p in patch.needs) or \
                known is not None and (item.entry.name not in known or not seen.isdisjoint(patch.paths)):
            break
        run.append(item)
        seen.update(patch.paths)
        here.update(item.touched)
    return run


def _raw_lines(text: str) -> dict[tuple[str, ...], dict[str, str]]:
    """path -> raw line of each tree pair ``diff-tree --stdin`` printed (``()``: lines before any pair)."""
    out: dict[tuple[str, ...], dict[str, str]] = {(): {}}
    pair: tuple[str, ...] = ()
    for line in text.splitlines():
        if line.startswith(":"):
            out.setdefault(pair, {})[line.split("\t", 1)[-1]] = line
        else:
            pair = tuple(line.split())
    return out


def replay_run(git: Git, run: list[Planned], index_file: Path, tree: str,
               known: Trees | None) -> list[tuple[str, str]] | None:
    """``run``'s patches by one ``git apply --cached`` (it applies each file on the ones before, all or nothing: each
    as ``replay_patch`` applies it strictly). With ``known``, each entry's (before, after) from it, where the first
    starts at ``tree`` (the index's before the run), each the one before's after, and its diff is the entry's own
    change in the index, which changes no path but the run's: each a tree the replay would write. None: not so,
    the index as it was. (Two calls for the run, not two per entry.)"""
    idx = index_git(git, index_file)
    saved = index_file.read_bytes()
    if idx.ok("apply", "--cached", *(str(item.path) for item in run)):
        if known is None:
            return [("", "")] * len(run)
        pairs = [known[item.entry.name] for item in run]
        owner = {p: item.entry.name for item in run for p in item.patch.paths}  # type: ignore[union-attr]
        made = _raw_lines(idx.out("diff-index", "--cached", "-r", "--no-renames", tree))[()]
        said = git.run("diff-tree", "--stdin", "-r", "--no-renames", input="".join(f"{b} {a}\n" for b, a in pairs),
                       check=False)
        if said.returncode == 0 and set(made) <= set(owner):
            told, before = _raw_lines(said.stdout), tree
            for item, (b, a) in zip(run, pairs):
                mine = {p: line for p, line in made.items() if owner[p] == item.entry.name}
                if b != before or told.get((b, a), {}) != mine:
                    break
                before = a
            else:
                return pairs
    index_file.write_bytes(saved)
    return None


def _item_paths(item: Planned) -> list[str]:
    return item.patch.paths if item.patch is not None else [item.entry.target]


def shared_later(items: list[Planned]) -> set[str]:
    """The entries of ``items`` (in order) a path of which a later one touches too (``own_pairs``' anchors)."""
    seen: set[str] = set()
    out = set()
    for item in reversed(items):
        if not seen.isdisjoint(_item_paths(item)):
            out.add(item.entry.name)
        seen.update(_item_paths(item))
    return out


def own_pairs(git: Git, planned: list[Planned], rows: list[EntryCheck], base_tree: str, final: str,
              known: Trees, anchors: dict[str, str]) -> Trees | None:
    """``known`` (a branch's entry trees) as a replay's own tree before and after each entry, with no ``write-tree``
    per entry (``replay_in_index(trees=...)``): where each entry ``rows`` replayed (none failed, none following a
    rename; skipped ones aside) has its pair there and plain paths, the pairs chain from ``base_tree`` to the replay's
    ``final`` tree, each pair changes no path but its entry's own (one ``diff-tree --stdin``), and the pair of each
    entry a path of which a later one touches too ends at the tree the replay wrote after it (``anchors``,
    ``replay_in_index(anchors=...)``). A replayed entry changes its own paths only: on a path the entry touches last,
    the final tree holds what it left, in the replay and in the pairs alike; the other entries are anchored. So each
    pair is the replay's tree before and after its entry. None: not so (the caller writes each tree)."""
    by_name = {p.entry.name: p for p in planned}
    replayed = [r for r in rows if r.status != "skipped"]
    if not replayed or any(r.status in FAILED or r.renamed or r.name not in known or r.name not in by_name
                           for r in replayed):
        return None
    items = [by_name[r.name] for r in replayed]
    if not all(plain_paths(_item_paths(item)) for item in items) or \
            any(anchors.get(name) != known[name][1] for name in shared_later(items)):
        return None
    pairs = [known[r.name] for r in replayed]
    if [b for b, _ in pairs] != [base_tree, *(a for _, a in pairs[:-1])] or pairs[-1][1] != final:
        return None
    said = git.run("diff-tree", "--stdin", "-r", "--no-renames", input="".join(f"{b} {a}\n" for b, a in pairs),
                   check=False)
    told = _raw_lines(said.stdout) if said.returncode == 0 else None
    if told is None or any(p not in _item_paths(item) for item, pair in zip(items, pairs) for p in told.get(pair, {})):
        return None
    return {r.name: known[r.name] for r in replayed}


def _to_anchor(run: list[Planned], anchored: set[str]) -> list[Planned]:
    """``run`` up to its first anchor (whose tree is written after it: ``replay_in_index(anchors=...)``)."""
    cut = next((i for i, item in enumerate(run) if item.entry.name in anchored), None)
    return run if cut is None else run[:cut + 1]


def _anchor(idx: Git, anchors: dict[str, str] | None, anchored: set[str], name: str) -> None:
    """The index's tree after entry ``name`` into ``anchors``, where it is an anchor."""
    if anchors is not None and name in anchored:
        anchors[name] = idx.out("write-tree")


def replay_in_index(series: Series, git: Git, rev: str, commit: str, index_file: Path, *,
                    ledger: Ledger | None = None, span: str = "",
                    trees: Trees | None = None, keep_index: bool = True, planned: list[Planned] | None = None,
                    known: Trees | None = None,
                    anchors: dict[str, str] | None = None) -> tuple[RevCheck, list[Planned]]:
    """The series on ``commit``; ``trees``: filled with entry -> (before, after); ``keep_index=False``: lazy;
    ``planned``: the series' ``plan`` on ``commit``, made already; ``known``: trees a caller holds (a branch's), taken
    into ``trees`` where ``replay_run`` finds them the replay's own; ``anchors``: filled with entry -> the tree after
    it, for each entry a path of which a later one touches too (``shared_later``; ``own_pairs``)."""
    result = RevCheck(rev, commit)
    try:
        planned = plan(series, git, commit) if planned is None else planned
        present = check_paths_at(git, commit, [p for p in planned if p.patch is not None])
        overlays = [p for p in planned if p.patch is None]
        # an overlay through an upstream symlink: apply refuses it, check said "applies" (helper 185); one ls-tree
        kinds = refuse_symlinks_at(git, commit, overlays)
        present |= {t for t in (p.entry.target for p in overlays) if kinds.get(t, "040000") != "040000"}
        merged = {e.name: e for e in merged_entries(series, git, commit)}
    except C128Error as exc:
        result.ok, result.error = False, exc.message
        return result, []
    idx = index_git(git, index_file)
    touched = sorted({p for item in planned for p in (item.patch.paths if item.patch else item.touched)})
    lazy = None
    if isinstance(git, ReadMemo) and not keep_index and ledger is None and trees is None and plain_paths(touched):
        lazy = LazyIndex(git, idx, commit, touched)
    else:
        idx.run("read-tree", commit)
        write_blobs(idx, [p.path for p in planned if p.patch is None])  # the overlays' blobs, in one call
    tree = idx.out("write-tree") if trees is not None else ""
    by_name = {p.entry.name: p for p in planned}
    todo, alone = list(series.entries), 0  # alone: entries left of a run replay_run did not take
    wanted = None if trees is None else known or {}
    anchored = set() if anchors is None else shared_later([by_name[e.name] for e in todo if e.name in by_name])
    while todo:
        entry = todo.pop(0)
        if entry.name in merged:
            result.entries.append(EntryCheck(entry.name, entry.kind, "", "skipped",
                                             f"merged upstream in {entry.merged_in[:12]}"))
            continue
        run = [] if lazy is not None or alone else _run_from([by_name.get(e.name) for e in [entry, *todo]], present,
                                                              wanted)
        run = _to_anchor(run, anchored)
        pairs = replay_run(git, run, index_file, tree, wanted) if len(run) > 1 else None
        if pairs is not None:  # each entry applied strictly, as one by one
            del todo[:len(run) - 1]
            for item, pair in zip(run, pairs):
                result.entries.append(EntryCheck.of(item, "clean"))
                present.update(item.touched)
                if trees is not None:
                    trees[item.entry.name], tree = pair, pair[1]
            _anchor(idx, anchors, anchored, run[-1].entry.name)
            continue
        alone = max(alone - 1, len(run) - 1, 0)
        row = replay_entry(git, by_name[entry.name], index_file, present, ledger=ledger, span=span, at=commit,
                           lazy=lazy, series=series)
        result.entries.append(row)
        if row.status in FAILED:
            result.ok = False
        elif trees is not None:
            after = idx.out("write-tree")
            trees[entry.name], tree = (tree, after), after
        else:
            _anchor(idx, anchors, anchored, entry.name)
    if lazy is not None and lazy.waiting:
        lazy.reread()  # the replays' results, for the revs after this one
    return result, planned


@dataclass(frozen=True)
class BranchCommit:
    """One commit of a patched branch on top of its upstream base."""

    sha: str
    entry: str  # its C128patch-Entry trailer ("" without one; "provenance" for the provenance commit)
    subject: str
    tree: str = ""
    parent: str = ""  # its first parent


def branch_commits(git: Git, base: str, head: str = "HEAD") -> list[BranchCommit]:
    """The commits of ``base..head``, oldest first (provenance commits included, as ``entry`` says)."""
    fmt = f"%H%x00%T%x00%P%x00%(trailers:key={ENTRY_TRAILER},valueonly,unfold,separator=%x20)%x00%s"
    out = []
    for line in git.lines("log", "--reverse", f"--format={fmt}", f"{base}..{head}"):
        sha, tree, parents, name, subject = line.split("\0")
        out.append(BranchCommit(sha, name.strip(), subject, tree, parents.split(" ")[0]))
    return out
