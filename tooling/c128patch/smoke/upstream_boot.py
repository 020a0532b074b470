"""A pytest plugin (``-p c128patch.smoke.upstream_boot``) that puts one sglang tree in place
before upstream's own test files are collected: the kernel tier's harness (tests/gpu/harness.py,
loaded from $C128PATCH_HARNESS) registers sglang's packages over the tree in $C128PATCH_TREE,
with the stand-ins and real packages that $C128PATCH_UPSTREAM_PLAN names (JSON, written by
smoke.upstream_suite: ``{"standins": {module: [names]}, "real_packages": [...]}``). A stand-in
name comes from smoke.upstream_standins.EXTRA, else from the harness's STANDINS; a stand-in for a
package leaves the tree's other submodules of that package reachable.
Stdlib only at import: it runs inside the test process.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from c128patch.smoke import load_file

HARNESS_ENV = "C128PATCH_HARNESS"
PLAN_ENV = "C128PATCH_UPSTREAM_PLAN"
TREE_ENV = "C128PATCH_TREE"


def standin_table(harness: Any, wanted: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """module -> {name: object} for the wanted names; a wanted name no stand-in has is an error."""
    from c128patch.smoke.upstream_standins import EXTRA

    table: dict[str, dict[str, Any]] = {}
    for module, names in wanted.items():
        pool = {**harness.STANDINS.get(module, {}), **EXTRA.get(module, {})}
        missing = [n for n in names if n not in pool]
        if missing:
            raise RuntimeError(f"c128patch: no stand-in for {module}.{', '.join(missing)}")
        table[module] = {n: pool[n] for n in names}
    return table


def pytest_configure(config: Any) -> None:
    tree, harness_path, plan = (os.environ.get(k) for k in (TREE_ENV, HARNESS_ENV, PLAN_ENV))
    if not (tree and harness_path and plan):
        raise RuntimeError(f"c128patch.smoke.upstream_boot needs ${TREE_ENV}, ${HARNESS_ENV} and ${PLAN_ENV}")
    harness = load_file("c128patch_upstream_harness", Path(harness_path))
    spec = json.loads(plan)
    real = frozenset(harness.REAL_PACKAGES) | frozenset(spec.get("real_packages", []))
    table = standin_table(harness, spec.get("standins", {}))
    harness.install_sglang(Path(tree), table, real)
    open_standin_packages(Path(tree), table)


def open_standin_packages(tree: Path, table: dict[str, dict[str, Any]]) -> None:
    """A stand-in for a package (sglang.srt.utils) keeps the tree's other submodules reachable
    (0.5.20's dsv4 imports sglang.srt.utils.custom_op, which is light): its ``__path__`` is the
    real folder, as for every other package the harness registers. Its stand-in submodules
    (sglang.srt.utils.common) still come first: the harness's finder is asked before the path."""
    for module in table:
        folder = tree.joinpath(*module.split("."))
        if (folder / "__init__.py").is_file():
            importlib.import_module(module).__path__ = [str(folder)]
