"""Shared GPU test harness: run sglang's real DSV4 C128 JIT kernels from a bare source tree.

A full sglang install is not possible on the GPU machine, and ``import sglang.<anything>`` would
run heavy package ``__init__`` files. :func:`install_sglang` instead registers sglang's packages
as empty modules whose ``__path__`` points at the real folders (so no ``__init__`` runs, except
the few in :data:`REAL_PACKAGES`), gives the two heavy modules the c128 path imports small
stand-ins (:data:`STANDINS`) and imports ``sglang.srt.environ`` for real. Then sglang's own
``load_jit`` builds the kernels with its real flags.

A name that upstream starts importing from a stand-in fails loudly (ImportError naming the
module, the name and this file); :func:`standin_imports` finds such names statically.

Running the tier (the GPU machine carries <= 64 MiB, so carry tree subsets, not whole trees):
``c128patch smoke kernel`` does it all (docs/smoke.md); by hand, after
``ci/gpu/prepare.py`` staged ``.gpu/<rev>/{patched,upstream}`` and the wheels:

    C128PATCH_TREE=.gpu/v0.5.23/patched C128PATCH_UPSTREAM_TREE=.gpu/v0.5.23/upstream python -m pytest tests/gpu

An arm that compares against an upstream API some release lacks calls
:func:`skip_unless_upstream_defines`: it skips there with the release and the name in the reason.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

TREE_ENV = "C128PATCH_TREE"
UPSTREAM_TREE_ENV = "C128PATCH_UPSTREAM_TREE"
SCALE_ENV = "C128PATCH_GPU_SCALE"
RESULTS_ENV = "C128PATCH_GPU_RESULTS_DIR"
JIT_CACHE_ENV = "SGLANG_JIT_CACHE_DIR"
_JIT_CACHE_AUTO = "C128PATCH_JIT_CACHE_AUTO"

# Packages whose __init__ runs for real (light, and the kernel modules import names from them).
REAL_PACKAGES = frozenset({"sglang.kernels.jit.utils", "sglang.kernels.jit.utils.compile"})

# The kernel modules the tier loads; overlay ops modules are loaded by the tests that need them.
KERNEL_MODULES = (
    "sglang.kernels.ops.attention.dsv4.compress",
    "sglang.kernels.ops.attention.dsv4.online_c128_mtp",
)


# --------------------------------------------------------------------------- stand-ins
# Each mirrors upstream's behaviour on a CUDA (non-HIP/XPU/MUSA) build; checked against the
# 0.5.20-0.5.23 imports of the modules above by tests/test_gpu_harness_imports.py.


def _torch() -> Any:
    import torch

    return torch


def _is_cuda() -> bool:
    torch = _torch()
    return torch.cuda.is_available() and torch.version.cuda is not None


def _is_hip() -> bool:
    return _torch().version.hip is not None


def _is_xpu() -> bool:
    torch = _torch()
    return hasattr(torch, "xpu") and torch.xpu.is_available()


def _is_gfx95_supported() -> bool:
    return False  # upstream: False on every non-HIP build


def _get_cuda_version() -> tuple[int, ...]:
    cuda = _torch().version.cuda
    return tuple(map(int, cuda.split("."))) if cuda else (0, 0)


def _is_in_ci() -> bool:
    from sglang.srt.environ import envs

    return envs.SGLANG_IS_IN_CI.get()


_UTILS_NAMES: dict[str, Any] = {
    "is_cuda": _is_cuda,
    "is_hip": _is_hip,
    "is_xpu": _is_xpu,
    "is_gfx95_supported": _is_gfx95_supported,
    "get_cuda_version": _get_cuda_version,
}

STANDINS: dict[str, dict[str, Any]] = {
    # sglang/utils.py pulls IPython, pydantic, requests ...; 0.5.20 imports it at top level.
    "sglang.utils": {"is_in_ci": _is_in_ci},
    "sglang.srt.utils": _UTILS_NAMES,
    "sglang.srt.utils.common": _UTILS_NAMES,
    "sglang.srt.layers.attention.dsa.utils": {
        # c128 never calls these; they feed the norm-rope module's template args.
        "INDEXER_K_CACHE_PRESHUFFLE_TILE": 16,
        "aiter_can_use_preshuffle_paged_mqa": lambda: False,  # upstream: False when not HIP
    },
}


def _standin(name: str, names: dict[str, Any], table: dict[str, dict[str, Any]] = STANDINS) -> types.ModuleType:
    mod = types.ModuleType(name, f"c128patch stand-in for {name} (tests/gpu/harness.py)")
    mod.__dict__.update(names)
    if any(other.startswith(name + ".") for other in table):
        mod.__path__ = []  # a package only so that its stand-in submodules resolve

    def __getattr__(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise ImportError(
            f"c128patch harness: the stand-in for {name} has no {attr!r}: upstream now imports "
            f"it. Check the real one and add it to STANDINS in {__file__}."
        )

    mod.__getattr__ = __getattr__  # type: ignore[attr-defined]
    return mod


# --------------------------------------------------------------------------- import hook


class _Loader(importlib.abc.Loader):
    def __init__(self, make: Callable[[str], types.ModuleType]) -> None:
        self._make = make

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self._make(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _SglangFinder(importlib.abc.MetaPathFinder):
    """sglang packages -> empty modules over the real folders; stand-ins (STANDINS by default)."""

    def __init__(self, tree: Path, standins: dict[str, dict[str, Any]] | None = None,
                 real_packages: frozenset[str] | None = None) -> None:
        self.tree = tree
        self.c128patch_tree = tree  # marks our finder, whichever copy of this module made it
        self.standins = STANDINS if standins is None else standins
        self.real_packages = REAL_PACKAGES if real_packages is None else real_packages

    def find_spec(self, fullname: str, path: Any, target: Any = None):
        if fullname != "sglang" and not fullname.startswith("sglang."):
            return None
        if fullname in self.standins:
            names, table = self.standins[fullname], self.standins
            return importlib.machinery.ModuleSpec(fullname, _Loader(lambda n: _standin(n, names, table)))
        folder = self.tree.joinpath(*fullname.split("."))
        above_standin = any(s.startswith(fullname + ".") for s in self.standins)
        if fullname in self.real_packages or not (folder.is_dir() or above_standin):
            return None  # real module / real package: the normal path finder loads it
        spec = importlib.machinery.ModuleSpec(
            fullname, _Loader(types.ModuleType), origin=str(folder / "__init__.py"), is_package=True
        )
        spec.submodule_search_locations = [str(folder)] if folder.is_dir() else []
        spec.has_location = True
        return spec


def installed_tree() -> Path | None:
    """The tree installed in this process (state lives on sys.meta_path, so it holds even if
    this file is imported twice, as ``harness`` and as ``tests.gpu.harness``)."""
    for finder in sys.meta_path:
        tree = getattr(finder, "c128patch_tree", None)
        if tree is not None:
            return tree
    return None


def _set_cuda_home() -> None:
    """sglang derives CUDA_HOME from `which nvcc` two folders up, which breaks where nvcc is
    a wrapper script; pin it to the toolkit that has lib64/libcudart."""
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        return
    candidates = [Path("/usr/local/cuda")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.insert(0, Path(nvcc).resolve().parent.parent)
    for cand in candidates:
        if (cand / "bin" / "nvcc").exists() and any((cand / "lib64").glob("libcudart.so*")):
            os.environ["CUDA_HOME"] = str(cand)
            return


def default_jit_cache_dir(tree: Path) -> Path:
    """One cache per tree, so a patched and an unpatched tree never share a build; in the temporary folder (a test
    run's own, removed when it ends: a CPU run left its empty caches in /tmp)."""
    digest = hashlib.sha256(str(tree.resolve()).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / "c128patch-jit" / digest


def install_sglang(tree: Path, standins: dict[str, dict[str, Any]] | None = None,
                   real_packages: frozenset[str] | None = None) -> None:
    """Make ``import sglang.kernels.ops.attention.dsv4.compress`` (and overlay ops modules) work
    from ``tree`` (a folder holding ``sglang/``) without the rest of sglang. Idempotent; raises
    if another tree, or a real sglang, is already imported in this process. ``standins`` and
    ``real_packages`` replace STANDINS and REAL_PACKAGES (smoke upstream passes its own)."""
    tree = Path(tree).resolve()
    current = installed_tree()
    if current is not None:
        if current != tree:
            raise RuntimeError(f"sglang already installed from {current}, not {tree}")
        return
    if not (tree / "sglang" / "kernels" / "jit").is_dir():
        raise FileNotFoundError(f"{tree} does not hold sglang/kernels/jit")
    if any(m == "sglang" or m.startswith("sglang.") for m in sys.modules):
        raise RuntimeError("a sglang package is already imported in this process")

    if JIT_CACHE_ENV not in os.environ:
        os.environ[JIT_CACHE_ENV] = str(default_jit_cache_dir(tree))
        os.environ[_JIT_CACHE_AUTO] = "1"  # run_with_tree gives a child tree its own default
    _set_cuda_home()
    torch = _torch()
    if torch.cuda.is_available():
        torch.cuda.init()  # the built .so has no rpath: libcudart must be loaded first

    sys.meta_path.insert(0, _SglangFinder(tree, standins, real_packages))
    import sglang.srt.environ  # noqa: F401  (real, stdlib only)


# --------------------------------------------------------------------------- checks


def gpu_skip_reason() -> str | None:
    """None when torch sees a CUDA GPU, nvcc is found and tvm_ffi imports; else why not."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA GPU"
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if not (shutil.which("nvcc") or (home and (Path(home) / "bin" / "nvcc").exists())):
        return "nvcc not found (PATH / CUDA_HOME)"
    try:
        import tvm_ffi  # noqa: F401
    except ImportError as e:
        return f"tvm_ffi does not import: {e}"
    return None


def _module_files(tree: Path, modules: Iterable[str]) -> list[Path]:
    files = []
    for mod in modules:
        base = tree.joinpath(*mod.split("."))
        files.append(base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py")
    return files


def standin_imports(tree: Path, modules: Iterable[str] = KERNEL_MODULES) -> dict[str, set[str]]:
    """Names imported from a STANDINS module by the given modules and by every module under
    ``sglang/kernels/jit/utils`` (top-level and lazy imports alike), per stand-in module."""
    import ast

    tree = Path(tree)
    files = _module_files(tree, modules) + sorted((tree / "sglang/kernels/jit/utils").rglob("*.py"))
    found: dict[str, set[str]] = {}
    for file in files:
        if not file.exists():
            raise FileNotFoundError(file)
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in STANDINS and not node.level:
                found.setdefault(node.module, set()).update(a.name for a in node.names)
    return found


def missing_standin_names(tree: Path, modules: Iterable[str] = KERNEL_MODULES) -> dict[str, set[str]]:
    out = {}
    for mod, names in standin_imports(tree, modules).items():
        missing = names - set(STANDINS[mod])
        if missing:
            out[mod] = missing
    return out


# --------------------------------------------------------------------------- upstream APIs per release


def tree_release(tree: Path) -> str:
    """The upstream release a tree is (from its c128patch provenance record), or its folder."""
    record = Path(tree) / "sglang" / "c128patch_provenance.json"
    if record.is_file():
        rev = json.loads(record.read_text()).get("upstream", {}).get("rev")
        if rev:
            return str(rev)
    return str(tree)


def upstream_defines(tree: Path, module: str, name: str) -> bool:
    """Whether ``module`` (dotted, under ``tree``) defines ``name`` at top level (def, class or
    assignment), read with ``ast``: nothing is imported."""
    import ast

    files = _module_files(Path(tree), [module])
    if not files[0].exists():
        return False
    for node in ast.parse(files[0].read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
    return False


def skip_unless_upstream_defines(tree: Path, module: str, name: str, arm: str) -> None:
    """Skip, with the release and the missing name in the reason, an arm that compares against
    an upstream API the tree's release does not have (it is not a failure of the series, and
    the skip says so rather than passing silently)."""
    if not upstream_defines(tree, module, name):
        import pytest

        pytest.skip(f"{arm}: upstream {tree_release(tree)} has no {module}.{name} (a later release added it)")


# --------------------------------------------------------------------------- knobs & results


def gpu_scale() -> float:
    return float(os.environ.get(SCALE_ENV, "1.0"))


def scaled(n: int, minimum: int = 1) -> int:
    """``n`` iterations scaled by C128PATCH_GPU_SCALE, at least ``minimum``."""
    return max(minimum, round(n * gpu_scale()))


def write_result(name: str, data: dict[str, Any]) -> Path | None:
    """Write ``<C128PATCH_GPU_RESULTS_DIR>/<name>.json`` when that env is set."""
    out_dir = os.environ.get(RESULTS_ENV)
    if not out_dir:
        return None
    path = Path(out_dir) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
    return path


def run_with_tree(
    tree: Path, code: str, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh Python with ``install_sglang(tree)`` done first (for the unpatched
    kernels, which cannot share a process with the patched ones)."""
    prelude = (
        "import sys; sys.path.insert(0, {here!r}); import harness; "
        "harness.install_sglang(__import__('pathlib').Path({tree!r}))\n"
    ).format(here=str(Path(__file__).parent), tree=str(tree))
    child_env = {**os.environ, **(env or {})}
    if child_env.get(_JIT_CACHE_AUTO) == "1":  # our per-tree default, not the user's choice
        child_env.pop(JIT_CACHE_ENV, None)
        child_env.pop(_JIT_CACHE_AUTO, None)
    return subprocess.run(
        [sys.executable, "-c", prelude + code],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env,
    )
