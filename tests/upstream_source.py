"""Running one upstream function or class out of its module, against a namespace the test
provides (stdlib only: the GPU tier imports it on a machine without the tool's deps).

`load_function` / `load_class` compile the source of one function / top-level class;
`required_globals` lists the module globals a function reads (annotations aside), and
`load_with_globals` refuses a namespace lacking one, so an upstream change to what the function
uses fails loudly instead of running against a stale stand-in.
"""

from __future__ import annotations

import ast
import builtins
import functools
import sys
import textwrap
import types
from pathlib import Path
from typing import List, Tuple


@functools.lru_cache(maxsize=64)
def _source(path: Path, mtime_ns: int) -> Tuple[str, ast.Module]:
    text = path.read_text()
    return text, ast.parse(text)


def parsed(path: Path) -> Tuple[str, ast.Module]:
    """(text, AST) of a source file, parsed once per version of it (the trees are read-only)."""
    return _source(Path(path), Path(path).stat().st_mtime_ns)


def function_node(path: Path, qualname: str) -> ast.FunctionDef:
    """`Class.method` or `function` in the module at `path`."""
    _, tree = parsed(path)
    scope: List[ast.stmt] = tree.body
    *outer, name = qualname.split(".")
    for cls in outer:
        scope = next(n for n in scope if isinstance(n, ast.ClassDef) and n.name == cls).body
    return next(
        n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
    )


def load_function(path: Path, qualname: str, namespace: dict) -> types.FunctionType:
    """Compile one function of an upstream module against `namespace` (its globals)."""
    node = function_node(path, qualname)
    lines = parsed(path)[0].splitlines()[node.lineno - 1 : node.end_lineno]
    source = "from __future__ import annotations\n" + textwrap.dedent("\n".join(lines))
    exec(compile(source, f"{path}:{qualname}", "exec"), namespace)
    return namespace[node.name]


def load_class(path: Path, name: str, namespace: dict) -> type:
    """Compile one top-level class of an upstream module against `namespace`."""
    text, tree = parsed(path)
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    lines = text.splitlines()[start - 1 : node.end_lineno]
    source = "from __future__ import annotations\n" + "\n".join(lines)
    namespace.setdefault("__name__", _namespace_module(namespace))
    exec(compile(source, f"{path}:{name}", "exec"), namespace)
    return namespace[name]


def _namespace_module(namespace: dict) -> str:
    """A sys.modules entry for `namespace` (dataclasses look string annotations up there)."""
    name = f"c128patch_upstream_{id(namespace)}"
    module = types.ModuleType(name)
    module.__dict__.update(namespace)
    sys.modules[name] = module
    return name


def required_globals(path: Path, qualname: str) -> set:
    """Names the function reads that it does not bind itself nor gets from builtins: what
    its module must provide (a namespace lacking one fails before the function runs)."""
    node = function_node(path, qualname)
    annotations = {  # not evaluated (the functions compile under `from __future__ import annotations`)
        id(sub)
        for n in ast.walk(node)
        for ann in (getattr(n, "annotation", None), getattr(n, "returns", None))
        if isinstance(ann, ast.AST)
        for sub in ast.walk(ann)
    }
    loads, bound = set(), set()
    for n in ast.walk(node):
        if id(n) in annotations:
            continue
        if isinstance(n, ast.Name):
            (loads if isinstance(n.ctx, ast.Load) else bound).add(n.id)
        elif isinstance(n, ast.arg):
            bound.add(n.arg)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n is not node:
            bound.add(n.name)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            bound.add(n.name)
    return loads - bound - set(dir(builtins))


def load_with_globals(path: Path, qualname: str, namespace: dict) -> types.FunctionType:
    """`load_function`, refusing a namespace that lacks a global the function reads (so an
    upstream change to what it uses fails loudly, naming the names)."""
    missing = required_globals(path, qualname) - set(namespace)
    if missing:
        raise AssertionError(f"{path}:{qualname} reads globals the test does not provide: {sorted(missing)}")
    return load_function(path, qualname, namespace)


