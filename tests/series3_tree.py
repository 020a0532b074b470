"""Patched sglang trees for the series III tests, from the release history.

A tree holds only the files the series touches (plus `srt/environ.py`), exported from the
`sglang_release_repo` fixture (tests/conftest.py: a bare git repo, one tag per release,
`python/sglang/...` layout), patched with the series' files for that release per
patches/proposed-integration.toml, and the series' overlay modules. Once the entries are in
series.toml, `c128patch apply` can build these trees instead.
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import shutil
import subprocess
import sys
import textwrap
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
PATCHES = REPO / "patches"
MANIFEST = PATCHES / "proposed-integration.toml"
RELEASES = ("v0.5.20", "v0.5.21", "v0.5.22", "v0.5.23")
ENV = "SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK"
ENVIRON = "python/sglang/srt/environ.py"


@dataclass
class Entry:
    name: str
    kind: str
    file: Optional[str] = None
    source: Optional[str] = None
    target: Optional[str] = None
    base: str = ""
    variants: Dict[str, str] = field(default_factory=dict)  # base -> file
    applies: Dict[str, List[str]] = field(default_factory=dict)  # file -> releases

    def patch_for(self, release: str) -> Path:
        """The file made on the nearest release at or before `release`, else the entry's own
        (c128patch's select_variant on the linear release history)."""
        files = {**self.variants, self.base: self.file}
        older = [b for b in files if RELEASES.index(b) <= RELEASES.index(release)]
        return PATCHES / (files[max(older, key=RELEASES.index)] if older else self.file)

    def patch_files(self) -> List[str]:
        return [self.file, *self.variants.values()]


def load_series() -> List[Entry]:
    text = MANIFEST.read_text()
    applies = {
        m.group(1): m.group(2).split()
        for m in re.finditer(r'^file = "([^"]+)"\s*#\s*applies:\s*(.*)$', text, re.M)
    }
    entries = []
    for raw in tomllib.loads(text)["entries"]:
        entry = Entry(
            name=raw["name"],
            kind=raw["kind"],
            file=raw.get("file"),
            source=raw.get("source"),
            target=raw.get("target"),
            base=raw["base"],
            variants={v["base"]: v["file"] for v in raw.get("variants", [])},
        )
        if entry.kind == "patch":
            entry.applies = {f: applies.get(f, []) for f in entry.patch_files()}
        entries.append(entry)
    return entries


def touched_files(patch: Path) -> List[str]:
    return re.findall(r"^diff --git a/(\S+) b/", patch.read_text(), re.M)


def series_files(entries: List[Entry]) -> List[str]:
    files = {ENVIRON}
    for entry in entries:
        if entry.kind == "patch":
            for name in entry.patch_files():
                files.update(touched_files(PATCHES / name))
    return sorted(files)


def git_apply(tree: Path, patch: Path, *, check: bool = False) -> subprocess.CompletedProcess:
    cmd = ["git", "apply", *(["--check"] if check else []), str(patch)]
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(tree.parent))
    return subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)


def export_upstream(repo: Path, release: str, dest: Path, files: List[str]) -> None:
    """`files` (python/sglang/... paths) of the release tag, into `dest`."""
    archive = subprocess.run(
        ["git", "--git-dir", str(repo), "archive", "--format=tar", release, *files],
        check=True,
        capture_output=True,
    ).stdout
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def build_tree(
    repo: Path,
    release: str,
    dest: Path,
    *,
    upto: Optional[str] = None,
    overlays: bool = True,
) -> Path:
    """Patched tree at `dest` (a `python/sglang/...` layout); returns `dest / "python"`.

    `repo` is the release history (`sglang_release_repo`). Applies every patch entry in
    manifest order, stopping before the entry named `upto`.
    """
    entries = load_series()
    export_upstream(repo, release, dest, series_files(entries))
    for entry in entries:
        if entry.name == upto:
            break
        if entry.kind == "patch":
            result = git_apply(dest, entry.patch_for(release))
            assert result.returncode == 0, (entry.name, release, result.stderr)
        elif overlays:
            target = dest / entry.target
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO / entry.source, target)
    return dest / "python"


# -- importing from a tree without sglang's package __init__s -------------------------

_PACKAGES = (
    "sglang",
    "sglang.srt",
    "sglang.srt.layers",
    "sglang.srt.layers.attention",
    "sglang.srt.layers.attention.dsv4",
)


@contextlib.contextmanager
def sglang_imports(tree_python: Path) -> Iterator[None]:
    """Make `import sglang.srt.environ` and the dsv4 overlay modules load from
    `tree_python` (the packages are empty stand-ins, so no `__init__` runs)."""
    saved = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    for name in saved:
        del sys.modules[name]
    for name in _PACKAGES:
        module = types.ModuleType(name)
        module.__path__ = [str(tree_python / name.replace(".", "/"))]
        sys.modules[name] = module
    try:
        yield
    finally:
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
