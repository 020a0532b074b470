"""A pytest plugin (``-p c128patch.smoke.upstream_standins``) for ``smoke upstream``: the kernel tier's harness
($C128PATCH_HARNESS) installs the tree in $C128PATCH_TREE with the stand-ins and real packages named by
$C128PATCH_UPSTREAM_PLAN, the names from ``EXTRA`` (ours, each mirroring upstream on a CUDA build outside
CI) over the harness's STANDINS. Stdlib only at import: torch is imported when a stand-in is called."""

from __future__ import annotations

import importlib
import json
import os
import unittest
from collections.abc import Callable
from pathlib import Path
from typing import Any

from c128patch.smoke import load_file

HARNESS_ENV = "C128PATCH_HARNESS"
PLAN_ENV = "C128PATCH_UPSTREAM_PLAN"
TREE_ENV = "C128PATCH_TREE"


def _torch() -> Any:
    import torch

    return torch


def get_device(device_id: int | None = None) -> str:
    """srt/utils/common.py:1073: "cuda" (or "cuda:N") when torch sees a CUDA GPU; upstream's
    CPU engine (SGLANG_USE_CPU_ENGINE=1) and other accelerators are not served here."""
    torch = _torch()
    if torch.cuda.is_available():
        return "cuda" if device_id is None else f"cuda:{device_id}"
    raise RuntimeError("c128patch stand-in get_device: torch sees no CUDA GPU (upstream would try "
                       "XPU/NPU/HPU/MUSA/MPS and platform plugins, which the kernel tier does not carry)")


def get_bool_env_var(name: str, default: str = "false") -> bool:
    """srt/utils/common.py:1424 (0.5.20: :1262): the env var, lower-cased, is "true" or "1" (upstream
    also logs a warning for a value that is neither true/1 nor false/0)."""
    return os.getenv(name, default).lower() in ("true", "1")


# namespace -> our FRAGMENT library: its ops live as long as it does.
_LIBRARIES: dict[str, Any] = {}
# "namespace::op" -> the function registered under it by direct_register_custom_op.
_REGISTERED: dict[str, Callable[..., Any]] = {}
OP_NAMESPACE = "sglang"  # kernels/kernel_api_logging.py:483: debug_torch_op returns torch.ops.sglang.<op_name>


def direct_register_custom_op(op_name: str, op_func: Callable[..., Any], mutates_args: list[str],
                              fake_impl: Callable[..., Any] | None = None, target_lib: Any = None) -> None:
    """srt/utils/common.py:2944 (0.5.20: :2840), called at import by srt/utils/custom_op.py:199: defines
    ``torch.ops.sglang.<op_name>`` (or in ``target_lib``), op_func its CUDA kernel, fake_impl its fake one. The
    same function again is a no-op; another under a registered name is an error (upstream skips it)."""
    torch = _torch()
    if target_lib is None and OP_NAMESPACE not in _LIBRARIES:
        _LIBRARIES[OP_NAMESPACE] = torch.library.Library(OP_NAMESPACE, "FRAGMENT")
    lib = target_lib if target_lib is not None else _LIBRARIES[OP_NAMESPACE]
    qualname = f"{lib.ns}::{op_name}"
    known = _REGISTERED.get(qualname)
    if known is op_func:
        return
    if known is not None:
        raise RuntimeError(f"c128patch stand-in direct_register_custom_op: {qualname} is already registered "
                           f"for {known.__module__}.{known.__qualname__}, not "
                           f"{op_func.__module__}.{op_func.__qualname__}")
    lib.define(op_name + torch.library.infer_schema(op_func, mutates_args=mutates_args))
    lib.impl(op_name, op_func, "CUDA")
    if fake_impl is not None:
        torch.library.register_fake(qualname, fake_impl, lib=lib)
    _REGISTERED[qualname] = op_func


class CustomTestCase(unittest.TestCase):
    """test/test_utils.py:2400: outside CI upstream's class retries nothing (SGLANG_TEST_MAX_RETRY
    unset -> 0) and only wraps setUpClass so tearDownClass runs when it raises; same here."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        setup = cls.__dict__.get("setUpClass")
        if setup is None:
            return
        func = setup.__func__

        def safe_setup(klass: type) -> None:
            try:
                func(klass)
            except Exception:
                try:
                    klass.tearDownClass()
                except Exception:  # noqa: BLE001  (upstream suppresses teardown errors too)
                    pass
                raise

        cls.setUpClass = classmethod(safe_setup)  # type: ignore[method-assign,assignment]


class _CudaPlatform:
    """srt/platforms/cuda.py:54 (CudaSRTPlatform), the one upstream resolves on a CUDA build;
    only what the tests call. Any other attribute fails loudly."""

    def synchronize(self) -> None:
        _torch().cuda.synchronize()

    def __getattr__(self, attr: str) -> Any:
        raise AttributeError(f"c128patch stand-in current_platform has no {attr!r}: upstream's tests now "
                             f"use it; add it in {__file__}")


# module -> name -> object; merged over the harness's STANDINS (these names win where both have one).
EXTRA: dict[str, dict[str, Any]] = {
    "sglang.srt.utils": {"get_device": get_device, "get_bool_env_var": get_bool_env_var},
    "sglang.srt.utils.common": {"get_device": get_device, "get_bool_env_var": get_bool_env_var,
                                "direct_register_custom_op": direct_register_custom_op},
    "sglang.test.test_utils": {"CustomTestCase": CustomTestCase},
    "sglang.srt.platforms": {"current_platform": _CudaPlatform()},
}


def pytest_configure(config: Any) -> None:
    tree, harness_path, plan = (os.environ.get(k) for k in (TREE_ENV, HARNESS_ENV, PLAN_ENV))
    if not (tree and harness_path and plan):
        raise RuntimeError(f"c128patch.smoke.upstream_standins needs ${TREE_ENV}, ${HARNESS_ENV} and ${PLAN_ENV}")
    harness = load_file("c128patch_upstream_harness", Path(harness_path))
    spec = json.loads(plan)
    table: dict[str, dict[str, Any]] = {}  # module -> {name: object}; a wanted name no stand-in has is an error
    for module, names in spec.get("standins", {}).items():
        pool = {**harness.STANDINS.get(module, {}), **EXTRA.get(module, {})}
        missing = [n for n in names if n not in pool]
        if missing:
            raise RuntimeError(f"c128patch: no stand-in for {module}.{', '.join(missing)}")
        table[module] = {n: pool[n] for n in names}
    harness.install_sglang(Path(tree), table, frozenset(harness.REAL_PACKAGES) | set(spec.get("real_packages", [])))
    # A stand-in for a package (sglang.srt.utils) keeps the tree's other submodules reachable: its __path__ is
    # the real folder; its stand-in submodules still come first (the harness's finder is asked before the path).
    for module in table:
        folder = Path(tree).joinpath(*module.split("."))
        if (folder / "__init__.py").is_file():
            importlib.import_module(module).__path__ = [str(folder)]
