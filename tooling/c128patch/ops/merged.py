"""Is an entry already upstream? Content decides; a PR number in a subject is only a hint.

Signals for one entry on a new base (the earlier entries replayed on it): ``reverse-apply`` (the
chosen file reverse-applies there); ``patch-id`` (one upstream commit of the range makes the same
change to every file the entry's old commit changes: per-file ``git patch-id --stable`` of
``--unified=0`` diffs, each upstream commit diffed once for every entry and for the hints below);
``became-empty`` (the replay changes nothing); ``overlay-identical``
(the target exists upstream with our content); ``pr-hint`` (a subject names a PR of the entry's
``upstream``: never enough alone, a drop is proposed only with a content signal).

Hints (``upstream_hints``) are never evidence: lines for the stop, ``check`` and ``watch`` naming upstream commits
of ``old..onto`` that may now do what an entry does: a commit whose message names a PR of the entry's ``upstream`` or
``drop_when``, or that changes a function one of the entry's hunks edits (git's hunk header) in a file the entry
patches, with a name the entry's removed lines use (``extend_len`` for an ``extend_len == 0`` guard), where the
range's net change does so too (a change upstream made and took back is no hint; one diff finds the ranges worth
reading commit by commit; each file's net change is diffed once per pair of contents, however many revs share it).

Cost: a commit is diffed only where it could matter: for ``patch-id``, if it changes every file of one of our
commits; for the hints, if the net change qualifies. Which files a commit changes comes from one log that reads no
file contents.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Callable, Collection, Literal, Sequence

from unidiff import PatchSet, UnidiffParseError
from unidiff.patch import Line

from c128patch.git import DIFF_HEADER, Git, blob_id, header_path, unquote
from c128patch.ops.replay import staged
from c128patch.series.manifest import Entry, Series
from c128patch.series.patchfile import NULL_BLOB, PatchInfo
from c128patch.series.plan import Planned

SignalKind = Literal["reverse-apply", "patch-id", "became-empty", "overlay-identical", "pr-hint"]
CONTENT: tuple[SignalKind, ...] = ("reverse-apply", "patch-id", "became-empty", "overlay-identical")
_PR = re.compile(r"#(\d+)")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{3,}")
_COMMON = {"const", "auto", "return", "static_cast", "uint32_t", "int32_t", "int64_t", "size_t", "self", "None",
           "True", "False", "else", "elif", "import", "from", "static", "inline", "void", "bool", "float", "double",
           "RuntimeCheck", "assert", "print", "range", "irange", "std", "this", "pass", "with", "lambda"}


@dataclass(frozen=True)
class Signal:
    kind: SignalKind
    detail: str
    commit: str = ""  # the upstream commit it points at, when it points at one

    def describe(self) -> str:
        return f"{self.kind}: {self.detail}"


def proposes_drop(signals: list[Signal]) -> bool:
    return any(s.kind in CONTENT for s in signals)


def per_commit_file_ids(git: Git, diffs: dict[str, str]) -> dict[str, dict[str, str]]:
    """commit -> path -> ``git patch-id --stable`` of that file's part of its diff, in one git call."""
    chunks, where = [], []
    for commit, diff in diffs.items():
        starts = [m.start() for m in DIFF_HEADER.finditer(diff)]
        for start, end in zip(starts, [*starts[1:], len(diff)]):
            part = diff[start:end]
            where.append((commit, header_path(DIFF_HEADER.match(part))))  # type: ignore[arg-type]
            chunks.append(f"commit {len(chunks):040x}\n{part}")
    out: dict[str, dict[str, str]] = {commit: {} for commit in diffs}
    if chunks:
        for line in git.run("patch-id", "--stable", input="".join(chunks)).stdout.splitlines():
            pid, fake = line.split()
            commit, path = where[int(fake, 16)]
            out[commit][path] = pid
    return out


def entry_making(git: Git, series: Series, sha: str, names: Collection[str] | None = None) -> str:
    """The entry of ``series`` (of ``names`` only, where given) one of whose patch files makes the change commit
    ``sha`` makes (``git patch-id --stable``: context, line numbers and whitespace aside), else "": a commit of the
    user's that is an entry already (``layer add-entry`` run twice; a layer's entry committed by hand)."""
    return entries_making(git, series, [sha], names).get(sha, "")


def entries_making(git: Git, series: Series, commits: Sequence[str],
                   names: Collection[str] | None = None) -> dict[str, str]:
    """``entry_making`` for many commits in two git calls: commit -> its entry, for those that make one."""
    files = [(e.name, series.file_of(e, v)) for e in series.entries if e.is_patch
             and (names is None or e.name in names) for v in e.patch_files()]
    diffs = [(i, path.read_text(errors="replace").partition("\ndiff --git ")[2])
             for i, (_, path) in enumerate(files) if path.is_file()]
    if not commits or not any(diff for _, diff in diffs):
        return {}
    # one git call for all files: each under a made-up commit id, its index in ``files``
    theirs = git.run("patch-id", "--stable",
                     input="".join(f"commit {i:040x}\ndiff --git {diff}" for i, diff in diffs if diff)).stdout
    entry = {pid: files[int(fake, 16)][0] for pid, fake in reversed([line.split() for line in theirs.splitlines()])}
    mine = git.run("patch-id", "--stable", input=git.out("show", "--format=commit %H", "--full-index", *commits)).stdout
    return {commit: entry[pid] for pid, commit in (line.split() for line in mine.splitlines()) if pid in entry}


def commit_diffs(git: Git, commits: list[str], *args: str, paths: Sequence[str] = ()) -> dict[str, str]:
    """commit -> its diff (``git log -p ARGS``, of ``paths`` only where given), for many commits in one git call."""
    argv = ["log", "--no-walk=unsorted", "-p", "--text", "--format=%x00%H", *args, *commits, "--", *paths]
    text = git.run(*argv).stdout if commits else ""
    return {c: "" for c in commits} | dict(part.partition("\n")[::2] for part in text.split("\0")[1:])


def _file_ids(git: Git, commits: list[str]) -> dict[str, dict[str, str]]:
    """commit -> path -> per-file patch-id (``--unified=0``: context and line numbers do not count), in 2 git calls."""
    return per_commit_file_ids(git, commit_diffs(git, commits, "--unified=0", "--no-renames", "--full-index"))


class MergedCheck:
    """The signals for the entries of one rebase range ``old..onto``; ``cache``: ``upstream_hints``' searches (the
    range's diffs of ``paths`` are read once for both), ``paths``: the files the entries touch."""

    def __init__(self, git: Git, old: str, onto: str, old_commits: list[str], cache: dict[str, str],
                 paths: Sequence[str]) -> None:
        self.git, self.old, self.onto, self.cache, self.paths = git, old, onto, cache, paths
        self._old_commits = [c for c in old_commits if c]
        self._ours: dict[str, dict[str, str]] | None = None
        self._ids: dict[str, dict[str, str]] = {}  # range commit -> path -> per-file patch-id
        self._every: list[str] = []
        self._hints: dict[str, list[Signal]] = {}

    def signals(self, item: Planned, old_commit: str, idx: Git, present: set[str]) -> list[Signal]:
        """Signals for ``item`` on ``idx`` (the new base and the earlier entries); on its preimage: hints only."""
        out = [s for number in _PR.findall(item.entry.upstream) for s in self._pr_hint(number)]
        if item.patch is None:
            target = item.entry.target  # ``present``: a superset of ``idx``'s paths the entries touch
            listed = staged(idx, [target]).get(target) if target in present else None
            if listed and listed[1] == blob_id(item.path.read_bytes()):
                out.append(Signal("overlay-identical", f"{item.entry.target} exists upstream with our content"))
            return out
        pre = item.patch.blobs  # the index holds every blob the patch was made on: nothing to look for
        listed = staged(idx, list(pre)) if pre and len(pre) == len(item.patch.files) else None
        if listed is not None and all(listed.get(path, ("", NULL_BLOB))[1] == blob for path, (blob, _) in pre.items()):
            return out
        if idx.ok("apply", "--cached", "--check", "-R", str(item.path)):
            out.append(Signal("reverse-apply", f"{item.label} reverse-applies on the new base"))
        if old_commit:
            out += self._patch_id(old_commit)
        return out

    def _pr_hint(self, number: str) -> list[Signal]:
        if number not in self._hints:
            hit = self.git.named("log", "--format=%H %s", "-E", f"--grep=\\(#{number}\\)", f"{self.old}..{self.onto}")
            sha, _, subject = hit.split("\n")[0].partition(" ")
            self._hints[number] = [Signal("pr-hint", f"upstream commit {sha[:12]} {subject!r} names PR #{number}",
                                          sha)] if sha else []
        return self._hints[number]

    def _patch_id(self, old_commit: str) -> list[Signal]:
        span = f"{self.old}..{self.onto}"
        if self._ours is None:
            self._ours = _file_ids(self.git, self._old_commits)
            self._every = sorted({path for ids in self._ours.values() for path in ids} | set(self.paths))
            self._read(span, [set(ids) for ids in self._ours.values() if ids])
        ours = self._ours.get(old_commit) or _file_ids(self.git, [old_commit])[old_commit]
        if not ours:
            return []
        for sha in reversed(self._read(span, [set(ours)])):  # newest first
            if all(self._ids[sha].get(path) == pid for path, pid in ours.items()):
                paths = ", ".join(sorted(ours))
                return [Signal("patch-id", f"upstream commit {sha[:12]} makes the same change to {paths}", sha)]
        return []

    def _read(self, span: str, wanted: list[set[str]]) -> list[str]:
        """The commits of ``span`` changing every file of one of ``wanted``, in order, their per-file ids read."""
        if not self._every:
            return []
        touching = _touching(self.git, self.cache, span, self._every)
        shas = [sha for sha, (_, files) in touching.items() if any(want <= files for want in wanted)]
        if missing := [sha for sha in shas if sha not in self._ids]:
            diffs = _diffs(self.git, self.cache, missing, self._every)
            self._ids.update(per_commit_file_ids(self.git, {sha: diffs[sha] for sha in missing}))
        return shas


@dataclass(frozen=True)
class Hint:
    commit: str
    subject: str
    why: str

    def line(self) -> str:
        return f"upstream may now handle this: {self.commit[:12]} {self.subject!r} ({self.why})"

    def to_json(self) -> dict:
        return {"commit": self.commit, "subject": self.subject, "why": self.why, "line": self.line()}


def _names(lines: list[str]) -> set[str]:
    return {n for line in lines for n in _NAME.findall(line) if n not in _COMMON}


def _hunk_names(files: PatchSet, kept: Callable[[Line], bool]) -> list[tuple[str, str, frozenset[str]]]:
    """(path, function header, the names its ``kept`` lines use) of each hunk of ``files``."""
    return [(pf.path, hunk.section_header.strip(), frozenset(_names([line.value for line in hunk if kept(line)])))
            for pf in files for hunk in pf]


def _cached(git: Git, cache: dict[str, str], key: str, *args: str) -> str:
    """``git args``' output, once per ``key`` (entries share one search of the range)."""
    if key not in cache:
        cache[key] = git.run(*args, check=False).stdout
    return cache[key]


def _touching(git: Git, cache: dict[str, str], span: str, paths: list[str]) -> dict[str, tuple[str, frozenset[str]]]:
    """sha -> (subject, the files of ``paths`` it changes) of each commit of ``span`` changing one, in order."""
    log = _cached(git, cache, f"{span}:names:" + ",".join(paths), "log", "--reverse", "--no-renames",
                  "--format=%x00%H%x00%s", "--name-only", span, "--", *paths)
    parts = log.split("\0")[1:]
    return {sha: (subject, frozenset(map(unquote, filter(None, names.split("\n")))))
            for sha, (subject, _, names) in zip(parts[::2], (part.partition("\n") for part in parts[1::2]))}


def _diffs(git: Git, cache: dict[str, str], shas: list[str], paths: list[str]) -> dict[str, str]:
    """sha -> its ``--unified=0`` diff of ``paths``, each commit diffed once for every range holding it."""
    key = f"diff:{','.join(paths)}:"
    if missing := [sha for sha in shas if key + sha not in cache]:
        diffs = commit_diffs(git, missing, "--unified=0", "--no-renames", "--full-index", paths=paths)
        cache.update({key + sha: diff for sha, diff in diffs.items()})
    return {sha: cache[key + sha] for sha in shas}


def upstream_hints(git: Git, entry: Entry, patch: PatchInfo | None, old: str, onto: str,
                   renamed: dict[str, str] | None = None, cache: dict[str, str] | None = None,
                   every: list[str] | None = None) -> list[Hint]:
    """Hints for ``entry`` in ``old..onto``, oldest first; ``cache``: searches so far; ``every``: all entries' files."""
    if not old or not onto or old == onto:
        return []
    span = f"{old}..{onto}"
    cache = {} if cache is None else cache
    if not _cached(git, cache, f"{span}:first", "rev-list", "-1", span):  # onto is old or one of its ancestors
        return []
    found: dict[str, Hint] = {}
    for number in dict.fromkeys(_PR.findall(entry.upstream or "") + _PR.findall(entry.drop_when or "")):
        for line in filter(None, _cached(git, cache, f"{span}#{number}", "log", "--reverse", "--format=%H%x00%s",
                                         "-E", f"--grep=#{number}([^0-9]|$)", span).split("\n")):
            sha, _, subject = line.partition("\0")
            found.setdefault(sha, Hint(sha, subject, f"names PR #{number}"))
    where: dict[str, dict[str, set[str]]] = {}  # path -> hunk header -> the names the hunk's removed lines use
    for path, header, names in _hunk_names(patch.patchset, lambda line: line.is_removed) if patch else ():
        if header and names:
            where.setdefault((renamed or {}).get(path, path), {}).setdefault(header, set()).update(names)
    if where:
        paths = sorted(every) if every is not None and set(where) <= set(every) else list(where)
        net = _net_hunks(git, cache, old, onto, paths)
        touching = _touching(git, cache, span, paths) if _shared_names(net, where) else {}
        shas = [sha for sha, (_, files) in touching.items() if not files.isdisjoint(where)]
        for sha, diff in _diffs(git, cache, shas, paths).items():
            why = _shared_names(list(_hunks(diff)), where)
            if why and sha not in found:
                found[sha] = Hint(sha, touching[sha][0], why)
    return list(found.values())


def _net_hunks(git: Git, cache: dict, old: str, onto: str, paths: list[str]) -> list[tuple[str, str, frozenset[str]]]:
    """``_hunks`` of ``old..onto``'s net change to ``paths``, a file's once per (path, old blob, new blob): revs of one
    range share most pairs, so each rev diffs only the files whose content is new to the cache (``check`` over 64
    revs diffed up to every patched file for each, its cost per rev growing with the distance from the base)."""
    raw = _cached(git, cache, f"{old}..{onto}:raw:" + ",".join(paths), "diff", "--raw", "--no-renames",
                  "--full-index", "-z", old, onto, "--", *paths).split("\0")
    pairs = {path: f"net:{path}:{meta.split()[2]}:{meta.split()[3]}" for meta, path in zip(raw[::2], raw[1::2])
             if meta.endswith(" M")}  # an added file holds none of an entry's functions, a deleted one keeps none
    if missing := [path for path, key in pairs.items() if key not in cache]:
        out = git.run("diff", "--text", "--unified=0", "--no-renames", "--full-index", "--no-color", old, onto, "--",
                      *missing, check=False).stdout
        starts = [m.start() for m in DIFF_HEADER.finditer(out)] + [len(out)]
        by_path = {header_path(m): out[a:b] for m, a, b in zip(DIFF_HEADER.finditer(out), starts, starts[1:])}
        cache.update({pairs[path]: _hunks(by_path.get(path, "")) for path in missing})
    return [hunk for key in pairs.values() for hunk in cache[key]]


def _shared_names(hunks: list[tuple[str, str, frozenset[str]]], where: dict[str, dict[str, set[str]]]) -> str:
    """Why ``hunks`` change one of ``where``'s functions with a name the entry's removed lines use ("": not)."""
    for path, header, changed in hunks:
        names = where.get(path, {}).get(header)
        shared = sorted(names & changed) if names else []
        if shared:
            return f"changes {header.split('(')[0].split()[-1]}() as this entry does ({', '.join(shared[:3])})"
    return ""


@functools.lru_cache(maxsize=4096)  # entries sharing one log read each commit's diff once
def _hunks(diff: str) -> tuple[tuple[str, str, frozenset[str]], ...]:
    """``_hunk_names`` of each file of ``diff``, its path read from its ``diff --git`` line: unidiff reads a path git
    quotes with its quotes, and one holding a space not at all. A hint is never evidence: a file it cannot read gives
    none."""
    heads = [(m.start(), header_path(m)) for m in DIFF_HEADER.finditer(diff)]
    out = []
    for (start, path), (end, _) in zip(heads, [*heads[1:], (len(diff), "")]):
        hunks = diff[start:end].partition("\n@@ ")[2]
        try:
            files = PatchSet(f"--- a/f\n+++ b/f\n@@ {hunks}") if hunks else []
        except UnidiffParseError:
            continue
        out += [(path, header, names) for _, header, names in
                _hunk_names(files, lambda line: line.is_added or line.is_removed)]
    return tuple(out)
