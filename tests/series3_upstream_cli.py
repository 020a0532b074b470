"""What a release's launch CLI and resolved config namespaces hold, read from its source (AST):
the ground truth `online_c128_dspark_rules.config_from_args` / `config_from_context` are
checked against on every release.

* `cli_flags(files)`: dest -> Flag(names, is_switch, default) for every field of
  `arg_groups/fields/*.py` that has a CLI (`A[T, "help"]` or `A[T, Arg(...)]` without
  `no_cli`), plus the flags `server_args.py` registers by hand (`parser.add_argument`).
* `namespace_fields(files)`: namespace path (`exec.overlap`, `disagg`, ...) -> field names,
  from the structs' `_NS_PATH`; `parallel_fields(files)`: what `get_parallel()` answers.
"""

from __future__ import annotations

import ast
from typing import Dict, Iterable, NamedTuple, Optional, Set, Tuple

from c128patch.git import Git

FIELDS_DIR = "python/sglang/srt/arg_groups/fields"
SERVER_ARGS = "python/sglang/srt/server_args.py"
RUNTIME_CONTEXT = "python/sglang/srt/runtime_context.py"


class Flag(NamedTuple):
    names: Tuple[str, ...]
    is_switch: bool  # store_true
    default: object


def release_files(repo, tag: str) -> Dict[str, str]:
    """path -> text of the fields modules, server_args.py and runtime_context.py of `tag`."""
    git = Git(git_dir=repo)
    paths = [p for p in git.out("ls-tree", "--name-only", f"{tag}:{FIELDS_DIR}").split() if p.endswith(".py")]
    out = {f"{FIELDS_DIR}/{p}": git.blob(tag, f"{FIELDS_DIR}/{p}").decode() for p in paths}
    for path in (SERVER_ARGS, RUNTIME_CONTEXT):
        out[path] = git.blob(tag, path).decode()
    return out


def _keywords(call: ast.Call) -> Dict[str, ast.AST]:
    return {k.arg: k.value for k in call.keywords if k.arg}


def _literal(node: Optional[ast.AST]) -> object:
    try:
        return ast.literal_eval(node) if node is not None else None
    except ValueError:
        return ast.unparse(node)


def _field_flag(name: str, annotation: ast.AST, default: Optional[ast.AST]) -> Optional[Flag]:
    if not (isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value) == "A"):
        return None
    parts = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
    type_node, meta = parts[0], parts[1] if len(parts) > 1 else None
    names = ["--" + name.replace("_", "-")]
    action = None
    if isinstance(meta, ast.Call) and ast.unparse(meta.func) == "Arg":
        kw = _keywords(meta)
        if _literal(kw.get("no_cli")) is True:
            return None
        if "cli_name" in kw:
            names = [_literal(kw["cli_name"])]
        names += list(_literal(kw.get("aliases")) or [])
        action = ast.unparse(kw["action"]) if "action" in kw else None
    elif not (isinstance(meta, ast.Constant) and isinstance(meta.value, str)):
        return None
    switch = ast.unparse(type_node) == "bool" and action is None
    return Flag(tuple(names), switch, _literal(default))


def cli_flags(files: Dict[str, str]) -> Dict[str, Flag]:
    flags: Dict[str, Flag] = {}
    for path, text in files.items():
        if not path.startswith(FIELDS_DIR):
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                for stmt in node.body:
                    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                        flag = _field_flag(stmt.target.id, stmt.annotation, stmt.value)
                        if flag is not None:
                            flags[stmt.target.id] = flag
    for node in ast.walk(ast.parse(files[SERVER_ARGS])):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("add_argument"):
            names = tuple(a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--"))
            if not names:
                continue
            kw = _keywords(node)
            dest = _literal(kw["dest"]) if "dest" in kw else names[0][2:].replace("-", "_")
            action = ast.unparse(kw["action"]) if "action" in kw else ""
            switch = "store_true" in action or "StoreTrue" in action
            flags[dest] = Flag(names, switch, _literal(kw.get("default")))
    return flags


def namespace_fields(files: Dict[str, str]) -> Dict[str, Set[str]]:
    out: Dict[str, Set[str]] = {}
    for path, text in files.items():
        if not path.startswith(FIELDS_DIR):
            continue
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.ClassDef):
                continue
            ns = next(
                (_literal(s.value) for s in node.body
                 if isinstance(s, ast.Assign) and [ast.unparse(t) for t in s.targets] == ["_NS_PATH"]),
                None,
            )
            if ns is not None:
                out.setdefault(ns, set()).update(
                    s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                )
    return out


def parallel_fields(files: Dict[str, str]) -> Set[str]:
    """What `get_parallel()` answers besides live ranks/groups: the `parallel` namespace's
    fields and its `Derived` names, and (0.5.20) `runtime_context._PARALLEL_FIELDS`."""
    out = set(namespace_fields(files).get("parallel", ()))
    for path, text in files.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["_PARALLEL_FIELDS"]:
                out.update(_literal(node.value.args[0]))
            if (path.startswith(FIELDS_DIR) and isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                    and ast.unparse(node.value.func) == "Derived"):
                out.update(ast.unparse(t) for t in node.targets)
    return out


def module_functions(text: str) -> Set[str]:
    return {n.name for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)}


class Recorder:
    """Records the attribute paths read from it (`a.b.c`); leaves answer `leaf(path)`."""

    def __init__(self, path: str, reads: Set[str], leaf) -> None:
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_reads", reads)
        object.__setattr__(self, "_leaf", leaf)

    def __getattr__(self, name: str):
        path = f"{self._path}.{name}"
        value = self._leaf(path)
        if value is None:
            return Recorder(path, self._reads, self._leaf)
        self._reads.add(path)
        return value


def flag_names(flags: Iterable[Flag]) -> Set[str]:
    return {n for f in flags for n in f.names}
