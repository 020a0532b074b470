"""The series' API contract: the upstream surface our code uses, derived from a patched tree and
checked on any tree.

*Our code* is every overlay file and every line a patch adds (``git diff`` of the tree against its
upstream commit). From it (``ast`` for Python) we collect each use of upstream: modules and names
imported (through aliases and relative imports), ``importlib.import_module`` of a literal or a
module constant, attribute chains through modules, classes, module-level instances (``envs =
Envs()``) and their members, the calls among them with their shape (positional count, keyword
names), and ``SGLANG_*`` names in string literals (declared on ``envs``). Each is resolved on the
tree to upstream's definition; definitions that are ours (an overlay, a line a patch adds) and
anything outside ``sglang`` are left out. For the CUDA side (``fit.contract_cxx``): the upstream
headers our ``.cuh`` code includes, and each upstream name it uses with its declarations.

``check`` resolves every use on a tree: a missing module, name, attribute or header is an error; a
call that does not bind to the definition's signature (``inspect.Signature`` built from the AST,
``Signature.bind``) is an error; a definition whose signature hash is not the one the lock
recorded at the base (or accepted since) is a warning: it binds, but order, defaults or kinds
changed (a same-arity parameter swap is caught here). Each finding names our file:line,
upstream's file:line and both signatures.
"""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath
from typing import Iterator

from c128patch.errors import C128Error
from c128patch.fit import contract_cxx as cxx
from c128patch.git import Git
from c128patch.series.contract import Lock, LockItem, sig_hash
from c128patch.series.manifest import Series

PY_ROOT = "python"
PACKAGE = "sglang"
_ENV_NAME = re.compile(r"^SGLANG_[A-Z0-9_]+$")
_MAX_HOPS = 8


# ---------------------------------------------------------------------------- reading a tree
class TreeReader:
    """Files of one tree-ish in a repository, read through one ``git cat-file --batch``."""

    def __init__(self, git: Git, rev: str) -> None:
        self.git, self.rev = git, rev
        self.files = set(git.out("ls-tree", "-r", "--name-only", rev, "--", f"{PY_ROOT}/{PACKAGE}").splitlines())
        self._texts: dict[str, str | None] = {}
        self._proc: subprocess.Popen | None = None

    def _batch(self) -> subprocess.Popen:
        if self._proc is None:
            cwd = self.git.worktree or self.git.git_dir
            self._proc = subprocess.Popen(["git", "cat-file", "--batch"], cwd=cwd, env=self.git._base_env(),
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        return self._proc

    def text(self, path: str) -> str | None:
        if path in self._texts:
            return self._texts[path]
        text = None
        if path in self.files:
            proc = self._batch()
            proc.stdin.write(f"{self.rev}:{path}\n".encode())
            proc.stdin.flush()
            header = proc.stdout.readline().split()
            if len(header) == 3:
                data = proc.stdout.read(int(header[2]) + 1)[:-1]
                text = None if b"\0" in data else data.decode(errors="replace")
        self._texts[path] = text
        return text

    def close(self) -> None:
        if self._proc is not None:
            self._proc.stdin.close()
            self._proc.wait()
            self._proc = None


def our_lines(git: Git, upstream: str, head: str, paths: list[str],
              hunks: dict[str, list[tuple[int, int, int, int]]] | None = None) -> dict[str, set[int]]:
    """path -> the line numbers on ``head`` that ``upstream..head`` adds (``git diff -U0``); ``hunks``, when
    given, gets each file's (old start, old count, new start, new count)."""
    out: dict[str, set[int]] = {}
    if not paths:
        return out
    current = ""
    for line in git.out("diff", "-U0", "--no-renames", "--no-color", upstream, head, "--", *paths).splitlines():
        if line.startswith("+++ "):
            current = line[6:] if line.startswith("+++ b/") else ""
        elif line.startswith("@@") and current:
            m = re.match(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", line)
            if m:
                old, old_n, start, count = int(m.group(1)), int(m.group(2) or 1), int(m.group(3)), int(m.group(4) or 1)
                out.setdefault(current, set()).update(range(start, start + count))
                if hunks is not None:
                    hunks.setdefault(current, []).append((old, old_n, start, count))
    return out


def upstream_line(hunks: list[tuple[int, int, int, int]], line: int) -> int:
    """A line of the patched file (not one the patch adds) as it numbers in upstream's file."""
    delta = 0
    for _old, old_n, start, count in hunks:
        if (count and start + count - 1 < line) or (not count and start < line):
            delta += count - old_n
    return line - delta


# ---------------------------------------------------------------------------- upstream objects
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
    names = set()
    for d in getattr(node, "decorator_list", []):
        d = d.func if isinstance(d, ast.Call) else d
        names.add(d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", ""))
    return names


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

    def __init__(self, reader: TreeReader, ours: dict[str, set[int] | None]) -> None:
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
                    self.errors[path] = f"{path}:{getattr(exc, 'lineno', 0) or 0}: does not parse: {getattr(exc, 'msg', exc)}"
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
            for star in self._stars(tree, mod):
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
            return Def("missing", name, mod.path, 1, why=f"no module {name} on this tree ({mod.path} defines no {attr})")
        return Def("missing", name, mod.path, 1, why=f"{mod.path} defines no {attr}")

    @staticmethod
    def _top_statements(body: list[ast.stmt]):
        for stmt in body:
            yield stmt
            if isinstance(stmt, (ast.If, ast.Try, ast.With)):
                for part in ("body", "orelse", "finalbody"):
                    yield from Upstream._top_statements(getattr(stmt, part, []) or [])
                for handler in getattr(stmt, "handlers", []):
                    yield from Upstream._top_statements(handler.body)

    def _find_top(self, tree: ast.Module, attr: str) -> ast.stmt | None:
        found = None
        for stmt in self._top_statements(tree.body):
            if _binds(stmt, attr):
                found = stmt  # the last binding wins, as at run time
        return found

    def _stars(self, tree: ast.Module, mod: Def) -> list[str]:
        return [_absolute(s, mod) for s in self._top_statements(tree.body)
                if isinstance(s, ast.ImportFrom) and any(a.name == "*" for a in s.names)]

    def _from_stmt(self, stmt: ast.stmt, attr: str, mod: Def, hops: int) -> Def:
        name = f"{mod.name}.{attr}"
        if isinstance(stmt, ast.ImportFrom):
            alias = next(a for a in stmt.names if (a.asname or a.name) == attr)
            source = _absolute(stmt, mod)
            target = self.module(source)
            if target.kind != "module":
                return target
            got = self.member(target, alias.name, hops + 1)
            return got
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
            return Def("unknown", attr, cls.path, cls.line, why=f"{node.name} has bases outside sglang ({', '.join(unknown)})")
        return Def("missing", attr, cls.path, cls.line, why=f"class {node.name} ({cls.where}) has no {attr}")

    # -- expressions in an upstream module's context (bases, decorators, called classes)
    def expr(self, node: ast.AST, module: str, hops: int = 0) -> Def:
        chain = _chain(node)
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
            sig = signature_of(node.args)
            if d.bound and sig.parameters:
                sig = sig.replace(parameters=list(sig.parameters.values())[1:])
            full = signature_of(node.args)
            return f"def {node.name}{full}", sig
        if d.kind == "class" and isinstance(node, ast.ClassDef):
            head = f"class {node.name}({', '.join(ast.unparse(b) for b in node.bases)})"
            init = self._class_member(d, "__init__", 0, set())
            if init.kind == "method" and isinstance(init.node, ast.FunctionDef):
                full = signature_of(init.node.args)
                return f"{head}: __init__{full}", full.replace(parameters=list(full.parameters.values())[1:])
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


def _absolute(stmt: ast.ImportFrom, mod: Def) -> str:
    if not stmt.level:
        return stmt.module or ""
    parts = mod.module.split(".")
    package = parts if mod.path.endswith("__init__.py") or mod.path.endswith("/") else parts[:-1]
    base = package[: len(package) - (stmt.level - 1)] if stmt.level > 1 else package
    return ".".join(base + ([stmt.module] if stmt.module else []))


def _chain(node: ast.AST) -> list[str]:
    """``a.b.c`` -> [a, b, c]; anything else -> []."""
    out = []
    while isinstance(node, ast.Attribute):
        out.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(out)]
    return []


# ---------------------------------------------------------------------------- our uses
@dataclass
class Use:
    """One use of upstream by our code: a dotted chain from a binding, maybe called."""

    site_path: str  # the tree path of our file
    line: int
    chain: list[str]  # [module-or-binding, attr, ...] already absolute: chain[0] is a module name
    call: tuple[int, tuple[str, ...]] | None = None  # (positional count, keywords); None: not called
    star: bool = False  # *args / **kwargs in the call: shape not checked
    kind: str = ""  # "env": an SGLANG_* string literal


def _module_of(path: str) -> str:
    rel = PurePosixPath(path).relative_to(PY_ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


_BODIES = ("body", "orelse", "finalbody", "handlers", "cases")


def _statements(body: list) -> Iterator[ast.AST]:
    """Every statement under ``body`` (compound ones and what they hold), not the expressions."""
    for stmt in body:
        yield stmt
        for part in _BODIES:
            yield from _statements(getattr(stmt, part, None) or [])


def _nodes_on(tree: ast.Module, lines: set[int]) -> Iterator[ast.AST]:
    """The nodes of the statements that touch ``lines`` (a compound statement: its own expressions only)."""
    for stmt in _statements(tree.body):
        if not any(n in lines for n in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)):
            continue
        if any(getattr(stmt, part, None) for part in _BODIES):
            for name, value in ast.iter_fields(stmt):
                if name not in _BODIES:
                    for child in value if isinstance(value, list) else [value]:
                        if isinstance(child, ast.AST):
                            yield from ast.walk(child)
        else:
            yield from ast.walk(stmt)


def _constants(tree: ast.Module) -> dict[str, str]:
    out = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
            for t in stmt.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = stmt.value.value
    return out


def uses_in(path: str, tree: ast.Module, lines: set[int] | None) -> list[Use]:
    """Our uses of ``sglang`` in one file (``lines``: ours; None: the whole file)."""
    module = _module_of(path)
    mod = Def("module", module, path, module=module)
    bindings: dict[str, list[str]] = {}
    uses: list[Use] = []
    mine = (lambda n: True) if lines is None else (lambda n: getattr(n, "lineno", 0) in lines)
    for node in _statements(tree.body):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    bindings[a.asname] = a.name.split(".")
                else:
                    bindings.setdefault(a.name.split(".")[0], [a.name.split(".")[0]])
                if mine(node) and a.name.split(".")[0] == PACKAGE:
                    uses.append(Use(path, node.lineno, a.name.split(".")))
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(node, mod)
            for a in node.names:
                if a.name == "*":
                    continue
                bindings[a.asname or a.name] = [*source.split("."), a.name]
                if mine(node) and source.split(".")[0] == PACKAGE:
                    uses.append(Use(path, node.lineno, [*source.split("."), a.name]))
    constants = _constants(tree)
    seen_funcs: set[int] = set()
    for node in (ast.walk(tree) if lines is None else _nodes_on(tree, lines)):
        if not mine(node):
            continue
        if isinstance(node, ast.Call):
            func = node.func
            chain = _chain(func)
            if chain and chain[0] in bindings:
                star = any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords)
                shape = (len(node.args), tuple(k.arg for k in node.keywords if k.arg))
                uses.append(Use(path, node.lineno, bindings[chain[0]] + chain[1:], shape, star))
                seen_funcs.add(id(func))
            if chain and (bindings.get(chain[0], [chain[0]]) + chain[1:])[-2:] == ["importlib", "import_module"] and node.args:
                arg = node.args[0]
                target = arg.value if isinstance(arg, ast.Constant) else constants.get(getattr(arg, "id", ""))
                if isinstance(target, str) and target.split(".")[0] == PACKAGE:
                    uses.append(Use(path, node.lineno, target.split(".")))
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and id(node) not in seen_funcs:
            chain = _chain(node)
            if chain and chain[0] in bindings:
                uses.append(Use(path, node.lineno, bindings[chain[0]] + chain[1:]))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _ENV_NAME.match(node.value):
            uses.append(Use(path, node.lineno, ["sglang", "srt", "environ", "envs", node.value], kind="env"))
    return [u for u in uses if u.chain and u.chain[0] == PACKAGE]


# ---------------------------------------------------------------------------- resolving and checking
@dataclass
class Item:
    """One resolved use: what the lock records and a check compares."""

    kind: str
    target: str
    site: str
    where: str = ""
    signature: str = ""
    shape: str = ""
    bind_error: str = ""

    @property
    def sig(self) -> str:
        return sig_hash(self.signature)

    def lock_item(self) -> LockItem:
        return LockItem(self.kind, self.target, self.site, self.where, (self.sig,), self.shape, self.signature)


@dataclass
class Finding:
    level: str  # error | warning | note
    message: str
    site: str = ""
    where: str = ""
    target: str = ""
    recorded: str = ""
    now: str = ""

    def __str__(self) -> str:
        return self.message


@dataclass
class ContractResult:
    items: list[Item] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    cxx_probe: str = ""  # what the nvcc probe said
    seconds: float = 0.0

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors and not self.warnings

    def verdict(self) -> str:
        n = len({(i.kind, i.target) for i in self.items})
        if self.errors:
            return f"broken: {len(self.errors)} error(s), {len(self.warnings)} warning(s) over {n} upstream definition(s)"
        if self.warnings:
            return f"changed: {len(self.warnings)} upstream signature(s) differ from the lock ({n} definition(s) checked)"
        return f"holds: {n} upstream definition(s) resolved and bound"

    def to_json(self) -> dict:
        return {"ok": self.ok, "verdict": self.verdict(), "errors": len(self.errors), "warnings": len(self.warnings),
                "findings": [asdict(f) for f in self.findings], "items": [asdict(i) for i in self.items],
                "cxx_probe": self.cxx_probe, "seconds": round(self.seconds, 3)}


def _shape_text(call: tuple[int, tuple[str, ...]] | None, star: bool) -> str:
    if call is None:
        return ""
    n, kws = call
    return f"{n}" + "".join(f",{k}=" for k in kws) + (",*" if star else "")


def _binds_to(sig: inspect.Signature, call: tuple[int, tuple[str, ...]]) -> str:
    n, kws = call
    try:
        sig.bind(*[None] * n, **{k: None for k in kws})
    except TypeError as exc:
        return str(exc)
    return ""


def _site_name(series: Series | None, path: str) -> str:
    """Our file as the series names it: an overlay's source, else the tree path."""
    if series is not None:
        for e in series.entries:
            if not e.is_patch and e.target == path:
                return e.source
    return path


def derive(series: Series | None, git: Git, upstream: str, head: str) -> tuple[list[Item], list[Finding]]:
    """Every use of upstream by our code on ``head`` (a patched tree-ish over ``upstream``), resolved there."""
    reader = TreeReader(git, head)
    try:
        changed = git.out("diff", "--name-only", "--no-renames", "--diff-filter=AM", upstream, head).splitlines()
        overlay_targets = {e.target for e in (series.entries if series else []) if not e.is_patch}
        patched = [p for p in changed if p not in overlay_targets]
        ours: dict[str, set[int] | None] = {p: None for p in changed if p in overlay_targets}
        hunks: dict[str, list[tuple[int, int, int, int]]] = {}
        ours.update(our_lines(git, upstream, head, patched, hunks))
        up = Upstream(reader, ours)
        items: list[Item] = []
        findings: list[Finding] = []
        for path in sorted(ours):
            if not path.endswith(".py") or not path.startswith(f"{PY_ROOT}/"):
                continue
            tree = up.parse(path)
            if tree is None:
                findings.append(Finding("error", up.errors.get(path, f"{path}: unreadable"), site=path))
                continue
            for use in uses_in(path, tree, ours[path]):
                items_of, found = _resolve_use(up, use, _site_name(series, path))
                items += items_of
                findings += found
        for path, why in sorted(up.errors.items()):
            if path not in ours:
                findings.append(Finding("error", f"upstream code does not parse: {why}", where=path))
        c_items, c_findings = cxx.derive(reader, {p: l for p, l in ours.items()}, lambda p: _site_name(series, p))
        items += [Item(**i) for i in c_items]
        findings += [Finding(**f) for f in c_findings]
    finally:
        reader.close()
    for item in items:  # upstream's definitions as upstream numbers them: our patches shift no lock line
        path, _, line = item.where.rpartition(":")
        if path in hunks and line.isdigit():
            item.where = f"{path}:{upstream_line(hunks[path], int(line))}"
    unique = {(i.kind, i.target, i.site): i for i in items}
    return sorted(unique.values(), key=lambda i: (i.kind, i.target, i.site)), findings


def _resolve_use(up: Upstream, use: Use, site_file: str) -> tuple[list[Item], list[Finding]]:
    site = f"{site_file}:{use.line}"
    items: list[Item] = []
    findings: list[Finding] = []
    chain = use.chain
    # the longest module prefix, then attributes
    current: Def | None = None
    at = 0
    for i in range(len(chain), 0, -1):
        if up.module_path(".".join(chain[:i])) is not None:
            current, at = up.module(".".join(chain[:i])), i
            break
    if current is None:
        name = ".".join(chain[:2]) if len(chain) > 1 else chain[0]
        findings.append(Finding("error", f"{site}: {'.'.join(chain)}: no module {name} on this tree", site, "", ".".join(chain)))
        return items, findings
    if current.kind == "ours":
        return items, findings
    if current.kind == "unknown":
        findings.append(Finding("error", f"{site}: {current.why}", site, current.where, current.name))
        return items, findings
    last: Item = Item("module", current.name, site, current.where)
    for attr in chain[at:]:
        if current.kind not in ("module", "class", "instance"):
            break  # a value or function: what it holds is not upstream's surface we can see
        nxt = up.member(current, attr)
        if nxt.kind in ("ours", "external"):
            break
        if nxt.kind == "missing":
            findings.append(Finding("error", f"{site}: {'.'.join(chain)}: {nxt.why}", site, nxt.where, nxt.name))
            return items, findings
        if nxt.kind == "unknown":
            findings.append(Finding("note", f"{site}: {nxt.name}: not resolved statically ({nxt.why})", site, nxt.where,
                                    nxt.name))
            break
        current = nxt
        text, _ = up.signature(current)
        kind = {"instance": "value"}.get(current.kind, current.kind)
        if use.kind == "env" and attr == chain[-1]:
            kind = "env"
        last = Item(kind, current.name, site, current.where, text)
    else:
        if use.call is not None and current.kind in ("function", "method", "class") and chain[at:]:
            text, sig = up.signature(current)
            last.shape = _shape_text(use.call, use.star)
            if sig is not None and not use.star:
                last.bind_error = _binds_to(sig, use.call)
                if last.bind_error:
                    findings.append(Finding(
                        "error", f"{site}: call {current.name}({_call_text(use.call)}) does not bind to "
                                 f"{current.where} `{text}`: {last.bind_error}", site, current.where, current.name,
                        now=text))
    items.append(last)
    return items, findings


def _call_text(call: tuple[int, tuple[str, ...]]) -> str:
    n, kws = call
    return ", ".join([*(f"arg{i + 1}" for i in range(n)), *(f"{k}=..." for k in kws)])


def compare(items: list[Item], lock: Lock | None) -> list[Finding]:
    """Warnings for definitions whose signature the lock did not record (nor accept since)."""
    if lock is None:
        return [Finding("warning", "the series has no patches/contract.lock: nothing to compare the signatures "
                                   "with (c128patch refresh writes it)")]
    accepted, recorded = lock.accepted(), lock.recorded()
    out = []
    seen = set()
    for item in items:
        key = (item.kind, item.target)
        if key in seen:
            continue
        seen.add(key)
        if key not in accepted:
            out.append(Finding("note", f"{item.site}: {item.target} is not in {lock.path.name} (checked, not compared)",
                               item.site, item.where, item.target, now=item.signature))
        elif item.sig not in accepted[key]:
            old = recorded[key]
            out.append(Finding(
                "warning", f"{item.site}: {item.target} changed since the lock: {old.where} `{old.signature}` at "
                           f"{lock.base or 'the base'}, now {item.where} `{item.signature}`", item.site, item.where,
                item.target, recorded=old.signature, now=item.signature))
    return out


def check(series: Series, git: Git, upstream: str, head: str, *, lock: Lock | None = None) -> ContractResult:
    """The contract on ``head`` (a patched tree-ish over the upstream commit ``upstream``)."""
    from c128patch.series.contract import read_lock

    start = time.perf_counter()
    lock = lock if lock is not None else read_lock(series.patches_dir)
    items, findings = derive(series, git, upstream, head)
    findings = findings + compare(items, lock)
    order = {"error": 0, "warning": 1, "note": 2}
    result = ContractResult(items, sorted(findings, key=lambda f: order[f.level]))
    result.seconds = time.perf_counter() - start
    return result


def lock_items(series: Series, git: Git, upstream: str, head: str) -> list[LockItem]:
    """What ``refresh`` writes: every resolved use on the tree at the series base."""
    items, findings = derive(series, git, upstream, head)
    errors = [f for f in findings if f.level == "error"]
    if errors:
        raise C128Error(f"cannot record the contract: {errors[0].message}"
                        + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""))
    return [i.lock_item() for i in items]


def patched_tree(series: Series, git: Git, rev: str, commit: str) -> str:
    """The tree id of the series replayed on ``commit`` in a temporary index (nothing checked out)."""
    import tempfile
    from pathlib import Path

    from c128patch.ops.replay import replay_in_index
    from c128patch.series.plan import index_git

    with tempfile.TemporaryDirectory(prefix="c128contract-") as tmp:
        result, _ = replay_in_index(series, git, rev, commit, Path(tmp) / "index")
        if not result.ok:
            failing = next((e for e in result.entries if e.status in ("conflict", "collision")), None)
            what = result.error or (f"{failing.name}: {failing.status} {failing.detail}".strip() if failing else "")
            raise C128Error(f"the series does not apply on {rev}: {what}; the contract is checked on a tree the series "
                            "applies to (c128patch check shows where it stops)")
        return index_git(git, Path(tmp) / "index").out("write-tree")


def check_rev(series: Series, git: Git, rev: str, commit: str, *, lock: Lock | None = None) -> ContractResult:
    """The contract on upstream ``commit`` with the series replayed there (no checkout)."""
    return check(series, git, commit, patched_tree(series, git, rev, commit), lock=lock)


def tree_base(git: Git) -> str:
    """The upstream commit a patched tree was applied on (its provenance record)."""
    from c128patch.series.provenance import PROVENANCE_PATH, read_provenance

    assert git.worktree is not None
    commit = read_provenance(git.worktree).get("upstream", {}).get("commit", "")
    if not commit or not git.rev_parse(commit):
        raise C128Error(f"{git.worktree} holds no c128patch provenance ({PROVENANCE_PATH}) naming an upstream commit "
                        "it has: apply the series there first (c128patch apply)")
    return commit


def accept(lock: Lock, result: ContractResult) -> int:
    """Record the signatures ``result`` warned about as accepted in ``lock`` (written); how many."""
    from dataclasses import replace

    now = {(f.target, f.now) for f in result.warnings}
    by_key = {(i.kind, i.target): i for i in result.items}
    added = 0
    items = []
    for item in lock.items:
        current = by_key.get(item.key)
        if current is not None and (item.target, current.signature) in now and current.sig not in item.sigs:
            item = replace(item, sigs=item.sigs + (current.sig,))
            added += 1
        items.append(item)
    lock.items = items
    lock.path.write_text(lock.text())
    return added


def probe_cxx(series: Series, git: Git, head: str) -> tuple[bool | None, str]:
    """The nvcc signature probe on ``head``'s headers (``fit.contract_cxx.probe``), cached by the headers'
    tree id, the probe's text and the compiler (the headers of an unchanged upstream compile once)."""
    import hashlib
    import json

    from c128patch.upstream.cache import cache_dir

    source = series.root / cxx.PROBE
    compiler = cxx.nvcc()
    headers = git.run("rev-parse", "--verify", "--quiet", f"{head}:{cxx.INCLUDE_ROOT}", check=False).stdout.strip()
    if not source.is_file() or compiler is None or not headers:
        return cxx.probe(series.root, _git_cmd(git), head)
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256("\0".join([headers, source.read_text(), compiler, version]).encode()).hexdigest()[:24]
    path = cache_dir() / "contract-probe" / f"{key}.json"
    if path.is_file():
        ok, line = json.loads(path.read_text())
        return ok, line + " (cached)"
    ok, line = cxx.probe(series.root, _git_cmd(git), head)
    if ok is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps([ok, line]))
    return ok, line


def _git_cmd(git: Git) -> list[str]:
    return ["git", f"--git-dir={git.git_dir}"] if git.git_dir else ["git", "-C", str(git.worktree)]
