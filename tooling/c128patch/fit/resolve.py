"""Resolving upstream names on one tree: a dotted name to its definition (``Def``: a module, class,
function, method, value or instance, with its file:line), through imports, re-exports, ``import *``,
class bases and module-level instances, as static analysis (``ast``) sees them; and the signature a
call binds to (``signature_of``: an ``inspect.Signature`` built from the AST)."""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass
from typing import Iterator

from c128patch.fit.tree import PACKAGE, PY_ROOT, Reader

_MAX_HOPS = 8


@dataclass
class Def:
    """What a name resolved to: a module, class, function or value, where, with its signature."""

    kind: str  # module | class | function | method | attr | value | instance | external | ours | unknown
    name: str
    path: str = ""
    line: int = 0
    node: ast.AST | None = None
    module: str = ""  # the module whose bindings the node's names use
    bound: bool = False  # a method reached through an instance (first parameter taken)
    static: bool = False
    cls: "Def | None" = None  # for an instance: its class
    why: str = ""

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}" if self.path else ""


class _Src:
    """A default value in a Signature, shown as its source text."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def signature_of(args: ast.arguments) -> inspect.Signature:
    P = inspect.Parameter
    params: list[inspect.Parameter] = []
    positional = [*args.posonlyargs, *args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    for i, (arg, default) in enumerate(zip(positional, defaults)):
        kind = P.POSITIONAL_ONLY if i < len(args.posonlyargs) else P.POSITIONAL_OR_KEYWORD
        params.append(P(arg.arg, kind, default=P.empty if default is None else _Src(ast.unparse(default))))
    if args.vararg:
        params.append(P(args.vararg.arg, P.VAR_POSITIONAL))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        params.append(P(arg.arg, P.KEYWORD_ONLY, default=P.empty if default is None else _Src(ast.unparse(default))))
    if args.kwarg:
        params.append(P(args.kwarg.arg, P.VAR_KEYWORD))
    return inspect.Signature(params)


def _decorators(node: ast.AST) -> set[str]:
    decorators = [d.func if isinstance(d, ast.Call) else d for d in getattr(node, "decorator_list", [])]
    return {d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", "") for d in decorators}


def _fields_signature(cls: ast.ClassDef) -> inspect.Signature:
    """A dataclass's or NamedTuple's constructor, from its annotated fields."""
    P = inspect.Parameter
    params = []
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            if "ClassVar" in ast.unparse(stmt.annotation):
                continue
            default = P.empty if stmt.value is None else _Src(ast.unparse(stmt.value))
            if params and params[-1].default is not P.empty and default is P.empty:
                default = _Src("?")  # a field(default=...) before: keep the Signature valid
            params.append(P(stmt.target.id, P.POSITIONAL_OR_KEYWORD, default=default))
    return inspect.Signature(params)


class Upstream:
    """Resolves dotted names on one tree; ``ours``: path -> our lines (None: the whole file)."""

    def __init__(self, reader: Reader, ours: dict[str, set[int] | None]) -> None:
        self.reader, self.ours = reader, ours
        self._folders = {f.rsplit("/", i)[0] + "/" for f in reader.files for i in range(1, f.count("/") + 1)}
        self._parsed: dict[str, ast.Module | None] = {}
        self.errors: dict[str, str] = {}  # path -> why it did not parse

    # -- modules
    def module_path(self, name: str) -> tuple[str, bool] | None:
        """(file, is_package) of module ``name`` on the tree; a folder without ``__init__`` is a namespace package."""
        base = PY_ROOT + "/" + name.replace(".", "/")
        if f"{base}.py" in self.reader.files:
            return f"{base}.py", False
        if f"{base}/__init__.py" in self.reader.files:
            return f"{base}/__init__.py", True
        if base + "/" in self._folders:
            return base + "/", True
        return None

    def parse(self, path: str) -> ast.Module | None:
        if path not in self._parsed:
            text = self.reader.text(path) if path.endswith(".py") else ""
            tree = None
            if text is not None:
                try:
                    tree = ast.parse(text, path)
                except (SyntaxError, ValueError) as exc:
                    self.errors[path] = (f"{path}:{getattr(exc, 'lineno', 0) or 0}: does not parse: "
                                         f"{getattr(exc, 'msg', exc)}")
            self._parsed[path] = tree
        return self._parsed[path]

    def is_ours(self, path: str, line: int) -> bool:
        if path not in self.ours:
            return False
        lines = self.ours[path]
        return lines is None or line in lines

    def module(self, name: str) -> Def:
        if name.split(".")[0] != PACKAGE:
            return Def("external", name)
        found = self.module_path(name)
        if found is None:
            return Def("missing", name, why=f"no module {name} ({PY_ROOT}/{name.replace('.', '/')}.py)")
        path, _ = found
        if self.ours.get(path, ...) is None and path in self.ours:
            return Def("ours", name, path, 1)
        if path.endswith(".py") and self.parse(path) is None:
            return Def("unknown", name, path, 1, why=self.errors.get(path, f"{path}: unreadable"))
        return Def("module", name, path, 1, module=name)

    # -- members
    def member(self, owner: Def, attr: str, hops: int = 0) -> Def:
        name = f"{owner.name}.{attr}"
        if hops > _MAX_HOPS:
            return Def("unknown", name, why="too many re-exports")
        if owner.kind == "module":
            return self._module_member(owner, attr, hops)
        if owner.kind in ("class", "instance"):
            cls = owner if owner.kind == "class" else owner.cls
            found = self._class_member(cls, attr, hops, set())
            found.name = name
            if owner.kind == "instance" and found.kind == "method" and not found.static:
                found.bound = True
            if owner.kind == "class" and found.kind == "method" and "classmethod" in _decorators(found.node):
                found.bound = True
            return found
        return Def("unknown", name, why=f"{owner.name} is a {owner.kind}")

    def _module_member(self, mod: Def, attr: str, hops: int) -> Def:
        name = f"{mod.name}.{attr}"
        tree = self.parse(mod.path) if mod.path.endswith(".py") else None
        if tree is not None:
            found = self._find_top(tree, attr)
            if found is not None:
                return self._from_stmt(found, attr, mod, hops)
            for star in [absolute(s, mod) for s in statements(tree.body)
                         if isinstance(s, ast.ImportFrom) and any(a.name == "*" for a in s.names)]:
                target = self.module(star)
                if target.kind == "module":
                    got = self._module_member(target, attr, hops + 1)
                    if got.kind != "missing":
                        return got
        sub = self.module(name)
        if sub.kind != "missing":
            return sub
        if tree is not None and self._find_top(tree, "__getattr__") is not None:
            return Def("unknown", name, mod.path, 1, why=f"{mod.name} resolves names in __getattr__")
        if mod.path.endswith(("__init__.py", "/")):
            return Def("missing", name, mod.path, 1,
                       why=f"no module {name} on this tree ({mod.path} defines no {attr})")
        return Def("missing", name, mod.path, 1, why=f"{mod.path} defines no {attr}")

    def _find_top(self, tree: ast.Module, attr: str) -> ast.stmt | None:
        """The statement at the module's top binding ``attr`` last (it wins, as at run time)."""
        return next((s for s in reversed(list(statements(tree.body))) if _binds(s, attr)), None)

    def _from_stmt(self, stmt: ast.stmt, attr: str, mod: Def, hops: int) -> Def:
        name = f"{mod.name}.{attr}"
        if isinstance(stmt, ast.ImportFrom):
            alias = next(a for a in stmt.names if (a.asname or a.name) == attr)
            source = absolute(stmt, mod)
            target = self.module(source)
            if target.kind != "module":
                return target
            return self.member(target, alias.name, hops + 1)
        if isinstance(stmt, ast.Import):
            alias = next(a for a in stmt.names if (a.asname or a.name.split(".")[0]) == attr)
            return self.module(alias.name if alias.asname else alias.name.split(".")[0])
        if self.is_ours(mod.path, stmt.lineno):
            return Def("ours", name, mod.path, stmt.lineno)
        if isinstance(stmt, ast.ClassDef):
            return Def("class", name, mod.path, stmt.lineno, stmt, mod.module)
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return Def("function", name, mod.path, stmt.lineno, stmt, mod.module)
        return self._value(stmt, name, mod.path, mod.module, hops)

    def _value(self, stmt: ast.stmt, name: str, path: str, module: str, hops: int) -> Def:
        """An assignment: an instance when its value calls an upstream class, else a value."""
        value = getattr(stmt, "value", None)
        found = Def("value", name, path, stmt.lineno, stmt, module)
        if isinstance(value, ast.Call) and module:
            called = self.expr(value.func, module, hops + 1)
            if called.kind == "class":
                found.kind, found.cls = "instance", called
        return found

    def _class_member(self, cls: Def, attr: str, hops: int, seen: set[str]) -> Def:
        node = cls.node
        assert isinstance(node, ast.ClassDef)
        key = f"{cls.path}:{cls.line}"
        if key in seen:
            return Def("unknown", attr, why="cyclic bases")
        seen.add(key)
        for stmt in node.body:
            if _binds(stmt, attr):
                if self.is_ours(cls.path, stmt.lineno):
                    return Def("ours", attr, cls.path, stmt.lineno)
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    decos = _decorators(stmt)
                    kind = "attr" if "property" in decos or "cached_property" in decos else "method"
                    return Def(kind, attr, cls.path, stmt.lineno, stmt, cls.module, static="staticmethod" in decos)
                if isinstance(stmt, ast.ClassDef):
                    return Def("class", attr, cls.path, stmt.lineno, stmt, cls.module)
                found = self._value(stmt, attr, cls.path, cls.module, hops)
                found.kind = "instance" if found.kind == "instance" else "attr"
                return found
        unknown = []
        for base in node.bases:
            got = self.expr(base, cls.module, hops + 1)
            if got.kind == "class":
                found = self._class_member(got, attr, hops + 1, seen)
                if found.kind != "missing":
                    return found
            elif ast.unparse(base) not in ("object", "Generic") and not ast.unparse(base).startswith("Generic["):
                unknown.append(ast.unparse(base))
        if unknown or any(_binds(s, "__getattr__") for s in node.body):
            return Def("unknown", attr, cls.path, cls.line,
                       why=f"{node.name} has bases outside sglang ({', '.join(unknown)})")
        return Def("missing", attr, cls.path, cls.line, why=f"class {node.name} ({cls.where}) has no {attr}")

    # -- expressions in an upstream module's context (bases, decorators, called classes)
    def expr(self, node: ast.AST, module: str, hops: int = 0) -> Def:
        chain = chain_of(node)
        if not chain:
            return Def("unknown", ast.unparse(node))
        mod = self.module(module)
        if mod.kind != "module":
            return mod
        first = self._module_member(mod, chain[0], hops + 1) if hops <= _MAX_HOPS else Def("unknown", chain[0])
        if first.kind == "missing":
            return Def("external", chain[0])  # a builtin or a name we cannot see
        for attr in chain[1:]:
            if first.kind not in ("module", "class", "instance"):
                break
            first = self.member(first, attr, hops + 1)
        return first

    def signature(self, d: Def) -> tuple[str, inspect.Signature | None]:
        """The text the lock hashes, and the Signature a call binds to (None: no callable signature)."""
        node = d.node
        if d.kind in ("function", "method") and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            full = signature_of(node.args)
            return f"def {node.name}{full}", _unbound(full) if d.bound else full
        if d.kind == "class" and isinstance(node, ast.ClassDef):
            head = f"class {node.name}({', '.join(ast.unparse(b) for b in node.bases)})"
            init = self._class_member(d, "__init__", 0, set())
            if init.kind == "method" and isinstance(init.node, ast.FunctionDef):
                full = signature_of(init.node.args)
                return f"{head}: __init__{full}", _unbound(full)
            if "dataclass" in _decorators(node) or any("NamedTuple" in ast.unparse(b) for b in node.bases):
                sig = _fields_signature(node)
                return f"{head}: {sig}", sig
            return head, None
        if d.kind in ("attr", "value", "instance") and node is not None:
            value = getattr(node, "value", None)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return f"@property {node.name}", None
            text = ast.unparse(value) if value is not None else ast.unparse(getattr(node, "annotation", node))
            return f"= {text}", None
        return "", None


def _unbound(sig: inspect.Signature) -> inspect.Signature:
    """``sig`` without its first parameter (``self``/``cls``, taken by binding)."""
    return sig.replace(parameters=list(sig.parameters.values())[1:])


BODIES = ("body", "orelse", "finalbody", "handlers", "cases")
_AT_TOP = (ast.If, ast.Try, ast.With, ast.ExceptHandler)  # what a module's top runs the body of


def statements(body: list, into: tuple[type, ...] | None = _AT_TOP) -> Iterator[ast.AST]:
    """The statements of ``body``, and those inside the ``into`` statements (None: inside every one)."""
    for stmt in body:
        yield stmt
        if into is None or isinstance(stmt, into):
            for part in BODIES:
                yield from statements(getattr(stmt, part, None) or [], into)


def _binds(stmt: ast.stmt, name: str) -> bool:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return stmt.name == name
    if isinstance(stmt, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets)
    if isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        return isinstance(stmt.target, ast.Name) and stmt.target.id == name
    if isinstance(stmt, ast.ImportFrom):
        return any((a.asname or a.name) == name for a in stmt.names if a.name != "*")
    if isinstance(stmt, ast.Import):
        return any((a.asname or a.name.split(".")[0]) == name for a in stmt.names)
    return False


def absolute(stmt: ast.ImportFrom, mod: Def) -> str:
    if not stmt.level:
        return stmt.module or ""
    parts = mod.module.split(".")
    package = parts if mod.path.endswith("__init__.py") or mod.path.endswith("/") else parts[:-1]
    base = package[: len(package) - (stmt.level - 1)] if stmt.level > 1 else package
    return ".".join(base + ([stmt.module] if stmt.module else []))


def chain_of(node: ast.AST) -> list[str]:
    """``a.b.c`` -> [a, b, c]; anything else -> []."""
    out = []
    while isinstance(node, ast.Attribute):
        out.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(out)]
    return []
