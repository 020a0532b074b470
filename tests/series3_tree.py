"""Series III (online C128 under DSPARK) helpers for the tests: which entries are series III,
the files the product selects for a release, and importing from a patched tree without
sglang's package ``__init__``s (running one upstream function out of its module:
``upstream_source``, re-exported here).

The manifest, variant choice and patched trees are the product's own (``c128patch.series.manifest``,
``c128patch.series.plan.plan``, ``support.patched_tree`` / the ``series_trees`` fixture).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
import types
from pathlib import Path
from typing import Iterator, List

from c128patch.git import Git
from c128patch.series.manifest import Entry, Series
from c128patch.series.plan import Planned, plan
from support import REPO_ROOT
from upstream_source import (  # noqa: F401  (re-exported for the series III tests)
    function_node,
    load_class,
    load_function,
    load_with_globals,
    parsed,
    required_globals,
)

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
    "python/sglang/srt/mem_cache/deepseek_v4_compress_state.py",
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
    from series3_standins import TRITON_DOC, install_runtime_context, install_triton_standin

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


def pretend_cuda_build(monkeypatch) -> None:
    """This CPU machine's torch as a CUDA build, for the platform rule (the kernels never run
    on these tests' CPU tensors; ops are torch models there)."""
    import torch

    monkeypatch.setattr(torch.version, "cuda", torch.version.cuda or "12.8")
    monkeypatch.setattr(torch.version, "hip", None)
