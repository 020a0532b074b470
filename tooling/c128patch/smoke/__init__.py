"""GPU smoke tests: the kernel tier (trees, passes, sanitizer, pytest plugin), upstream's own tests
(upstream_*), the server tier (processes, logs) and the reports as printed (render)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def load_file(name: str, path: Path) -> ModuleType:
    """The file at ``path`` (the GPU suite's harness.py, tree_subset.py) run as module ``name``; stdlib only."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"c128patch: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
