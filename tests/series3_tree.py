"""Series III (online C128 under DSPARK) helpers for the tests: which entries are series III,
the files the product selects for a release, importing from a patched tree without sglang's
package ``__init__``s, and running one upstream function out of its module.

The manifest, variant choice and patched trees are the product's own (``c128patch.series.manifest``,
``c128patch.series.plan.plan``, ``support.patched_tree`` / the ``series_trees`` fixture).
"""

from __future__ import annotations

import ast
import contextlib
import sys
import textwrap
import types
from pathlib import Path
from typing import Iterator, List

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

_PACKAGES = (
    "sglang",
    "sglang.srt",
    "sglang.srt.layers",
    "sglang.srt.layers.attention",
    "sglang.srt.layers.attention.dsv4",
)


@contextlib.contextmanager
def sglang_imports(tree: Path) -> Iterator[None]:
    """Make `import sglang.srt.environ` and the dsv4 overlay modules load from `tree` (which
    holds `sglang/`; the packages are empty stand-ins, so no `__init__` runs). Writes no
    bytecode: the trees are shared by the session."""
    saved = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    for name in saved:
        del sys.modules[name]
    for name in _PACKAGES:
        module = types.ModuleType(name)
        module.__path__ = [str(tree / name.replace(".", "/"))]
        sys.modules[name] = module
    bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        yield
    finally:
        sys.dont_write_bytecode = bytecode
        for name in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
            del sys.modules[name]
        sys.modules.update(saved)


# -- running one upstream function out of its module ----------------------------------


def function_node(path: Path, qualname: str) -> ast.FunctionDef:
    """`Class.method` or `function` in the module at `path`."""
    tree = ast.parse(path.read_text())
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
    lines = path.read_text().splitlines()[node.lineno - 1 : node.end_lineno]
    source = "from __future__ import annotations\n" + textwrap.dedent("\n".join(lines))
    exec(compile(source, f"{path}:{qualname}", "exec"), namespace)
    return namespace[node.name]
