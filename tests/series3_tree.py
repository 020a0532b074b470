"""Series III (online C128 under DSPARK) helpers for the tests: which entries are series III,
the files the product selects for a release, importing from a patched tree without sglang's
package ``__init__``s, and running one upstream function out of its module.

The manifest, variant choice and patched trees are the product's own (``c128patch.series.manifest``,
``c128patch.series.plan.plan``, ``support.patched_tree`` / the ``series_trees`` fixture).
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import functools
import importlib.abc
import importlib.machinery
import sys
import textwrap
import types
from pathlib import Path
from typing import Iterator, List, Tuple

from c128patch.git import Git
from c128patch.series.manifest import Entry, Series
from c128patch.series.plan import Planned, plan
from support import REPO_ROOT

ENV = "SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK"
CONTROLLER = REPO_ROOT / "overlay/sglang/srt/layers/attention/dsv4/online_c128_dspark.py"


def series3_entries(series: Series) -> List[Entry]:
    """The series III entries: those gated on the online-c128-under-DSPARK env."""
    return [e for e in series.entries if e.gate == ENV]


def selected_patches(series: Series, repo: Path, tag: str) -> List[Planned]:
    """The series III patch files the product picks for release ``tag`` (what ``apply`` uses)."""
    git = Git(git_dir=repo)
    names = {e.name for e in series3_entries(series)}
    return [p for p in plan(series, git, git.rev_parse(tag)) if p.patch is not None and p.entry.name in names]


# -- importing from a tree without sglang's package __init__s -------------------------

# Upstream files the series III tests run or read besides those the series writes
# (absent ones are skipped per release: the MTP controller moved in 0.5.23).
SERIES3_READS = [
    "python/sglang/srt/speculative/ragged_verify.py",
    "python/sglang/kernels/ops/speculative/ragged_verify_kernels.py",
    "python/sglang/kernels/ops/attention/dsv4/online_c128_mtp.py",
    "python/sglang/srt/layers/attention/dsv4/online_c128_mtp.py",
    "python/sglang/srt/layers/attention/dsv4/metadata.py",
    "python/sglang/kernels/ops/attention/dsv4/compress.py",
    "python/sglang/srt/model_executor/forward_batch_info.py",
]


class _PackageFinder(importlib.abc.MetaPathFinder):
    """`sglang` and its sub-packages of `tree` -> empty modules over the real folders (no
    `__init__` runs); modules load from the files themselves."""

    def __init__(self, tree: Path) -> None:
        self.tree = tree

    def find_spec(self, fullname: str, path, target=None):
        if fullname != "sglang" and not fullname.startswith("sglang."):
            return None
        folder = self.tree.joinpath(*fullname.split("."))
        if not folder.is_dir():
            return None
        spec = importlib.machinery.ModuleSpec(fullname, _EmptyLoader(), is_package=True)
        spec.submodule_search_locations = [str(folder)]
        return spec


class _EmptyLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return types.ModuleType(spec.name)

    def exec_module(self, module) -> None:
        pass


@contextlib.contextmanager
def sglang_imports(tree: Path, **launch) -> Iterator[None]:
    """Make `import sglang.<module>` load from `tree` (which holds `sglang/`; the packages
    are empty stand-ins, so no `__init__` runs), with `series3_sim`'s stand-ins for
    `sglang.srt.runtime_context` (serving a default launch, `launch` overriding its
    fields) and, where it is not installed, triton. Writes no bytecode: the trees are
    shared by the session."""
    from series3_sim import TRITON_DOC, install_runtime_context, install_triton_standin

    saved = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    for name in saved:
        del sys.modules[name]
    finder = _PackageFinder(tree)
    sys.meta_path.insert(0, finder)
    triton = install_triton_standin()
    install_runtime_context(**launch)
    bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        yield
    finally:
        sys.dont_write_bytecode = bytecode
        sys.meta_path.remove(finder)
        for name in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
            del sys.modules[name]
        if triton:
            for name in ("triton", "triton.language"):
                assert sys.modules.pop(name).__doc__ == TRITON_DOC
        sys.modules.update(saved)


# -- running one upstream function out of its module ----------------------------------


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


def pretend_cuda_build(monkeypatch) -> None:
    """This CPU machine's torch as a CUDA build, for the platform rule (the kernels never run
    on these tests' CPU tensors; ops are torch models there)."""
    import torch

    monkeypatch.setattr(torch.version, "cuda", torch.version.cuda or "12.8")
    monkeypatch.setattr(torch.version, "hip", None)
