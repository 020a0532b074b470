"""Copies of what the series patches: upstream adds a file that is a copy of one we patch (git's copy detection,
unchanged files as sources), or a new class that subclasses a class we patch or mirrors it (three quarters of its
methods at least: a near-copy). Each names the hooks (the calls our entries add in the original, gate reads left
out) the copy lacks, the patched methods it drops and the envs the range declares (what may select it): a copy
lacking one is ``broken`` (its path runs without ours); one that has them all is a warning.
"""

from __future__ import annotations

import ast
import io
import re
import tempfile
import tokenize
import unicodedata
from dataclasses import dataclass, replace
from pathlib import Path

from unidiff import PatchSet

from c128patch.git import BlobBatch, Git
from c128patch.ops.replay import replay_in_index
from c128patch.series.manifest import Series


@dataclass(frozen=True)
class Patched:
    """A class (``""``: the module) of a file our entries patch: its methods, and the calls we add per method."""

    file: str
    cls: str
    methods: frozenset[str]
    hooks: dict[str, frozenset[str]]


@dataclass(frozen=True)
class Copy:
    original: str
    copy: str
    missing: tuple[str, ...]
    switches: tuple[str, ...] = ()  # the envs the range declares: what may select the copy
    dropped: tuple[str, ...] = ()  # the methods we patch that the copy does not have

    def __str__(self) -> str:
        said = f"upstream copies {self.original} as {self.copy}" + (
            f" (the range adds {', '.join(self.switches)})" if self.switches else "")
        drops = f"drops our patched method(s) {', '.join(self.dropped)} and " if self.dropped else ""
        return said + (f", which {drops}lacks our hook(s) {', '.join(self.missing)}" if self.missing else
                       ", which has our hooks: check that the path selecting it runs them")


FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _last(expr: ast.expr) -> str:
    return getattr(expr, "attr", None) or getattr(expr, "id", "")


def _calls(node: ast.AST, lines: set[int] | None = None) -> set[str]:
    """The names ``node`` calls (``a.b(...)``: ``b``); only those on ``lines`` when given."""
    return {_last(c.func) for c in ast.walk(node) if isinstance(c, ast.Call) and (lines is None or c.lineno in lines)}


def _parse(source: bytes | None) -> ast.Module:
    """The module; one that does not parse holds nothing here (the tree checks report it)."""
    try:
        return ast.parse(source or b"")
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # RecursionError: nested too deeply to build
        return ast.Module(body=[], type_ignores=[])


def _names(source: bytes) -> str | None:
    """``source`` as Python reads its names (its coding declaration, NFKC): any name it defines is in it."""
    try:
        return unicodedata.normalize("NFKC", source.decode(tokenize.detect_encoding(io.BytesIO(source).readline)[0]))
    except (SyntaxError, LookupError, ValueError):  # a coding Python refuses, bytes it does not decode
        return None  # parsed, then


def _defs(source: bytes | None) -> dict[str, tuple[set[str], dict[str, ast.AST]]]:
    """Class name (``""``: module level) -> its base names and its functions."""
    out: dict[str, tuple[set[str], dict[str, ast.AST]]] = {"": (set(), {})}
    for node in _parse(source).body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = ({_last(b) for b in node.bases}, {f.name: f for f in node.body if isinstance(f, FUNCS)})
        elif isinstance(node, FUNCS):
            out[""][1][node.name] = node
    return out


def patched(series: Series, git: Git, rev: str, commit: str) -> list[Patched]:
    """The classes each patch entry adds calls to, with those calls, from the series replayed on ``commit``."""
    trees: dict[str, tuple[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="c128copies-") as tmp:
        _, planned = replay_in_index(series, git, rev, commit, Path(tmp) / "index", trees=trees)
    return hooked(git, [trees[p.entry.name] for p in planned if p.patch is not None and p.entry.name in trees])


def hooked(git: Git, changes: list[tuple[str, str]]) -> list[Patched]:
    """The classes each patch entry's (before, after) change adds calls to, with those calls."""
    hooks: dict[tuple[str, str], dict[str, set[str]]] = {}
    methods: dict[tuple[str, str], frozenset[str]] = {}
    for before, after in changes:
        for pf in PatchSet(git.run("diff", "--no-color", "--no-renames", before, after, "--", "*.py").stdout):
            added = {ln.target_line_no for hunk in pf for ln in hunk if ln.is_added}
            for cls, (_, fns) in _defs(git.blob(after, pf.path)).items():
                for name, fn in fns.items():
                    if ours := _calls(fn, added) - {"get"}:
                        hooks.setdefault((pf.path, cls), {}).setdefault(name, set()).update(ours)
                        methods[(pf.path, cls)] = frozenset(fns)
    return [Patched(f, c, methods[f, c], {m: frozenset(h) for m, h in hs.items()}) for (f, c), hs in hooks.items()]


def find(git: Git, base: str, target: str, ours: list[Patched]) -> list[Copy]:
    """The copies ``base..target`` adds of what ``ours`` lists (module docstring)."""
    # -C --find-copies-harder: a new file is matched against every file of the base, changed or not
    words = git.out("diff", "--no-color", "--name-status", "-z", "-C", "--find-copies-harder", "--diff-filter=ACMR",
                    base, target, "--", "*.py").split("\0")
    copies: list[Copy] = []
    batch = BlobBatch(git)  # one git for the range's every file (thousands between releases); a name with a newline
    read = lambda rev, name: git.blob(rev, name) if "\n" in name else batch.read(f"{rev}:{name}")  # noqa: E731
    try:
        while len(words) > 1:
            status, path = words[0], words[1]
            source, path, words = (path, words[2], words[3:]) if status[0] in "CR" else ("", path, words[2:])
            text = read(target, path) or b""
            if status[0] == "C" and any(p.file == source for p in ours):
                hooks = {h for p in ours if p.file == source for names in p.hooks.values() for h in names}
                defined = {f for _, fns in _defs(text).values() for f in fns}
                dropped = {m for p in ours if p.file == source for m in p.hooks} - defined if defined else set()
                copies.append(Copy(source, path, tuple(sorted(hooks - _calls(_parse(text)))), (),
                                   tuple(sorted(dropped))))
                continue
            names = _names(text)
            if names is not None and not any(p.cls and (p.cls in names or sum(m in names for m in p.methods)
                                                        >= .75 * len(p.methods)) for p in ours):
                continue  # no class here can subclass or mirror one we patch: not even the names are in its text
            known = set(_defs(read(base, source or path))) if status[0] in "MR" else set()
            for cls, (bases, fns) in _defs(text).items():
                for p in ours:  # a new class that subclasses one we patch, or has most of its methods (a near-copy)
                    sub = p.cls in bases
                    if cls and p.cls and cls not in known and (sub or len(p.methods & set(fns))
                                                               >= .75 * len(p.methods)):
                        dropped = set() if sub else set(p.hooks) - set(fns)  # a subclass inherits what it leaves out
                        missing = {h for m in dropped for h in p.hooks[m]} | {
                            h for m, hs in p.hooks.items() if m in fns and m not in (have := _calls(fns[m]))
                            for h in hs - have}  # an override calling super().m keeps ours
                        copies.append(Copy(f"{p.file}:{p.cls}", f"{path}:{cls}", tuple(sorted(missing)), (),
                                           tuple(sorted(dropped))))
    finally:
        batch.close()
    switches = _switches(git, base, target) if copies else ()
    return [replace(c, switches=switches) for c in copies]


ENV = r"^{}\s*(SGLANG_\w+)\s*(?::[^=\n]*)?=(?!=)"  # ``X = EnvBool(..)`` or annotated, ``X: EnvBool = EnvBool(..)``


def _switches(git: Git, base: str, target: str) -> tuple[str, ...]:
    """The envs ``base..target`` declares in an ``environ.py``: what may select a copy."""
    declared = git.run("diff", "--no-color", "-U0", base, target, "--", "*/environ.py").stdout
    new = set(re.findall(ENV.format(r"\+"), declared, re.M)) - set(re.findall(ENV.format("-"), declared, re.M))
    return tuple(sorted(new))
