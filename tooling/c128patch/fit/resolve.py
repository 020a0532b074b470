"""Reading and resolving one tree: its files (``TreeReader``, one tree-ish), which of their lines are ours
(``our_lines``: what ``git diff`` against its upstream commit adds, parsed with unidiff) with upstream's
numbering of the others (``upstream_line``); our uses of upstream in one Python file (``uses_in``: modules
and names imported, through aliases and relative imports, ``importlib.import_module`` of a literal or a
module constant, attribute chains from those bindings and from receivers typed as upstream's class, the calls
among them with their shape, and ``SGLANG_*`` names in string literals); a dotted name to its definition (``Def``:
a module, class, function, method, value or instance, with its file:line), through imports, re-exports, ``import *``,
class bases, ``self.x =`` and module-level instances, as static analysis (``ast``) sees them; and the signature a
call binds to (``signature_of``: an ``inspect.Signature`` built from the AST)."""

from __future__ import annotations

import ast
import bisect
import contextlib
import functools
import gc
import inspect
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Callable, Iterator, Protocol

from unidiff import Hunk, PatchSet

from c128patch.git import BlobBatch, Git

_MAX_HOPS = 8
_ENV_NAME = re.compile(r"^SGLANG_[A-Z0-9_]+$")
PY_ROOT = "python"
PACKAGE = "sglang"


def module_name(path: str) -> str | None:
    """The module a tree path holds (``python/sglang/a/__init__.py`` -> ``sglang.a``); None: no Python module."""
    p = PurePosixPath(path)
    if p.suffix != ".py" or not p.parts or p.parts[0] != PY_ROOT:
        return None
    parts = list(p.with_suffix("").parts[1:])
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


class Reader(Protocol):
    """What resolving reads: a tree's file paths and their texts (``TreeReader``; a folder on disk for the tier)."""

    files: set[str]

    def text(self, path: str) -> str | None: ...


class TreeReader:
    """Files of one tree-ish under ``root``, read through one ``git cat-file --batch``."""

    def __init__(self, git: Git, rev: str, root: str = f"{PY_ROOT}/{PACKAGE}") -> None:
        self.git, self.rev = git, rev
        self.files = set(git.out("ls-tree", "-r", "--name-only", rev, "--", root).splitlines())
        self._texts: dict[str, str | None] = {}
        self._batch = BlobBatch(git)

    def text(self, path: str) -> str | None:
        """The file's text; None where the tree has no such file or it is binary."""
        if path not in self._texts:
            data = self._batch.read(f"{self.rev}:{path}") if path in self.files else None
            self._texts[path] = None if data is None or b"\0" in data else data.decode(errors="replace")
        return self._texts[path]

    def close(self) -> None:
        self._batch.close()


def our_lines(git: Git, upstream: str, head: str,
              paths: list[str]) -> tuple[dict[str, set[int]], dict[str, list[Hunk]]]:
    """path -> the lines on ``head`` that ``upstream..head`` adds (``git diff -U0``); path -> its hunks."""
    if not paths:
        return {}, {}
    # --text: a tree's attributes (`*.cuh -diff`, .git/info/attributes too) made a file "Binary files differ": its
    # lines, and the contract rows of the calls on them, were dropped from contract.lock
    diff = git.run("diff", "--text", "-U0", "--no-renames", "--no-color", upstream, head, "--", *paths).stdout
    files = [f for f in PatchSet(diff) if len(f)]  # a binary or mode-only change: no lines
    return ({f.path: {line.target_line_no for hunk in f for line in hunk if line.is_added} for f in files},
            {f.path: list(f) for f in files})


def upstream_line(hunks: list[Hunk], line: int) -> int:
    """A line of the patched file (not one the patch adds) as it numbers in upstream's file."""
    delta = 0
    for h in hunks:
        start, count = h.target_start, h.target_length
        if (count and start + count - 1 < line) or (not count and start < line):
            delta += count - h.source_length
    return line - delta


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


class _Src(str):
    """A default value in a Signature, shown as its source text."""

    __repr__ = str.__str__


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
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and \
                "ClassVar" not in ast.unparse(stmt.annotation):
            default = P.empty if stmt.value is None else _Src(ast.unparse(stmt.value))
            if params and params[-1].default is not P.empty and default is P.empty:
                default = _Src("?")  # a field(default=...) before: keep the Signature valid
            params.append(P(stmt.target.id, P.POSITIONAL_OR_KEYWORD, default=default))
    return inspect.Signature(params)


@contextlib.contextmanager
def collector_held() -> Iterator[None]:
    """Python's cyclic collector off while a derivation builds and reads its syntax trees (~10^6 objects, no garbage:
    its passes over them took a third of the time), and all it built frozen after, out of every later pass; the trees
    hold no cycles, so reference counting still frees them."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if collecting:
            gc.enable()


def walk(node: ast.AST) -> list[ast.AST]:
    """``ast.walk(node)``'s nodes, in its order, as a list (in half its time: no generator per node)."""
    out, at = [node], 0
    while at < len(out):
        for name in out[at]._fields:
            value = getattr(out[at], name, None)
            if isinstance(value, ast.AST):
                out.append(value)
            elif isinstance(value, list):
                out += [v for v in value if isinstance(v, ast.AST)]
        at += 1
    return out


@functools.lru_cache(maxsize=64)  # as ``syntax_tree``: a derivation walks each file several times
def nodes(tree: ast.Module) -> list[ast.AST]:
    """Every node of a parsed file (``walk``), listed once (read only)."""
    return walk(tree)


@functools.lru_cache(maxsize=64)  # one tree's files (a derivation reads ~36, ~1.4 MB each): ~90 MB at most
def syntax_tree(text: str, path: str) -> ast.Module:
    """``text`` parsed, once per process for the same text (read only: a rebase's contract on its tip and its
    closing ``refresh --check`` read the same files; a changed file is another text, parsed again)."""
    return ast.parse(text, path)


class Upstream:
    """Resolves dotted names on one tree; ``ours``: path -> our lines (None: the whole file)."""

    def __init__(self, reader: Reader, ours: dict[str, set[int] | None]) -> None:
        self.reader, self.ours = reader, ours
        self._folders = {f.rsplit("/", i)[0] + "/" for f in reader.files for i in range(1, f.count("/") + 1)}
        self._parsed: dict[str, ast.Module | None] = {}
        self._names: dict[tuple[int, str], dict[str, ast.AST]] = {}  # (id(module or class), what) -> ``_index``
        self.errors: dict[str, str] = {}  # path -> why it did not parse

    # -- modules
    def module_path(self, name: str) -> str | None:
        """The file of module ``name`` on the tree; a folder without ``__init__`` (a namespace package): ``folder/``."""
        base = PY_ROOT + "/" + name.replace(".", "/")
        return next((p for p in (f"{base}.py", f"{base}/__init__.py") if p in self.reader.files),
                    base + "/" if base + "/" in self._folders else None)

    def parse(self, path: str) -> ast.Module | None:
        if path not in self._parsed:
            text = self.reader.text(path) if path.endswith(".py") else ""
            tree = None
            if text is not None:
                try:
                    tree = syntax_tree(text, path)
                except (SyntaxError, ValueError) as exc:
                    self.errors[path] = (f"{path}:{getattr(exc, 'lineno', 0) or 0}: does not parse: "
                                         f"{getattr(exc, 'msg', exc)}")
                except (RecursionError, MemoryError):  # input: a union of 20,000 names parses, but not into an AST
                    self.errors[path] = f"{path}: does not parse: it nests too deeply to read"
            self._parsed[path] = tree
        return self._parsed[path]

    def parsed(self) -> dict[str, ast.Module]:
        """The files read so far that parse: upstream's code our uses reached."""
        return {path: tree for path, tree in self._parsed.items() if tree is not None}

    def is_ours(self, path: str, line: int) -> bool:
        return path in self.ours and (self.ours[path] is None or line in self.ours[path])

    def module(self, name: str) -> Def:
        if name.split(".")[0] != PACKAGE:
            return Def("external", name)
        path = self.module_path(name)
        if path is None:
            return Def("missing", name, why=f"no module {name} ({PY_ROOT}/{name.replace('.', '/')}.py)")
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
            found.name = name  # a method through an instance, or a classmethod: its first parameter is taken
            found.bound = found.kind == "method" and (not found.static if owner.kind == "instance"
                                                      else "classmethod" in _decorators(found.node))
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
        return self._index(tree, "top").get(attr)

    def _index(self, node: ast.Module | ast.ClassDef, what: str) -> dict[str, ast.AST]:
        """name -> its statement, listed once per node: ``top``, the last binding at a module's top; ``body``, the
        first in a class body; ``self``, the first ``self.name = ...`` in a class's methods."""
        key = (id(node), what)  # (the node lives as long as its parsed file: in ``_parsed``)
        if key not in self._names:
            index: dict[str, ast.AST] = {}
            for stmt in (statements(node.body) if what == "top" else
                         node.body if what == "body" else statements(node.body, None)):
                for name in _bound_names(stmt) if what != "self" else _self_targets(stmt):
                    if what == "top" or name not in index:
                        index[name] = stmt
            self._names[key] = index
        return self._names[key]

    def _from_stmt(self, stmt: ast.stmt, attr: str, mod: Def, hops: int) -> Def:
        name = f"{mod.name}.{attr}"
        if isinstance(stmt, ast.ImportFrom):
            alias = next(a for a in stmt.names if (a.asname or a.name) == attr)
            target = self.module(absolute(stmt, mod))
            return self.member(target, alias.name, hops + 1) if target.kind == "module" else target
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
        key = f"{cls.path}:{cls.line}"
        if key in seen:
            return Def("unknown", attr, why="cyclic bases")
        seen.add(key)
        stmt = self._index(node, "body").get(attr) or self._index(node, "self").get(attr)
        if stmt is not None:  # in the class body, else ``self.attr = ...`` in a method
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
            elif ast.unparse(base) not in ("object", "ABC", "Generic") and not ast.unparse(base).startswith("Generic["):
                unknown.append(ast.unparse(base))
        if unknown or "__getattr__" in self._index(node, "body"):
            why = f"has bases outside sglang ({', '.join(unknown)})" if unknown else "resolves names in __getattr__"
            return Def("unknown", attr, cls.path, cls.line, why=f"{node.name} {why}")
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
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return f"@property {node.name}", None
            value = getattr(node, "value", None)
            return f"= {ast.unparse(value if value is not None else getattr(node, 'annotation', node))}", None
        return "", None


def _unbound(sig: inspect.Signature) -> inspect.Signature:
    """``sig`` without its first parameter (``self``/``cls``, taken by binding)."""
    return sig.replace(parameters=list(sig.parameters.values())[1:])


BODIES = ("body", "orelse", "finalbody", "handlers", "cases")
_AT_TOP = (ast.If, ast.Try, ast.With, ast.ExceptHandler)  # what a module's top runs the body of
_GUARDS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}  # an import these guard may fail


def statements(body: list, into: tuple[type, ...] | None = _AT_TOP, *, guarded: bool = True) -> Iterator[ast.AST]:
    """The statements of ``body``, and those inside the ``into`` statements (None: inside every one);
    ``guarded=False``: not those an import guard (``try``) or ``if TYPE_CHECKING`` holds."""
    for stmt in body:
        yield stmt
        if into is None or isinstance(stmt, into):
            for part in BODIES if guarded else _unguarded(stmt):
                yield from statements(getattr(stmt, part, None) or [], into, guarded=guarded)


def _unguarded(stmt: ast.AST) -> tuple[str, ...]:
    if isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.unparse(stmt.test):
        return ("orelse",)
    types = [t for h in getattr(stmt, "handlers", []) if isinstance(stmt, ast.Try)
             for t in (h.type.elts if isinstance(h.type, ast.Tuple) else [h.type])]
    return ("orelse", "finalbody") if any(t is None or getattr(t, "id", "") in _GUARDS for t in types) else BODIES


def _self_targets(stmt: ast.AST) -> list[str]:
    """The names ``self.name = ...`` sets (in a method)."""
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
    return [t.attr for t in targets if isinstance(t, ast.Attribute) and chain_of(t.value) == ["self"]] \
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) else []


def _bound_names(stmt: ast.AST) -> list[str]:
    """The names a statement binds where it stands (no tuple unpacked, no ``*`` import)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, ast.Assign):
        return [t.id for t in stmt.targets if isinstance(t, ast.Name)]
    if isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        return [stmt.target.id] if isinstance(stmt.target, ast.Name) else []
    if isinstance(stmt, ast.ImportFrom):
        return [a.asname or a.name for a in stmt.names if a.name != "*"]
    if isinstance(stmt, ast.Import):
        return [a.asname or a.name.split(".")[0] for a in stmt.names]
    return []


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


@dataclass
class Use:
    """One use of upstream by our code: a dotted chain from a binding, maybe called."""

    line: int
    chain: list[str]  # [module-or-binding, attr, ...] already absolute: chain[0] is a module name
    call: tuple[int, tuple[str, ...]] | None = None  # (positional count, keywords); None: not called
    star: bool = False  # *args / **kwargs in the call: shape not checked
    kind: str = ""  # env: an SGLANG_* literal; untyped: [attr] on a receiver with no type; typed; member, mirror
    receiver: str = ""  # untyped: the receiver (file, scope, chain): the names read on it narrow its classes


def nodes_on(tree: ast.Module, lines: set[int]) -> Iterator[ast.AST]:
    """The nodes of the statements that touch ``lines`` (a compound statement: its own expressions only)."""
    ordered = sorted(lines)

    def on(body: list) -> Iterator[ast.AST]:
        for stmt in body:
            at = bisect.bisect_left(ordered, stmt.lineno)  # a statement's nested ones lie within its lines
            if at == len(ordered) or ordered[at] > (stmt.end_lineno or stmt.lineno):
                continue
            if not any(getattr(stmt, part, None) for part in BODIES):
                yield from walk(stmt)
                continue
            for name, value in ast.iter_fields(stmt):
                for child in value if isinstance(value, list) else [value]:
                    if name not in BODIES and isinstance(child, ast.AST):
                        yield from walk(child)
            for part in BODIES:
                yield from on(getattr(stmt, part, None) or [])

    return on(tree.body)


def _imports(path: str, tree: ast.Module, mine: Callable[[ast.AST], bool]) -> tuple[dict[str, list[str]], list[Use]]:
    """name -> the dotted chain each import in ``path`` binds, and the import statements' uses (ours only)."""
    module = module_name(path) or ""
    mod = Def("module", module, path, module=module)
    bindings: dict[str, list[str]] = {}
    uses: list[Use] = []
    for node in statements(tree.body, None):
        if isinstance(node, ast.Import):  # (the name it binds, the chain it names)
            named = [(a.asname, a.name.split(".")) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = absolute(node, mod).split(".")
            named = [(a.asname or a.name, [*source, a.name]) for a in node.names if a.name != "*"]
        else:
            continue
        for name, chain in named:
            if name:
                bindings[name] = chain
            else:  # ``import a.b`` binds ``a``
                bindings.setdefault(chain[0], chain[:1])
            if mine(node) and chain[0] == PACKAGE:
                uses.append(Use(node.lineno, chain))
    return bindings, uses


def uses_in(path: str, tree: ast.Module, lines: set[int] | None) -> list[Use]:
    """Our uses of ``sglang`` in one file (``lines``: ours; None: the whole file)."""
    mine = (lambda n: True) if lines is None else (lambda n: getattr(n, "lineno", 0) in lines)
    bindings, uses = _imports(path, tree, mine)
    constants = {t.id: s.value.value for s in tree.body  # the module's string constants
                 if isinstance(s, ast.Assign) and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str)
                 for t in s.targets if isinstance(t, ast.Name)}
    seen_funcs: set[int] = set()
    for node in (nodes(tree) if lines is None else nodes_on(tree, lines)):
        if not mine(node):
            continue
        if isinstance(node, ast.Call):
            func = node.func
            chain = chain_of(func)
            if chain and chain[0] in bindings:
                star = any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords)
                shape = (len(node.args), tuple(k.arg for k in node.keywords if k.arg))
                uses.append(Use(node.lineno, bindings[chain[0]] + chain[1:], shape, star))
                seen_funcs.add(id(func))
            dotted = bindings.get(chain[0], [chain[0]]) + chain[1:] if chain else []
            if dotted[-2:] == ["importlib", "import_module"] and node.args:
                arg = node.args[0]
                target = arg.value if isinstance(arg, ast.Constant) else constants.get(getattr(arg, "id", ""))
                if isinstance(target, str) and target.split(".")[0] == PACKAGE:
                    uses.append(Use(node.lineno, target.split(".")))
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and id(node) not in seen_funcs:
            chain = chain_of(node)
            if chain and chain[0] in bindings:
                uses.append(Use(node.lineno, bindings[chain[0]] + chain[1:]))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _ENV_NAME.match(node.value):
            uses.append(Use(node.lineno, ["sglang", "srt", "environ", "envs", node.value], kind="env"))
    return [u for u in uses + _typed_uses(path, tree, bindings, lines) if u.chain and u.chain[0] == PACKAGE]


def _typed_uses(path: str, tree: ast.Module, bindings: dict[str, list[str]], lines: set[int] | None) -> list[Use]:
    """[module, Class, attr] for each attribute our lines read on a receiver typed as upstream's class: a parameter
    annotated with an imported class, ``self`` in a method of upstream's class, ``self.x`` where the class annotates
    ``x`` (in its body or ``self.x: X = ...`` in ``__init__``)."""
    uses = []
    for owner in [tree, *(s for s in statements(tree.body) if isinstance(s, ast.ClassDef))]:
        fns = [s for s in owner.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
               and (lines is None or not lines.isdisjoint(range(s.lineno, (s.end_lineno or s.lineno) + 1)))]
        inits = [walk(s) for s in owner.body if getattr(s, "name", "") == "__init__" and fns and owner is not tree]
        fields = {t.attr if isinstance(t, ast.Attribute) else t.id: _annotated(a.annotation, bindings)
                  for a in [*(owner.body if owner is not tree else []), *(n for i in inits for n in i)]
                  if isinstance(a, ast.AnnAssign) for t in [a.target]
                  if isinstance(t, ast.Name) and a in owner.body or chain_of(t)[:1] == ["self"]}
        for fn in fns:
            params = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
            typed = {a.arg: _annotated(a.annotation, bindings) for a in params}
            if isinstance(owner, ast.ClassDef) and params and lines is not None and owner.lineno not in lines:
                typed[params[0].arg] = [*(module_name(path) or "").split("."), owner.name]
            if isinstance(owner, ast.ClassDef) and params:
                typed |= {f"{params[0].arg}.{name}": chain for name, chain in fields.items()}
            uses += [Use(node.lineno, typed[key] + [node.attr], kind="typed") for node in walk(fn)
                     if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
                     and (lines is None or node.lineno in lines) for value in [node.value]
                     for key in [getattr(value, "id", None) or f"{getattr(value.value, 'id', '')}.{value.attr}"
                                 if isinstance(value, (ast.Name, ast.Attribute)) else ""] if typed.get(key)]
    return uses


def _annotated(node: ast.AST | None, bindings: dict[str, list[str]]) -> list[str]:
    """The dotted chain an annotation names through the file's imports ([]: none, or not one class): ``X``, ``a.X``,
    ``Optional[X]``, ``X | None``, any of them in a string."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return []
    if isinstance(node, ast.Subscript) and chain_of(node.value)[-1:] == ["Optional"]:
        node = node.slice
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        rest = [n for n in (node.left, node.right) if not (isinstance(n, ast.Constant) and n.value is None)]
        node = rest[0] if len(rest) == 1 else None
    chain = chain_of(node) if node is not None else []
    return bindings[chain[0]] + chain[1:] if chain and chain[0] in bindings else []
