"""Torch-free stand-ins for the series III tests: `sglang.srt.runtime_context` (the live
config the controller and startup read) and, where it is not installed, triton. Kept apart
from `series3_sim` (which needs torch) so tests of torch-free upstream code run without torch."""

from __future__ import annotations

import importlib.util
import sys
import types
from types import SimpleNamespace
from typing import Any, Dict

# -- the live config the controller reads (sglang.srt.runtime_context) -------------------

RUNTIME_CONTEXT = "sglang.srt.runtime_context"


def launch_namespaces(**overrides: Any) -> Dict[str, Any]:
    """Resolved config namespaces of a default single-GPU DSPARK launch (upstream's field
    defaults; `device` resolved to cuda), as `get_exec()` / `get_disagg()` / `get_device()`
    / `get_parallel()` serve them. `overrides`: field name -> value."""
    fields = dict(
        enable_two_batch_overlap=False, enable_pdmux=False, disaggregation_mode="null",
        device="cuda", attn_dp_size=1, attn_cp_size=1, dcp_size=1, pp_size=1,
        attention_backend="dsv4", prefill_attention_backend=None, decode_attention_backend=None,
    )
    unknown = set(overrides) - set(fields)
    assert not unknown, unknown
    fields.update(overrides)
    return dict(
        exec_=SimpleNamespace(
            overlap=SimpleNamespace(enable_two_batch_overlap=fields["enable_two_batch_overlap"]),
            kernel=SimpleNamespace(**{k: fields[k] for k in (
                "attention_backend", "prefill_attention_backend", "decode_attention_backend")}),
        ),
        disagg=SimpleNamespace(enable_pdmux=fields["enable_pdmux"], disaggregation_mode=fields["disaggregation_mode"]),
        device=SimpleNamespace(device=fields["device"]),
        parallel=SimpleNamespace(**{k: fields[k] for k in ("attn_dp_size", "attn_cp_size", "dcp_size", "pp_size")}),
    )


def runtime_context_standin(namespaces: Dict[str, Any]) -> types.ModuleType:
    """A stand-in for `sglang.srt.runtime_context` (its heavy imports cannot load here)
    serving `namespaces` through the getters the controller calls."""
    mod = types.ModuleType(RUNTIME_CONTEXT, "c128patch stand-in (tests/series3_standins.py)")
    mod.get_exec = lambda: namespaces["exec_"]
    mod.get_disagg = lambda: namespaces["disagg"]
    mod.get_device = lambda: namespaces["device"]
    mod.get_parallel = lambda: namespaces["parallel"]
    return mod


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
