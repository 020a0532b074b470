"""Audit gated patches: every side-effecting statement a patch adds must run only when its gate is on.

For a manifest entry with a gate (say ``SGLANG_X``), each Python file the entry's own change touches
is parsed, as that change left it, with :mod:`ast`. The lines it adds are read where the patch
*landed* (the entry's commit against its parent, or its trees in a replay), never from the patch
file's hunk numbers: git may apply a hunk at an offset. A call that matches a rule in :data:`RULES`
(a ``record_stream``, a ``.copy_``, a synchronize ...) on an added line must be *guarded*:

- inside the body of ``if envs.SGLANG_X.get():`` or ``if envs.SGLANG_X.get() and ...:``
  (the gate anywhere in an ``and`` chain), or in the ``else`` of ``if not envs.SGLANG_X.get():``;
- after an early exit in the same block: ``if not envs.SGLANG_X.get(): return`` (also ``raise``,
  ``continue``, ``break``; the test may be ``not gate or ...``), or in the same forms as an
  expression (``f() if envs.SGLANG_X.get() else None``, ``envs.SGLANG_X.get() and f()``);
- or inside a function whose every call site in the file is guarded (a helper).

A call to a helper *defined elsewhere* counts as the side effects that helper has: the audit
follows ``from sglang... import name`` into the patched tree (our overlay modules and upstream
alike) and treats a function that (transitively) makes a rule call as making it. Defining a
function or lambda does not run it, so a guard outside a ``def`` does not cover its body.
Overlay modules (installed whole) are not audited line by line: they are helper libraries, and
their side effects are charged to the guarded-or-not call sites in the patched upstream files.

Only ``<anything>.SGLANG_X.get()`` is recognised as the gate, so the gate has to be read through
``srt/environ.py``'s ``envs`` (as upstream does). Assigning the gate to a variable first and
testing the variable is not recognised (the audit reports the call as unguarded).
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from unidiff import PatchSet

from c128patch import procs
from c128patch.errors import C128Error
from c128patch.git import BlobBatch, Git
from c128patch.ops.replay import FAILED, branch_commits, replay_in_index
from c128patch.series.manifest import Series
from c128patch.series.plan import index_git


@dataclass(frozen=True)
class Rule:
    """A kind of side-effecting call: ``methods`` by last attribute, ``functions`` by full dotted name."""

    name: str
    methods: frozenset[str] = frozenset()
    functions: frozenset[str] = frozenset()

    def matches(self, dotted: str) -> bool:
        return ("." in dotted and dotted.rsplit(".", 1)[-1] in self.methods) or dotted in self.functions


# One line per kind of side effect; extend here.
RULES: tuple[Rule, ...] = (
    Rule("record_stream", methods=frozenset({"record_stream"})),
    Rule("tensor_copy_", methods=frozenset({"copy_"})),
    Rule("synchronize", methods=frozenset({"synchronize"}), functions=frozenset({"torch.cuda.synchronize"})),
    Rule("stream_wait", methods=frozenset({"wait_stream", "wait_event"})),
)


@dataclass(frozen=True)
class Finding:
    file: str
    line: int
    rule: str
    message: str
    entry: str = ""  # the gated entry that adds the statement (``<layer>/<entry>`` for a layer's)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: [{self.rule}] {self.message}"


def _is_gate_on(test: ast.expr, gate: str) -> bool:
    """True when ``test`` can only be truthy with the gate on: ``<anything>.GATE.get()`` in an ``and`` chain."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(_is_gate_on(v, gate) for v in test.values)
    func = test.func if isinstance(test, ast.Call) and not test.args else None
    return isinstance(func, ast.Attribute) and func.attr == "get" and isinstance(func.value, ast.Attribute) \
        and func.value.attr == gate


def _is_gate_off(test: ast.expr, gate: str) -> bool:
    """True when ``test`` is truthy whenever the gate is off (``not gate``, ``not gate or ...``)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _is_gate_on(test.operand, gate)
    return isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or) and \
        any(_is_gate_off(v, gate) for v in test.values)


_EXITS = (ast.Return, ast.Raise, ast.Continue, ast.Break)
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)


@dataclass
class _Call:
    node: ast.Call
    name: str  # dotted
    guarded: bool
    function: str | None  # innermost enclosing def, None at module level / in a lambda

    @property
    def lines(self) -> range:
        return range(self.node.lineno, (self.node.end_lineno or self.node.lineno) + 1)


_LEAVES = (ast.Name, ast.Constant)  # expressions that hold no call


class _Walker:
    """Collects every call with whether a gate guard covers it (within its own function)."""

    def __init__(self, tree: ast.Module, gate: str) -> None:
        self.gate = gate
        self.calls: list[_Call] = []
        self.block(tree.body, False, None)

    def block(self, stmts: Sequence[ast.stmt], guarded: bool, fn: str | None) -> None:
        for stmt in stmts:
            self.stmt(stmt, guarded, fn)
            if isinstance(stmt, ast.If) and _is_gate_off(stmt.test, self.gate) and stmt.body \
                    and isinstance(stmt.body[-1], _EXITS):
                guarded = True  # `if not gate: return` -> the rest of the block needs the gate

    def stmt(self, stmt: ast.stmt, guarded: bool, fn: str | None) -> None:
        if isinstance(stmt, _DEFS):
            defaults = [d for d in [*stmt.args.defaults, *stmt.args.kw_defaults] if d is not None]
            for expr in [*stmt.decorator_list, *defaults]:
                self.expr(expr, guarded, fn)
            self.block(stmt.body, False, stmt.name)
        elif isinstance(stmt, ast.ClassDef):
            for expr in [*stmt.decorator_list, *stmt.bases]:
                self.expr(expr, guarded, fn)
            self.block(stmt.body, guarded, fn)
        elif isinstance(stmt, ast.If):
            self.expr(stmt.test, guarded, fn)
            self.block(stmt.body, guarded or _is_gate_on(stmt.test, self.gate), fn)
            self.block(stmt.orelse, guarded or _is_gate_off(stmt.test, self.gate), fn)
        else:
            self.fields(stmt, guarded, fn)

    def fields(self, node: ast.AST, guarded: bool, fn: str | None) -> None:
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, list):
                if value and isinstance(value[0], ast.stmt):  # (a list field holds one kind of node)
                    self.block(value, guarded, fn)
                    continue
            else:
                value = [value]
            for v in value:
                if isinstance(v, ast.expr):
                    self.expr(v, guarded, fn)
                elif isinstance(v, ast.stmt):
                    self.stmt(v, guarded, fn)
                elif isinstance(v, ast.AST):  # excepthandler, withitem, keyword, comprehension ...
                    self.fields(v, guarded, fn)

    def expr(self, node: ast.expr, guarded: bool, fn: str | None) -> None:
        if isinstance(node, _LEAVES):
            return
        if isinstance(node, ast.Lambda):
            self.expr(node.body, False, None)
        elif isinstance(node, ast.IfExp):
            self.expr(node.test, guarded, fn)
            self.expr(node.body, guarded or _is_gate_on(node.test, self.gate), fn)
            self.expr(node.orelse, guarded or _is_gate_off(node.test, self.gate), fn)
        elif isinstance(node, ast.BoolOp):
            # `gate and f()`: f runs only with the gate on; `not gate or f()` likewise.
            covers = _is_gate_on if isinstance(node.op, ast.And) else _is_gate_off
            for value in node.values:
                self.expr(value, guarded, fn)
                guarded = guarded or covers(value, self.gate)
        else:
            if isinstance(node, ast.Call):  # named ``a.b.c``; a call in the chain reads ``?`` (``f(x).g``: ``?.g``)
                parts: list[str] = []
                func = node.func
                while isinstance(func, ast.Attribute):
                    parts.append(func.attr)
                    func = func.value
                parts.append(func.id if isinstance(func, ast.Name) else "?")
                self.calls.append(_Call(node, ".".join(reversed(parts)), guarded, fn))
            self.fields(node, guarded, fn)


def _rule_of(name: str, rules: Sequence[Rule], effects: Mapping[str, str]) -> str | None:
    direct = next((rule.name for rule in rules if rule.matches(name)), None)
    # helpers: a bare name (`helper(...)`) or module attribute (`mod.helper(...)`)
    return direct or effects.get(name) or effects.get(name.rsplit(".", 1)[-1] if "." in name else "")


def _parse(source: str, file: str) -> ast.Module:
    """``source`` (upstream's ``file``, as patched) parsed; one that does not parse, or nests past the parser's limits,
    is a one-line error naming it (a SyntaxError traceback ended `watch` and `audit`, helper 169)."""
    try:
        return ast.parse(source, file)
    except (SyntaxError, ValueError) as exc:
        raise C128Error(f"gate audit: {file}: does not parse ({type(exc).__name__}: {exc})") from None
    except (RecursionError, MemoryError):
        raise C128Error(f"gate audit: {file}: nested too deeply to parse") from None


def audit_patched_file(source: str, added_lines: set[int], gate: str, rules: Sequence[Rule] = RULES, *,
                       file: str = "<source>", index: _HelperIndex | None = None) -> list[Finding]:
    """Rule calls on ``added_lines`` that can run with ``gate`` off; helpers called on added lines count with the
    side effects ``index`` finds in them (only they can make a finding)."""
    tree = _parse(source, file)
    calls = _Walker(tree, gate).calls
    local_defs = {n.name for n in _statements(tree) if isinstance(n, _DEFS)}
    external_effects = {} if index is None else index.imported_effects(
        _froms(tree), _reached(calls, added_lines, local_defs), index.depth)
    effects = {**external_effects, **_local_effects(calls, rules, external_effects, local_defs)}

    def helper_fully_guarded(fn: str, seen: frozenset[str] = frozenset()) -> bool:
        sites = [c for c in calls if c.name.rsplit(".", 1)[-1] == fn and c.function != fn]
        if not sites or fn in seen:
            return False
        return all(c.guarded or (c.function is not None and helper_fully_guarded(c.function, seen | {fn}))
                   for c in sites)

    findings: list[Finding] = []
    for call in calls:
        if not added_lines.intersection(call.lines) or call.guarded:
            continue
        rule = _rule_of(call.name, rules, effects)
        if rule is None or (call.function is not None and helper_fully_guarded(call.function)):
            continue
        where = f"in {call.function}()" if call.function else "at module level"
        findings.append(Finding(file, call.node.lineno, rule, f"added call {call.name}(...) {where} runs with "
                                                              f"{gate} off (not under `if envs.{gate}.get():`)"))
    return findings


def _reached(calls: Sequence[_Call], lines: set[int], local_defs: set[str]) -> set[str]:
    """The names called on ``lines`` and in the functions of this module those calls reach (``f``, ``x.f``)."""
    by_function: dict[str, list[_Call]] = {}
    for call in calls:
        by_function.setdefault(call.function or "", []).append(call)
    names = {c.name for c in calls if lines.intersection(c.lines)}
    todo, seen = list(names), set()
    while todo:
        fn = todo.pop().rsplit(".", 1)[-1]
        if fn in local_defs and fn not in seen:
            seen.add(fn)
            fresh = {c.name for c in by_function.get(fn, [])} - names
            names |= fresh
            todo += fresh
    return names


def _local_effects(calls: Sequence[_Call], rules: Sequence[Rule], effects: Mapping[str, str],
                   local_defs: set[str]) -> dict[str, str]:
    """Functions of this module whose body (transitively) makes a rule call -> that rule."""
    found: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        for call in calls:
            if call.function is None or call.function in found or call.function not in local_defs:
                continue
            rule = _rule_of(call.name, rules, {**effects, **found})
            if rule is not None:
                found[call.function] = rule
                changed = True
    return found


Reader = Callable[[str], "str | None"]  # tree-relative path -> text, None if absent


def _froms(tree: ast.Module) -> list[ast.ImportFrom]:
    """Its absolute ``from x import y`` statements, wherever they are."""
    return [n for n in _statements(tree) if isinstance(n, ast.ImportFrom) and not n.level and n.module]


_HOLDERS = (ast.stmt, ast.excepthandler, ast.match_case)


def _statements(tree: ast.AST) -> Iterator[ast.AST]:
    """``ast.walk``'s nodes that hold or are statements, in its order (an expression holds none: not entered)."""
    todo = deque([tree])
    while todo:
        node = todo.popleft()
        todo.extend(c for c in ast.iter_child_nodes(node) if isinstance(c, _HOLDERS))
        yield node


# path -> its top-level functions' calls (names only: any gate's walker), ``from`` imports and top-level functions
Parsed = dict[str, tuple[dict[str, list[_Call]], list[ast.ImportFrom], set[str]]]


class _HelperIndex:
    """Side effects of functions in other modules of the patched tree, followed through imports ``depth`` modules
    down and asked for by name: only the helpers our added lines reach are parsed. ``parsed``: the helper files
    parsed so far, shared by every patch one audit reads them for."""

    def __init__(self, read: Reader, gate: str, rules: Sequence[Rule], depth: int = 3, parsed: Parsed | None = None):
        self.read, self.gate, self.rules, self.depth = read, gate, rules, depth
        self._rules: dict[tuple[str, str, int], str | None] = {}
        self.parsed = {} if parsed is None else parsed

    def module_file(self, module: str) -> str | None:
        base = "python/" + module.replace(".", "/")
        return next((cand for cand in (f"{base}.py", f"{base}/__init__.py") if self.read(cand) is not None), None)

    def _module(self, path: str) -> tuple[dict[str, list[_Call]], list[ast.ImportFrom], set[str]]:
        if path not in self.parsed:
            tree = _parse(self.read(path) or "", path)
            by_function: dict[str, list[_Call]] = {}
            for call in _Walker(tree, self.gate).calls:
                if call.function is not None:
                    by_function.setdefault(call.function, []).append(call)
            self.parsed[path] = by_function, _froms(tree), {n.name for n in tree.body if isinstance(n, _DEFS)}
        return self.parsed[path]

    def rule_of_function(self, path: str, name: str, depth: int, seen: frozenset = frozenset()) -> str | None:
        """The rule top-level function ``name`` of module ``path`` makes: a rule call in its body, or a call of a
        function of its module or (``depth`` > 0) of one it imports that makes one."""
        key = (path, name, depth)
        if key not in self._rules:
            if (path, name) in seen:
                return None  # a cycle: its first visit answers
            by_function, froms, defs = self._module(path)
            calls = by_function.get(name, []) if name in defs else []
            inner = seen | {(path, name)}
            self._rules[key] = next((r for c in calls if (r := self._rule_of_call(path, c.name, froms, defs, depth,
                                                                                   inner))), None)
        return self._rules[key]

    def _rule_of_call(self, path: str, name: str, froms: list[ast.ImportFrom], defs: set[str], depth: int,
                      seen: frozenset) -> str | None:
        """A call ``name`` in module ``path``: a rule's, else a local function's (``f``, ``x.f``), else an imported
        one's (``f``, ``x.f``, ``mod.f``)."""
        direct = next((rule.name for rule in self.rules if rule.matches(name)), None)
        if direct:
            return direct
        for key in dict.fromkeys((name, name.rsplit(".", 1)[-1])):
            found = (self.rule_of_function(path, key, depth, seen) if key in defs else None) or \
                (self.imported_rule(froms, key, depth - 1, seen) if depth > 0 else None)
            if found:
                return found
        return None

    def imported_rule(self, froms: list[ast.ImportFrom], called: str, depth: int,
                      seen: frozenset = frozenset()) -> str | None:
        """The rule a name as called (``f``: ``from m import f``; ``mod.f``: ``from pkg import mod``) makes; the
        last import of the name decides."""
        local, _, fn = called.partition(".")
        if "." in fn:
            return None
        for node in reversed(froms):
            for alias in reversed(node.names):
                if (alias.asname or alias.name) != local:
                    continue
                sub = self.module_file(f"{node.module}.{alias.name}")
                if sub is not None:  # `from pkg import module`
                    found = self.rule_of_function(sub, fn, depth, seen) if fn else None
                elif not fn and (mod := self.module_file(node.module)) is not None:
                    found = self.rule_of_function(mod, alias.name, depth, seen)
                else:
                    found = None
                if found:
                    return found
        return None

    def imported_effects(self, froms: list[ast.ImportFrom], called: set[str], depth: int) -> dict[str, str]:
        """Names as called (``f`` / ``mod.f``, and the last part of a dotted name) -> rule, for imported helpers."""
        names = {n for c in called for n in (c, c.rsplit(".", 1)[-1])}
        return {name: rule for name in sorted(names) if (rule := self.imported_rule(froms, name, depth))}


def audit_patch(patch_text: str, tree_root: Path | Reader, gate: str, *,
                helpers: Reader | None = None, parsed: Parsed | None = None) -> list[Finding]:
    """Audit the ``.py`` files ``patch_text`` touches, as ``tree_root`` holds them; helpers read from ``helpers``
    (``parsed``: the helpers an earlier patch's audit parsed from the same reader)."""
    read = tree_root if not isinstance(tree_root, Path) else \
        lambda rel: (tree_root / rel).read_text() if (tree_root / rel).is_file() else None
    index = _HelperIndex(helpers or read, gate, RULES, parsed=parsed)
    findings: list[Finding] = []
    for pf in sorted((pf for pf in PatchSet(patch_text) if not pf.is_removed_file), key=lambda pf: pf.path):
        added = {ln.target_line_no for hunk in pf for ln in hunk if ln.is_added and ln.target_line_no is not None}
        if pf.path.endswith(".py") and added:  # the post-image lines it adds there
            findings += audit_patched_file(read(pf.path) or "", added, gate, RULES, file=pf.path, index=index)
    return findings


def audit_changes(git: Git, changes: Sequence[tuple[str, str, str, str]], final: str) -> list[Finding]:
    """Findings of each (entry, gate, before, after) change, its helpers read at ``final`` (the whole series): each
    file read and each helper parsed once."""
    batch, texts, parsed = BlobBatch(git), {}, {}

    def read(rev: str, rel: str) -> str | None:
        if (rev, rel) not in texts:
            data = batch.read(f"{rev}:{rel}")
            texts[rev, rel] = None if data is None or b"\0" in data else data.decode(errors="replace")
        return texts[rev, rel]

    try:
        return [replace(f, entry=name) for name, gate, before, after in changes
                for f in audit_patch(git.run("diff", "--text", "--no-color", "--no-renames", before, after, "--",
                                             "*.py").stdout,  # --text: a tree's `*.py -diff` hid every added line
                                     partial(read, after), gate, helpers=partial(read, final), parsed=parsed)]
    finally:
        batch.close()


def audit_series(series: Series, git: Git, rev: str, commit: str) -> list[Finding]:
    """Findings for every gated patch entry of the series replayed on ``commit`` (its trees before and after)."""
    trees: dict[str, tuple[str, str]] = {}
    with procs.scratch("c128audit-") as tmp:
        result, planned = replay_in_index(series, git, rev, commit, Path(tmp) / "index", trees=trees)
        if not result.ok:
            failed = result.error or next(f"{e.name}: {e.detail}" for e in result.entries if e.status in FAILED)
            raise C128Error(f"cannot audit on {rev}: the series does not apply ({failed})")
        final = index_git(git, Path(tmp) / "index").out("write-tree")
    return audit_changes(git, [(p.entry.name, p.entry.gate, *trees[p.entry.name]) for p in planned
                               if p.patch is not None and p.entry.gate and p.entry.name in trees], final)


def audit_branch(series: Series, git: Git, base: str, head: str = "HEAD") -> list[Finding]:
    """Findings for every gated patch entry on a patched branch: each entry commit against its parent."""
    gates = {e.name: e.gate for e in series.entries if e.is_patch and e.gate}
    return audit_changes(git, [(c.entry, gates[c.entry], c.parent, c.sha) for c in branch_commits(git, base, head)
                               if c.entry in gates], git.out("rev-parse", head))
