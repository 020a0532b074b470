"""Copies of what the series patches: upstream adds a file that is a copy of one we patch (git's copy detection,
unchanged files as sources), or a new class that subclasses a class we patch or mirrors it (three quarters of its
methods at least: a near-copy), or a new function or method anywhere in the files the range changes (a patched class
included, or module level) whose body is a near copy of one we patch as the base holds it (difflib's ratio of their
lines, ``SIMILAR``), named ``file:line:Class.method``. Each names the hooks (the calls our entries add in the
original, gate reads left out) the copy lacks, the patched methods it drops and the envs the range declares (what
may select it): a copy lacking one is ``broken`` (its path runs without ours); one that has them all is a warning.
"""

from __future__ import annotations

import ast
import difflib
import functools
import io
import re
import tokenize
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from unidiff import PatchSet

from c128patch import procs
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
    landed: str = ""  # the copy as the carried tree holds it, where our patch put the hooks into it instead

    def __str__(self) -> str:
        if self.landed:
            return (f"our hook(s) {', '.join(self.missing)} landed in upstream's copy {self.landed} (the patch "
                    f"applied at an offset into it), not in {self.original}, which now runs without them")
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
    with procs.scratch("c128copies-") as tmp:
        _, planned = replay_in_index(series, git, rev, commit, Path(tmp) / "index", trees=trees)
    return hooked(git, [trees[p.entry.name] for p in planned if p.patch is not None and p.entry.name in trees])


def hooked(git: Git, changes: list[tuple[str, str]]) -> list[Patched]:
    """The classes each patch entry's (before, after) change adds calls to, with those calls."""
    hooks: dict[tuple[str, str], dict[str, set[str]]] = {}
    methods: dict[tuple[str, str], frozenset[str]] = {}
    for before, after in changes:
        for pf in PatchSet(git.run("diff", "--text", "--no-color", "--no-renames", before, after, "--", "*.py").stdout):
            added = {ln.target_line_no for hunk in pf for ln in hunk if ln.is_added}
            for cls, (_, fns) in _defs(git.blob(after, pf.path)).items():
                for name, fn in fns.items():
                    if ours := _calls(fn, added) - {"get"}:
                        hooks.setdefault((pf.path, cls), {}).setdefault(name, set()).update(ours)
                        methods[(pf.path, cls)] = frozenset(fns)
    return [Patched(f, c, methods[f, c], {m: frozenset(h) for m, h in hs.items()}) for (f, c), hs in hooks.items()]


SIMILAR = 0.8  # difflib's ratio of two bodies' lines from which a new function is a near copy of one we patch
RARE = 8  # a file is parsed for copies of a patched function only if it holds 6 of its 8 longest names


@dataclass(frozen=True)
class _Body:
    """A function as compared: ``where`` (file:line:qualified name), its body's lines and its longest names."""

    where: str
    lines: tuple[str, ...]
    rare: tuple[str, ...]
    hooks: frozenset[str] = frozenset()


def _body(where: str, fn: ast.AST, hooks: frozenset[str] = frozenset()) -> _Body:
    """``fn``'s body as Python reads it (formatting and comments left out), its docstring dropped."""
    body = fn.body[1:] if ast.get_docstring(fn) is not None and len(fn.body) > 1 else fn.body
    lines = tuple(ln.strip() for st in body for ln in ast.unparse(st).splitlines() if ln.strip())
    words = sorted(set(re.findall(r"[^\W\d]\w*", "\n".join(lines))), key=lambda w: (-len(w), w))
    return _Body(where, lines, tuple(words[:RARE]), hooks)


def _holds(text: str, words: tuple[str, ...]) -> bool:
    """Does ``text`` hold three quarters of ``words`` (substring search, which is cheap: no scan per name)."""
    misses = len(words) // 4
    for w in words:
        misses -= w not in text
        if misses < 0:
            return False
    return True


def _originals(git: Git, base: str, ours: list[Patched]) -> list[_Body]:
    """The functions we patch, as the base holds them (unpatched)."""
    out = []
    for p in ours:
        fns = _defs(git.blob(base, p.file)).get(p.cls, (set(), {}))[1]
        out += [_body(f"{p.file}:{fns[m].lineno}:{'.'.join(filter(None, (p.cls, m)))}", fns[m], hooks)
                for m, hooks in p.hooks.items() if m in fns]
    return out


def _near(copy: _Body, originals: list[_Body]) -> _Body | None:
    """The original ``copy`` is a near copy of (difflib's ratio of their lines, the cheap bounds first)."""
    for o in originals:
        if len(o.lines) < 3 or not copy.lines:  # three lines at least: a shorter body is no telling copy
            continue
        sm = difflib.SequenceMatcher(None, o.lines, copy.lines, autojunk=False)
        if sm.real_quick_ratio() >= SIMILAR and sm.quick_ratio() >= SIMILAR and sm.ratio() >= SIMILAR:
            return o
    return None


Defs = dict[str, tuple[set[str], dict[str, ast.AST]]]


def _function_copies(path: str, names: str | None, defs: Callable[[], Defs], before: Callable[[], Defs],
                     skip: set[str], originals: list[_Body]) -> list[Copy]:
    """The functions the file adds (not ``before``, not in a class of ``skip``) that copy one we patch."""
    near = [o for o in originals if names is None or _holds(names, o.rare)]
    if not near:
        return []  # no function here can be a near copy: the longest names of each one we patch are not in it
    known = {(cls, name) for cls, (_, fns) in before().items() for name in fns}
    found = []
    for cls, (_, fns) in defs().items():
        for name, fn in fns.items():
            if cls in skip or (cls, name) in known:
                continue
            copy = _body(f"{path}:{fn.lineno}:{'.'.join(filter(None, (cls, name)))}", fn)
            if o := _near(copy, near):
                found.append(Copy(o.where, copy.where, tuple(sorted(o.hooks - _calls(fn)))))
    return found


def _file_copy(source: str, path: str, text: bytes, ours: list[Patched]) -> Copy:
    """``path``, git's copy of ``source``, a file we patch."""
    hooks = {h for p in ours if p.file == source for names in p.hooks.values() for h in names}
    defined = {f for _, fns in _defs(text).values() for f in fns}
    dropped = {m for p in ours if p.file == source for m in p.hooks} - defined if defined else set()
    return Copy(source, path, tuple(sorted(hooks - _calls(_parse(text)))), (), tuple(sorted(dropped)))


def _class_copies(path: str, names: str | None, defs: Callable[[], Defs], before: Callable[[], Defs],
                  ours: list[Patched]) -> list[Copy]:
    """The classes the file adds that subclass one we patch, or have most of its methods (a near-copy)."""
    if names is not None and not any(p.cls and (p.cls in names or sum(m in names for m in p.methods)
                                                >= .75 * len(p.methods)) for p in ours):
        return []  # no class here can subclass or mirror one we patch: not even the names are in its text
    found = []
    for cls, (bases, fns) in defs().items():
        for p in ours:
            sub = p.cls in bases
            if cls and p.cls and cls not in before() and (sub or len(p.methods & set(fns)) >= .75 * len(p.methods)):
                dropped = set() if sub else set(p.hooks) - set(fns)  # a subclass inherits what it leaves out
                missing = {h for m in dropped for h in p.hooks[m]} | {
                    h for m, hs in p.hooks.items() if m in fns and m not in (have := _calls(fns[m]))
                    for h in hs - have}  # an override calling super().m keeps ours
                found.append(Copy(f"{p.file}:{p.cls}", f"{path}:{cls}", tuple(sorted(missing)), (),
                                  tuple(sorted(dropped))))
    return found


def find(git: Git, base: str, target: str, ours: list[Patched]) -> list[Copy]:
    """The copies ``base..target`` adds of what ``ours`` lists (module docstring)."""
    # -C --find-copies-harder: a new file is matched against every file of the base, changed or not
    words = git.out("diff", "--no-color", "--name-status", "-z", "-C", "--find-copies-harder", "--diff-filter=ACMR",
                    base, target, "--", "*.py").split("\0")
    copies: list[Copy] = []
    if len(words) < 2:
        return copies
    originals = _originals(git, base, ours)
    batch = BlobBatch(git)  # one git for the range's every file (thousands between releases); a name with a newline
    read = lambda rev, name: git.blob(rev, name) if "\n" in name else batch.read(f"{rev}:{name}")  # noqa: E731
    try:
        while len(words) > 1:
            status, path = words[0], words[1]
            source, path, words = (path, words[2], words[3:]) if status[0] in "CR" else ("", path, words[2:])
            text = read(target, path) or b""
            if status[0] == "C" and any(p.file == source for p in ours):
                copies.append(_file_copy(source, path, text, ours))
                continue
            names, old = _names(text), source or path  # each file is parsed only where its names call for it
            defs = functools.cache(lambda text=text: _defs(text))
            before = functools.cache(lambda old=old, st=status: _defs(read(base, old)) if st[0] in "MR" else {})
            classes = _class_copies(path, names, defs, before, ours)
            copies += classes + _function_copies(path, names, defs, before, {c.copy.rsplit(":", 1)[1]
                                                                              for c in classes}, originals)
    finally:
        batch.close()
    switches = _switches(git, base, target) if copies else ()
    return [replace(c, switches=switches) for c in copies]


def landed(git: Git, head: str, found: list[Copy]) -> list[Copy]:
    """``found``, each function copy whose hooks the carried tree ``head`` holds in the copy, not the original, so
    marked: upstream put the copy above the original and git applied our hunk there, at an offset."""
    out = []
    for c in found:
        sides = [where.rsplit(":", 2) for where in (c.original, c.copy)]
        if c.missing and all(len(side) == 3 for side in sides):
            (opath, _, oname), (cpath, _, cname) = sides
            calls = [_qualified(git.blob(head, path), name) for path, name in ((opath, oname), (cpath, cname))]
            if calls[1] is not None and set(c.missing) <= calls[1] and not set(c.missing) <= (calls[0] or set()):
                c = replace(c, landed=c.copy)
        out.append(c)
    return out


def _qualified(source: bytes | None, name: str) -> set[str] | None:
    """The calls of function ``name`` (``Class.method`` or a module's function) in ``source``; None: no such one."""
    cls, _, fn = name.rpartition(".")
    node = _defs(source).get(cls, (set(), {}))[1].get(fn)
    return None if node is None else _calls(node)


ENV = r"^{}\s*(SGLANG_\w+)\s*(?::[^=\n]*)?=(?!=)"  # ``X = EnvBool(..)`` or annotated, ``X: EnvBool = EnvBool(..)``


def _switches(git: Git, base: str, target: str) -> tuple[str, ...]:
    """The envs ``base..target`` declares in an ``environ.py``: what may select a copy."""
    declared = git.run("diff", "--text", "--no-color", "-U0", base, target, "--", "*/environ.py").stdout
    new = set(re.findall(ENV.format(r"\+"), declared, re.M)) - set(re.findall(ENV.format("-"), declared, re.M))
    return tuple(sorted(new))
