"""The part of the behavioural tier that needs no interpreter with sglang's dependencies (stdlib only:
the tier's subprocess loads this file by path and runs ``check`` while its forked children import): every
``sglang`` import of each module the tier checks, resolved against the tree's files (``ast``). The
imported module must exist there (a ``.py`` file, a package or a namespace folder) and each name a
``from`` import takes must be defined at its module level (def, class, assignment, import, or a
submodule). Imports an ``except ImportError`` guards and ``if TYPE_CHECKING:`` blocks are left out.

It runs whether or not a module imported (without torch, it is all that runs). A name or module
missing is a failure; resolving is never counted as a pass of the module (it stays "not checked"
when it did not import).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

PACKAGE = "sglang"
_GUARDS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


@dataclass
class Use:
    line: int
    module: str
    names: tuple[str, ...]  # empty: ``import module``

    def text(self) -> str:
        return f"from {self.module} import {', '.join(self.names)}" if self.names else f"import {self.module}"


def _guarded(handlers: list[ast.ExceptHandler]) -> bool:
    for h in handlers:
        types = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
        if h.type is None or any(isinstance(t, ast.Name) and t.id in _GUARDS for t in types):
            return True
    return False


def _uses(tree: ast.AST, package: str) -> Iterator[Use]:
    """The sglang imports of a module, outside import guards and TYPE_CHECKING blocks."""
    def walk(node: ast.AST) -> Iterator[Use]:
        if isinstance(node, ast.Try) and _guarded(node.handlers):
            for child in [*node.orelse, *node.finalbody]:
                yield from walk(child)
            return
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                yield from walk(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    yield Use(node.lineno, alias.name, ())
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = parts[: len(parts) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] == PACKAGE:
                yield Use(node.lineno, module, tuple(a.name for a in node.names if a.name != "*"))
        for child in ast.iter_child_nodes(node):
            yield from walk(child)
    yield from walk(tree)


class _Tree:
    """Module files of a tree's ``python/`` folder, their top-level names, parsed once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._names: dict[Path, set[str] | None] = {}

    def file(self, module: str) -> Path | None:
        """The module's file (``__init__.py`` for a package); a namespace folder is the folder itself."""
        base = self.root.joinpath(*module.split("."))
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return path
        return base if base.is_dir() else None

    def names(self, path: Path) -> set[str] | None:
        """Names defined at the module level of ``path``; None: anything goes (``__getattr__``, ``import *``)."""
        if path not in self._names:
            self._names[path] = _top_names(ast.parse(path.read_text(errors="replace")))
        return self._names[path]


def _top_names(tree: ast.Module) -> set[str] | None:
    names: set[str] = set()

    def add_target(t: ast.AST) -> None:
        for n in ast.walk(t):
            if isinstance(n, ast.Name):
                names.add(n.id)

    def visit(body: list[ast.stmt]) -> bool:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    add_target(t)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                add_target(node.target)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    if a.name == "*":
                        return False
                    names.add(a.asname or a.name.split(".")[0])
            elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
                blocks = [getattr(node, k, []) for k in ("body", "orelse", "finalbody")]
                blocks += [h.body for h in getattr(node, "handlers", [])]
                if isinstance(node, ast.For):
                    add_target(node.target)
                if not all(visit(b) for b in blocks):
                    return False
        return True

    if not visit(tree.body) or "__getattr__" in names:
        return None
    return names


def _problem(tree: _Tree, use: Use) -> str:
    path = tree.file(use.module)
    if path is None:
        return f"no module {use.module} on this tree"
    if not use.names:
        return ""
    defined = None if path.is_dir() else tree.names(path)
    if defined is None and not path.is_dir():
        return ""
    missing = [n for n in use.names if not (defined and n in defined) and tree.file(f"{use.module}.{n}") is None]
    if not missing:
        return ""
    where = path.relative_to(tree.root.parent).as_posix()
    return f"{where} defines no {', '.join(missing)}"


def check(root: Path, modules: list[str]) -> dict[str, dict]:
    """module -> {"status": "ok" | "failed", "detail", "imports": N} for each of ``modules`` under ``root``
    (a tree's ``python/`` folder)."""
    tree = _Tree(root)
    out: dict[str, dict] = {}
    for module in modules:
        path = tree.file(module)
        if path is None or path.is_dir():
            out[module] = {"status": "failed", "detail": f"no file for {module} on this tree", "imports": 0}
            continue
        rel = path.relative_to(root.parent).as_posix()
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        try:
            uses = list(_uses(ast.parse(path.read_text(errors="replace")), package))
        except SyntaxError as exc:
            out[module] = {"status": "failed", "detail": f"{rel}:{exc.lineno}: does not parse: {exc.msg}", "imports": 0}
            continue
        problems = []
        for use in uses:
            try:
                said = _problem(tree, use)
            except SyntaxError as exc:
                said = f"{use.module} does not parse ({exc.msg}, line {exc.lineno})"
            if said:
                problems.append(f"{rel}:{use.line}: {use.text()}: {said}")
        out[module] = ({"status": "failed", "detail": "; ".join(problems), "imports": len(uses)} if problems else
                       {"status": "ok", "detail": "", "imports": len(uses)})
    return out

