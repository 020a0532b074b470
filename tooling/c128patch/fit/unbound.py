"""Names our lines read that nothing binds where they run: upstream renames a local (``ragged_layout``) and our added
``f(layout=ragged_layout)`` reads a global no module defines, a NameError only when that line runs (gates off too,
where the arguments are evaluated before our early return). Python's own ``symtable`` says which names a function
binds, an enclosing one binds, or it takes from its module."""

from __future__ import annotations

import ast
import bisect
import builtins
import symtable

from c128patch.fit.resolve import nodes

_MODULE = {"__name__", "__file__", "__doc__", "__spec__", "__loader__", "__package__", "__builtins__", "__path__",
           "__annotations__", "__dict__"}
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
           ast.GeneratorExp)
_TABLE_NAMES = {ast.Lambda: "lambda", ast.ListComp: "listcomp", ast.SetComp: "setcomp", ast.DictComp: "dictcomp",
                ast.GeneratorExp: "genexpr"}


def unbound(tree: ast.Module, text: str, path: str, lines: set[int] | None) -> list[tuple[int, str, str]]:
    """(line, name, function) for each name a function reads on ``lines`` (None: every line) that neither it, an
    enclosing function, its module nor the builtins bind; none in a module with a ``*`` import (it binds names
    nobody can list)."""
    reads = _reads(tree, sorted(lines) if lines is not None else None)
    if not reads or "import *" in text and any(isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names)
                                               for n in nodes(tree)):
        return []
    try:
        top = symtable.symtable(text, path, "exec")
    except (SyntaxError, ValueError, RecursionError):
        return []
    known = set(dir(builtins)) | _MODULE | {s.get_name() for s in top.get_symbols()
                                            if s.is_assigned() or s.is_imported() or s.is_namespace()}
    missing: dict[tuple[str, int], set[str]] = {}  # (table name, line) -> names it takes from a module lacking them
    todo = list(top.get_children())
    while todo:
        table = todo.pop()
        todo += table.get_children()
        known |= {s.get_name() for s in table.get_symbols() if s.is_declared_global() and s.is_assigned()}
        if table.get_type() == "function":
            missing.setdefault((table.get_name(), table.get_lineno()), set()).update(
                s.get_name() for s in table.get_symbols()
                if s.is_referenced() and s.is_global() and not s.is_declared_global())
    found = []
    for scope, name in reads:
        key = (getattr(scope, "name", None) or _TABLE_NAMES[type(scope)], scope.lineno)
        if name.id not in known and name.id in missing.get(key, ()):
            found.append((name.lineno, name.id, key[0]))
    return sorted(set(found))


def _reads(tree: ast.Module, lines: list[int] | None) -> list[tuple[ast.AST, ast.Name]]:
    """(innermost function scope, name) of each name read on ``lines`` (sorted) inside a function, annotations left
    out (they are not run under ``from __future__ import annotations``); no subtree without one of ``lines`` is
    walked."""
    out, todo = [], [(tree, None)]
    while todo:  # not recursive: a file's nesting is input
        node, scope = todo.pop()
        skip = {id(a) for a in _annotations(node)}
        for child in ast.iter_child_nodes(node):
            if id(child) in skip or lines is not None and hasattr(child, "lineno") and not _spans(child, lines):
                continue
            if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Load) and scope is not None \
                    and (lines is None or child.lineno in lines):
                out.append((scope, child))
            todo.append((child, child if isinstance(child, _SCOPES) else scope))
    return out


def _spans(node: ast.AST, lines: list[int]) -> bool:
    """Does ``node`` hold one of ``lines`` (sorted)?"""
    at = bisect.bisect_left(lines, node.lineno)
    return at < len(lines) and lines[at] <= (getattr(node, "end_lineno", None) or node.lineno)


def _annotations(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.arg):
        return [node.annotation] if node.annotation else []
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return [node.returns] if node.returns else []
    if isinstance(node, ast.AnnAssign):
        return [node.annotation]
    return []
