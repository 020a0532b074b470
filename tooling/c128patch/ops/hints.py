"""Semantic-merge hints: upstream commits of ``old..onto`` that may now do what an entry does.

Never evidence (``ops.merged`` decides drops); a line for whoever reads the stop, ``check`` or
``watch``. A commit is named when its message names a PR of the entry's ``upstream`` or ``drop_when``,
or when it changes a function one of the entry's hunks edits (git's hunk header) in a file the entry
patches, with a name the entry's removed lines use (``extend_len`` for an ``extend_len == 0`` guard).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Callable

from unidiff import PatchSet, UnidiffParseError
from unidiff.patch import Line

from c128patch.git import Git
from c128patch.ops.merged import PR_NUMBER
from c128patch.series.manifest import Entry
from c128patch.series.patchfile import PatchInfo

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{3,}")
_COMMON = {"const", "auto", "return", "static_cast", "uint32_t", "int32_t", "int64_t", "size_t", "self", "None",
           "True", "False", "else", "elif", "import", "from", "static", "inline", "void", "bool", "float", "double",
           "RuntimeCheck", "assert", "print", "range", "irange", "std", "this", "pass", "with", "lambda"}


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


def upstream_hints(git: Git, entry: Entry, patch: PatchInfo | None, old: str, onto: str,
                   renamed: dict[str, str] | None = None, cache: dict[str, str] | None = None,
                   every: list[str] | None = None) -> list[Hint]:
    """The hints for ``entry`` in ``old..onto``, oldest first; ``cache``: earlier searches of the range;
    ``every``: the files of all the entries, searched once for the range when they hold this entry's."""
    if not old or not onto or old == onto:
        return []
    span = f"{old}..{onto}"
    cache = {} if cache is None else cache

    def cached(key: str, *args: str) -> str:  # entries share one search of the range
        if key not in cache:
            cache[key] = git.run(*args, check=False).stdout
        return cache[key]

    if not cached(f"{span}:first", "rev-list", "-1", span):  # onto is old or one of its ancestors
        return []
    found: dict[str, Hint] = {}
    for number in dict.fromkeys(PR_NUMBER.findall(entry.upstream or "") + PR_NUMBER.findall(entry.drop_when or "")):
        for line in cached(f"{span}#{number}", "log", "--reverse", "--format=%H%x00%s", "-E",
                           f"--grep=#{number}([^0-9]|$)", span).splitlines():
            sha, _, subject = line.partition("\0")
            found.setdefault(sha, Hint(sha, subject, f"names PR #{number}"))
    where: dict[str, dict[str, set[str]]] = {}  # path -> hunk header -> the names the hunk's removed lines use
    for path, header, names in _hunk_names(patch.patchset, lambda line: line.is_removed) if patch else ():
        if header and names:
            where.setdefault((renamed or {}).get(path, path), {}).setdefault(header, set()).update(names)
    if where:
        shared = sorted(every) if every is not None and set(where) <= set(every) else None
        log = cached(f"{span}:log:" + ",".join(shared or where), "log", "--reverse", "-p", "--unified=0",
                     "--no-renames", "--format=%x00%H%x00%s", span, "--", *(shared or where))
        parts = log.split("\0")  # per commit: sha, then subject and diff
        for sha, (subject, _, diff) in zip(parts[1::2], (p.partition("\n") for p in parts[2::2])):
            why = _same_function(diff, where)
            if why and sha not in found:
                found[sha] = Hint(sha, subject, why)
    return list(found.values())


@functools.lru_cache(maxsize=4096)  # entries sharing one log read each commit's diff once
def _hunks(diff: str) -> tuple[tuple[str, str, frozenset[str]], ...]:
    try:
        return tuple(_hunk_names(PatchSet(diff), lambda line: line.is_added or line.is_removed))
    except UnidiffParseError:  # a hint is never evidence: a diff it cannot read gives none
        return ()


def _same_function(diff: str, where: dict[str, dict[str, set[str]]]) -> str:
    """Why ``diff`` changes one of ``where``'s functions with a name the entry's removed lines use ("": not)."""
    for path, header, changed in _hunks(diff):
        names = where.get(path, {}).get(header)
        shared = sorted(names & changed) if names else []
        if shared:
            return f"changes {header.split('(')[0].split()[-1]}() as this entry does ({', '.join(shared[:3])})"
    return ""
