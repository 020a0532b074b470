"""Our uses of upstream in one Python file (``uses_in``): modules and names imported (through aliases
and relative imports), ``importlib.import_module`` of a literal or a module constant, attribute
chains from those bindings, the calls among them with their shape, and ``SGLANG_*`` names in string
literals."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Callable, Iterator

from c128patch.fit.resolve import BODIES, Def, absolute, chain_of, statements
from c128patch.fit.tree import PACKAGE, module_name

_ENV_NAME = re.compile(r"^SGLANG_[A-Z0-9_]+$")


@dataclass
class Use:
    """One use of upstream by our code: a dotted chain from a binding, maybe called."""

    site_path: str  # the tree path of our file
    line: int
    chain: list[str]  # [module-or-binding, attr, ...] already absolute: chain[0] is a module name
    call: tuple[int, tuple[str, ...]] | None = None  # (positional count, keywords); None: not called
    star: bool = False  # *args / **kwargs in the call: shape not checked
    kind: str = ""  # "env": an SGLANG_* string literal


def _nodes_on(tree: ast.Module, lines: set[int]) -> Iterator[ast.AST]:
    """The nodes of the statements that touch ``lines`` (a compound statement: its own expressions only)."""
    for stmt in statements(tree.body, None):
        if not any(n in lines for n in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)):
            continue
        if any(getattr(stmt, part, None) for part in BODIES):
            for name, value in ast.iter_fields(stmt):
                if name not in BODIES:
                    for child in value if isinstance(value, list) else [value]:
                        if isinstance(child, ast.AST):
                            yield from ast.walk(child)
        else:
            yield from ast.walk(stmt)


def _imports(path: str, tree: ast.Module, mine: Callable[[ast.AST], bool]) -> tuple[dict[str, list[str]], list[Use]]:
    """name -> the dotted chain each import in ``path`` binds, and the import statements' uses (ours only)."""
    module = module_name(path) or ""
    mod = Def("module", module, path, module=module)
    bindings: dict[str, list[str]] = {}
    uses: list[Use] = []
    for node in statements(tree.body, None):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    bindings[a.asname] = a.name.split(".")
                else:
                    bindings.setdefault(a.name.split(".")[0], [a.name.split(".")[0]])
                if mine(node) and a.name.split(".")[0] == PACKAGE:
                    uses.append(Use(path, node.lineno, a.name.split(".")))
        elif isinstance(node, ast.ImportFrom):
            source = absolute(node, mod)
            for a in node.names:
                if a.name == "*":
                    continue
                bindings[a.asname or a.name] = [*source.split("."), a.name]
                if mine(node) and source.split(".")[0] == PACKAGE:
                    uses.append(Use(path, node.lineno, [*source.split("."), a.name]))
    return bindings, uses


def uses_in(path: str, tree: ast.Module, lines: set[int] | None) -> list[Use]:
    """Our uses of ``sglang`` in one file (``lines``: ours; None: the whole file)."""
    mine = (lambda n: True) if lines is None else (lambda n: getattr(n, "lineno", 0) in lines)
    bindings, uses = _imports(path, tree, mine)
    constants = {t.id: s.value.value for s in tree.body  # the module's string constants
                 if isinstance(s, ast.Assign) and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str)
                 for t in s.targets if isinstance(t, ast.Name)}
    seen_funcs: set[int] = set()
    for node in (ast.walk(tree) if lines is None else _nodes_on(tree, lines)):
        if not mine(node):
            continue
        if isinstance(node, ast.Call):
            func = node.func
            chain = chain_of(func)
            if chain and chain[0] in bindings:
                star = any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords)
                shape = (len(node.args), tuple(k.arg for k in node.keywords if k.arg))
                uses.append(Use(path, node.lineno, bindings[chain[0]] + chain[1:], shape, star))
                seen_funcs.add(id(func))
            dotted = bindings.get(chain[0], [chain[0]]) + chain[1:] if chain else []
            if dotted[-2:] == ["importlib", "import_module"] and node.args:
                arg = node.args[0]
                target = arg.value if isinstance(arg, ast.Constant) else constants.get(getattr(arg, "id", ""))
                if isinstance(target, str) and target.split(".")[0] == PACKAGE:
                    uses.append(Use(path, node.lineno, target.split(".")))
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and id(node) not in seen_funcs:
            chain = chain_of(node)
            if chain and chain[0] in bindings:
                uses.append(Use(path, node.lineno, bindings[chain[0]] + chain[1:]))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _ENV_NAME.match(node.value):
            uses.append(Use(path, node.lineno, ["sglang", "srt", "environ", "envs", node.value], kind="env"))
    return [u for u in uses if u.chain and u.chain[0] == PACKAGE]
