"""Which of upstream's kernel tests ``smoke upstream`` runs (those whose imports, read with ``ast``, reach a
module or kernel the series patches or adds, or that ``-k`` names), and what each tree must provide for them
(modules, real packages, csrc folders, names from stand-ins: never a name the tree's real module lacks)."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable

from c128patch.errors import C128Error
from c128patch.git import is_work_tree, toplevel
from c128patch.smoke import load_file

KERNEL_TESTS = "registered/kernels"
CSRC = "sglang/kernels/jit/csrc"
KERNEL_SUFFIXES = (".cuh", ".cu", ".h")
# a kernel source under a csrc folder: its first part a folder's name (not "." nor "..": "../x.cuh" named the
# csrc folder "..", and the staged subset widened to sglang/kernels/jit)
_CSRC_LITERAL = re.compile(r"^\w[\w.-]*/[\w./-]*\.(cuh|cu|h)$")


def test_root(path: Path | None, tree: Path) -> Path:
    """The folder upstream's tests are read from (see the module docstring)."""
    if path is None:
        if not is_work_tree(tree):
            raise C128Error(f"--tests: {tree} is not in a git checkout, so it has no upstream tests; "
                            "pass --tests PATH (the test/ folder of an sglang checkout)")
        path = toplevel(tree)
        if not (path / "test").is_dir():
            raise C128Error(f"--tests: the tree's repository {path} has no test/ folder (a release "
                            "history has none); pass --tests PATH (the test/ folder of an sglang checkout)")
    path = path.expanduser().resolve()
    if not path.is_dir():
        raise C128Error(f"--tests: {path} is not a folder")
    if not (path / KERNEL_TESTS).is_dir() and (path / "test").is_dir():
        path = path / "test"
    if not test_files(path):
        raise C128Error(f"--tests: no test_*.py under {path / KERNEL_TESTS} or {path}")
    return path


def scope(root: Path) -> Path:
    return root / KERNEL_TESTS if (root / KERNEL_TESTS).is_dir() else root


def test_files(root: Path) -> list[Path]:
    return sorted(p for p in scope(root).rglob("test_*.py") if p.is_file() and "__pycache__" not in p.parts)


@dataclass(frozen=True)
class Imp:
    """One import, made absolute: ``import module`` (names None) or ``from module import names``."""

    module: str
    names: tuple[str, ...] | None
    line: int
    lazy: bool  # inside a function


def _parse(source: str, filename: str) -> ast.Module:
    """``source`` parsed; one that does not parse (or nests past the parser's limits: input) is a one-line error."""
    try:
        return ast.parse(source, filename)
    except (SyntaxError, ValueError) as exc:
        raise C128Error(f"{filename}: does not parse ({type(exc).__name__}: {exc})") from None
    except (RecursionError, MemoryError):
        raise C128Error(f"{filename}: nested too deeply to parse") from None


def parse_imports(source: str, filename: str, package: str | None) -> list[Imp]:
    """Every import in ``source`` (``package``: where relative imports resolve from)."""
    out: list[Imp] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            test = getattr(child, "test", None)  # if TYPE_CHECKING: / if typing.TYPE_CHECKING:
            if isinstance(child, ast.If) and getattr(test, "id", getattr(test, "attr", "")) == "TYPE_CHECKING":
                for sub in child.orelse:
                    visit(sub, lazy)
                continue
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend(Imp(a.name, None, child.lineno, lazy) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    if not package:
                        continue  # a relative import in a test file: a sibling, not sglang
                    parts = package.split(".")
                    parts = parts[: len(parts) - child.level + 1]
                    base = ".".join(parts + ([child.module] if child.module else []))
                out.append(Imp(base, tuple(a.name for a in child.names), child.lineno, lazy))
            visit(child, inner)

    visit(_parse(source, filename), False)
    return out


def _star_chain(index: "ModuleIndex", modules: Iterable[str]) -> dict[Path, list[ast.stmt]]:
    """The files of ``modules`` and of what they star-import from sglang, each with its top-level statements."""
    out: dict[Path, list[ast.stmt]] = {}
    todo = list(modules)
    while todo:
        path = index.file(todo.pop())
        if path is None or path in out:
            continue
        out[path] = _parse(path.read_text(errors="replace"), str(path)).body
        todo += [n.module for n in out[path] if isinstance(n, ast.ImportFrom) and n.module
                 and n.module.startswith("sglang") and any(a.name == "*" for a in n.names)]
    return out


def defined_names(tree: Path, module: str) -> set[str]:
    """Top-level names a module of ``tree`` defines, what its ``from sglang... import *`` brings included."""
    names: set[str] = set()
    for body in _star_chain(ModuleIndex(tree), [module]).values():
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, ast.Import):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                names.update(a.asname or a.name for a in node.names if a.name != "*")
    return names


class ModuleIndex:
    """The sglang modules of one tree (a folder holding ``sglang/``), parsed on demand."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._imports: dict[str, list[Imp]] = {}

    def file(self, module: str) -> Path | None:
        base = self.root.joinpath(*module.split("."))
        return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)

    def is_package(self, module: str) -> bool:
        return (self.root.joinpath(*module.split(".")) / "__init__.py").is_file()

    def imports(self, module: str) -> list[Imp]:
        if module not in self._imports:
            path = self.file(module)
            package = module if self.is_package(module) else module.rpartition(".")[0]
            self._imports[module] = [] if path is None else parse_imports(
                path.read_text(errors="replace"), str(path), package)
        return self._imports[module]


@dataclass(frozen=True)
class Edge:
    """What one import does: ``module`` runs a module file, ``package`` runs a package's
    ``__init__`` for real, ``standin`` takes ``names`` from a stand-in, ``missing`` fails."""

    kind: str
    module: str
    names: tuple[str, ...] = ()


def resolve(index: ModuleIndex, imp: Imp, standins: set[str]) -> list[Edge]:
    if not (imp.module == "sglang" or imp.module.startswith("sglang.")):
        return []
    if imp.module in standins:
        return [Edge("standin", imp.module, imp.names or ())]
    # a module under a stand-in package loads from the tree (upstream_standins keeps its __path__)
    if index.file(imp.module) is None:
        return [Edge("missing", imp.module)]
    if imp.names is None:
        return [Edge("package" if index.is_package(imp.module) else "module", imp.module)]
    if not index.is_package(imp.module):
        return [Edge("module", imp.module)]
    edges, attrs = [], []
    for name in imp.names:
        sub = f"{imp.module}.{name}"
        if sub in standins:
            edges.append(Edge("standin", sub))
        elif index.file(sub) is not None:
            edges.append(Edge("package" if index.is_package(sub) else "module", sub))
        else:
            attrs.append(name)
    if attrs:
        edges.append(Edge("package", imp.module, tuple(attrs)))
    return edges


def touched_files(record: dict | None) -> list[str]:
    """``python/sglang/...`` paths the series writes: the record's entries, else the manifest's patches and overlays."""
    if record and record.get("entries"):
        return sorted({f for e in record["entries"] for f in e.get("files", [])})
    from c128patch.series.manifest import default_series_root, load_series
    from c128patch.series.patchfile import read_patch  # unidiff: only where there is no record

    series = load_series(default_series_root())
    files: set[str] = set()
    for entry in series.entries:
        if entry.is_patch:
            for variant in entry.patch_files():
                files.update(read_patch(series.file_of(entry, variant)).files)
        else:
            files.add(entry.target)
    return sorted(files)


def series_targets(patched: Path, upstream: Path, files: Iterable[str]) -> dict[str, str]:  # noqa: C901  one pass sorts three ways
    """module -> why it is a target (see the module docstring), the series' own change first, reasons joined by "; "."""
    direct: dict[str, list[str]] = {}
    beside: dict[str, list[str]] = {}
    kernels: dict[str, str] = {}  # kernel, as the wrappers name it (deepseek_v4/c_plan.cuh) -> why
    for path in files:
        rel = path.removeprefix("python/")
        added = not (upstream / rel).exists()
        verb = "adds" if added else "patches"
        if rel.startswith("sglang/") and rel.endswith(".py"):
            mod = rel[:-3].replace("/", ".").removesuffix(".__init__")
            direct.setdefault(mod, []).append(f"the series {verb} it")
            if added:
                pkg = mod.rpartition(".")[0]
                for sib in sorted((patched / pkg.replace(".", "/")).glob("*.py")):
                    name = f"{pkg}.{sib.stem}" if sib.stem != "__init__" else pkg
                    beside.setdefault(name, []).append(f"next to {rel}, which the series adds")
        elif rel.endswith(KERNEL_SUFFIXES) and rel.startswith(CSRC + "/"):
            name = rel.removeprefix(CSRC + "/")
            kernels.setdefault(name, f"the series {verb} {rel}")
            if added:
                for sib in sorted((patched / rel).parent.iterdir()):
                    if sib.suffix in KERNEL_SUFFIXES and sib.name != Path(rel).name:
                        kernels.setdefault(str(Path(name).parent / sib.name), f"next to {rel}, which the series adds")
    for py in sorted((patched / "sglang" / "kernels").rglob("*.py")):  # the Python wrappers naming those kernels
        hits = {k for k in kernels if k in py.read_text(errors="replace")}
        if not hits or "__pycache__" in py.parts:
            continue
        mod = ".".join(py.relative_to(patched).with_suffix("").parts).removesuffix(".__init__")
        own = sorted(h for h in hits if not kernels[h].startswith("next to"))
        near = sorted(h for h in hits if kernels[h].startswith("next to"))
        if own:
            why = "; ".join(sorted({kernels[h] for h in own}))
            direct.setdefault(mod, []).append(f"loads {', '.join(own)} ({why})")
        if near:
            beside.setdefault(mod, []).append(f"loads {', '.join(near)}, next to a kernel the series adds")
    return {mod: "; ".join(dict.fromkeys(direct.get(mod, []) + beside.get(mod, [])))
            for mod in sorted(set(direct) | set(beside))}


@dataclass
class TestFile:
    path: Path
    rel: str  # relative to the test root, posix
    imports: list[Imp]
    names: list[str]  # the module's stem and its test function/class names (for -k)

    @classmethod
    def read(cls, path: Path, root: Path) -> "TestFile":
        source = path.read_text(errors="replace")
        tree = _parse(source, str(path))
        names = [path.stem] + [n.name for n in ast.walk(tree)
                               if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                               and n.name.lower().startswith("test")]
        return cls(path, path.relative_to(root).as_posix(), parse_imports(source, str(path), None), names)

    @cached_property
    def siblings(self) -> list[Path]:
        """Non-sglang modules it imports that sit next to it (test helpers of the checkout)."""
        tops = {imp.module.split(".")[0] for imp in self.imports} - {""}
        return sorted({cand for top in tops if not top.startswith("sglang") for cand in (
            self.path.parent / f"{top}.py", self.path.parent / top / "__init__.py") if cand.is_file()})


@dataclass
class Closure:
    """What a set of tests needs of one tree."""

    modules: set[str] = field(default_factory=set)  # module files that run
    real_packages: set[str] = field(default_factory=set)  # packages whose __init__ runs
    standin_uses: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # module -> name -> [where]
    standin_uses_lazy: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # only inside functions
    missing: dict[str, list[str]] = field(default_factory=dict)  # module -> ["where: reason"]
    csrc_dirs: set[str] = field(default_factory=set)  # under sglang/kernels/jit/csrc
    lazy: list[str] = field(default_factory=list)  # imported inside library functions only: not staged

    def files(self, index: ModuleIndex) -> list[Path]:
        """Paths under the tree root: the modules, each package ``__init__`` on the way, the csrc folders' files."""
        out: set[Path] = set()
        for mod in self.modules | self.real_packages:
            path = index.file(mod)
            if path is not None:
                out.add(path.relative_to(index.root))
            parts = mod.split(".")
            for i in range(1, len(parts)):
                init = index.root.joinpath(*parts[:i]) / "__init__.py"
                if init.is_file():
                    out.add(init.relative_to(index.root))
        for folder in self.csrc_dirs:
            base = index.root / CSRC / folder
            out.update(p.relative_to(index.root) for p in base.rglob("*") if p.is_file()
                       and "__pycache__" not in p.parts)
        return sorted(out)


def closure(index: ModuleIndex, tests: list[TestFile], standins: set[str]) -> Closure:
    """Follow every import the tests make through the tree, and the harness's own (sglang.srt.environ)."""
    out = Closure()
    # (imports, where, from a test file, reached without a function-level import on the way)
    queue: list[tuple[list[Imp], str, bool, bool]] = [(t.imports, t.rel, True, True) for t in tests]
    queue.insert(0, ([Imp("sglang.srt.environ", None, 0, False)], "harness", False, True))
    done: dict[str, bool] = {}
    lazy: set[str] = set()
    while queue:
        imports, where, is_test, eager_here = queue.pop()
        for imp in imports:
            eager = eager_here and not imp.lazy
            if imp.lazy and not is_test and not imp.module.startswith("sglang.kernels.") and imp.module not in standins:
                lazy.add(imp.module)  # a library function's import outside the kernels: not followed
                continue
            for edge in resolve(index, imp, standins):
                here = f"{where}:{imp.line}"
                if edge.kind == "standin":
                    uses = (out.standin_uses if eager else out.standin_uses_lazy).setdefault(edge.module, {})
                    for name in edge.names:
                        uses.setdefault(name, []).append(here)
                elif edge.kind == "missing":
                    if eager:
                        out.missing.setdefault(edge.module, []).append(f"{here}: this tree has no module {edge.module}")
                else:
                    (out.modules if edge.kind == "module" else out.real_packages).add(edge.module)
                    if edge.module not in done or (eager and not done[edge.module]):
                        done[edge.module] = eager
                        path = index.file(edge.module)
                        if path is not None:  # the csrc folders it names ("deepseek_v4/c128_v2.cuh")
                            nodes = ast.walk(_parse(path.read_text(errors="replace"), str(path)))
                            out.csrc_dirs |= {n.value.split("/")[0] for n in nodes if isinstance(n, ast.Constant)
                                              and isinstance(n.value, str) and _CSRC_LITERAL.match(n.value)}
                        queue.append((index.imports(edge.module), edge.module, False, eager))
    out.lazy = sorted(lazy - out.modules - out.real_packages)
    return out


def standin_pool(suite: Path) -> dict[str, set[str]]:
    """module -> every name a stand-in exists for: the kernel tier's harness's (read from the suite) and ours."""
    from c128patch.smoke.upstream_standins import EXTRA

    path = suite / "harness.py"
    if not path.is_file():
        raise C128Error(f"smoke upstream needs the kernel tier's harness: {path} does not exist (pass --suite DIR)")
    pool = {m: set(n) for m, n in load_file("c128patch_suite_harness", path).STANDINS.items()}
    for mod, names in EXTRA.items():
        pool.setdefault(mod, set()).update(names)
    return pool


def standin_files(tree: Path, pool: dict[str, set[str]]) -> list[Path]:
    """The real files behind the stand-in modules and what they star-import (so a staged tree plans alike)."""
    return sorted(path.relative_to(tree) for path in _star_chain(ModuleIndex(tree), pool))


def standin_plan(tree: Path, pool: dict[str, set[str]], uses: dict[str, dict[str, list[str]]],
                 lazy_uses: dict[str, dict[str, list[str]]] | None = None
                 ) -> tuple[dict[str, list[str]], list[dict[str, Any]]]:
    """``{module: [names]}`` to stand in for on ``tree`` (modules it has, names its real module defines) and a
    report row per stand-in module; ``lazy_uses``: names taken only inside library functions (not required)."""
    index = ModuleIndex(tree)
    wanted: dict[str, list[str]] = {}
    rows = []
    for mod in sorted(pool):
        real = index.file(mod)
        used = uses.get(mod, {})
        row: dict[str, Any] = {"module": mod, "real": str(real.relative_to(tree)) if real else None,
                               "used": sorted(used)}
        in_functions = set((lazy_uses or {}).get(mod, {})) - set(used)
        lazy = sorted(in_functions - pool[mod])
        if lazy:
            row["no_standin_if_called"] = lazy
        if real is None:
            row.update(offered=[], withheld=sorted(used), reason="this tree has no such module")
        else:
            defined = defined_names(tree, mod)
            offered = sorted(n for n in pool[mod] if n in defined)
            wanted[mod] = offered
            withheld = sorted(n for n in used if n in pool[mod] and n not in defined)
            row.update(offered=offered, withheld=withheld)
            # taken inside library functions, some of which run at import (custom_op.py's register_custom_op)
            if in_functions & set(offered):
                row["used_in_functions"] = sorted(in_functions & set(offered))
            gaps = sorted(n for n in used if n not in pool[mod] and n in defined)
            if gaps:
                row["no_standin"] = {n: used[n] for n in gaps}
            if withheld:
                row["reason"] = f"this tree's {mod} does not define {', '.join(withheld)}"
        rows.append(row)
    return wanted, rows


def keyword_words(expr: str) -> list[str]:
    """The words of a pytest -k expression that are not negated (a superset pre-filter)."""
    words, negate = [], False
    for tok in re.findall(r"[\w\[\]\-.]+|\(|\)", expr):
        low = tok.lower()
        if low == "not":
            negate = True
        elif tok != "(":
            if not negate and low not in ("and", "or", ")"):
                words.append(low)
            negate = False
    return words


@dataclass
class Selection:
    root: Path
    files: list[TestFile]  # selected
    why: dict[str, list[str]]  # rel -> reasons
    scanned: int
    targets: dict[str, str]
    keyword: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"root": str(self.root), "scope": str(scope(self.root)), "scanned": self.scanned,
                "selected": [{"file": f.rel, "why": self.why[f.rel]} for f in self.files],
                "targets": self.targets, "keyword": self.keyword}


def select(root: Path, patched: Path, targets: dict[str, str], standins: set[str],
           keyword: str | None = None) -> Selection:
    index = ModuleIndex(patched)
    words = keyword_words(keyword) if keyword else []
    chosen, why = [], {}
    paths = test_files(root)
    for path in paths:
        test = TestFile.read(path, root)
        seen: dict[str, str] = {}  # module -> how the test reaches it (through test helpers and packages' __init__)
        queue: list[tuple[list[Imp], str]] = [(test.imports, "")]
        while queue:
            imports, via = queue.pop()
            for edge in (edge for imp in imports for edge in resolve(index, imp, standins)):
                if edge.kind in ("module", "package") and edge.module not in seen:
                    seen[edge.module] = via
                    if edge.module.startswith("sglang.test.") or edge.kind == "package":
                        queue.append((index.imports(edge.module), via or edge.module))
        reasons = [f"{mod}: {targets[mod]}" + (f" (through {via})" if via and via != mod else "")
                   for mod, via in sorted(seen.items()) if mod in targets]
        names = [n.lower() for n in test.names] + [test.rel.lower()]
        if any(w in n for w in words for n in names):
            reasons.append(f"-k {keyword}")
        if reasons:
            chosen.append(test)
            why[test.rel] = reasons
    return Selection(root, chosen, why, len(paths), targets, keyword)


def conftests(test: TestFile, root: Path) -> list[Path]:
    """conftest.py files pytest would load for this test: its folder's, then each one's up to the root."""
    here = test.path.parent
    folders = [here] + [p for p in here.parents if p == root or root in p.parents]
    return [f / "conftest.py" for f in folders if (f / "conftest.py").is_file()]
