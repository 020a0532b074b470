"""Torch-free stand-ins for the series III tests: `sglang.srt.runtime_context` (the live
config the controller and startup read) and, where it is not installed, triton. Kept apart
from `series3_sim` (which needs torch) so tests of torch-free upstream code run without torch."""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any

from c128patch.fit.scenario_models import RUNTIME_CONTEXT, launch_namespaces, runtime_context_standin

# -- the live config the controller reads (sglang.srt.runtime_context) -------------------


def install_runtime_context(**overrides: Any) -> types.ModuleType:
    """Put a `runtime_context_standin` in sys.modules (replacing an earlier stand-in)."""
    current = sys.modules.get(RUNTIME_CONTEXT)
    assert current is None or "stand-in" in (current.__doc__ or ""), "a real runtime_context is loaded"
    mod = runtime_context_standin(launch_namespaces(**overrides))
    sys.modules[RUNTIME_CONTEXT] = mod
    return mod


TRITON_DOC = "c128patch stand-in for triton (tests/series3_standins.py)"


def install_triton_standin() -> bool:
    """Where triton is not installed (CPU machines), a stand-in with what
    `kernels/ops/speculative/ragged_verify_kernels.py` needs at import (`triton.jit`,
    `triton.language`), so its torch paths (CPU tensors) run; a jitted kernel called
    anyway fails loudly. Returns whether the stand-in was installed."""
    if "triton" in sys.modules or importlib.util.find_spec("triton") is not None:
        return False

    def _not_here(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("triton is not installed: the stand-in cannot run a triton kernel")

    triton = types.ModuleType("triton", TRITON_DOC)
    triton.jit = lambda fn=None, **kw: (lambda f: _StandinKernel(f)) if fn is None else _StandinKernel(fn)
    triton.next_power_of_2 = _not_here
    language = types.ModuleType("triton.language", TRITON_DOC)
    triton.language = language
    sys.modules["triton"], sys.modules["triton.language"] = triton, language
    return True


def real_triton() -> bool:
    """Whether the real triton is importable (not the stand-in)."""
    mod = sys.modules.get("triton")
    if mod is not None:
        return mod.__doc__ != TRITON_DOC
    return importlib.util.find_spec("triton") is not None


class _StandinKernel:
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __getitem__(self, grid: Any) -> Any:
        raise RuntimeError(f"triton is not installed: cannot launch {self.fn.__name__}")
