"""Shared helpers of the DSPARK online-c128 GPU tests (harness access, sizes, results)."""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
SCALE_ENV = "C128PATCH_GPU_SCALE"
RESULTS_ENV = "C128PATCH_GPU_RESULTS_DIR"
SEED_ENV = "C128PATCH_GPU_SEED"


def harness() -> ModuleType:
    """The series1 harness module, whichever way conftest imported it."""
    for name in ("tests.gpu.harness", "harness"):
        mod = sys.modules.get(name)
        if mod is not None and hasattr(mod, "install_sglang"):
            return mod
    try:
        return importlib.import_module("tests.gpu.harness")
    except ImportError:
        if str(HERE) not in sys.path:
            sys.path.insert(0, str(HERE))
        return importlib.import_module("harness")


def scale() -> float:
    return float(os.environ.get(SCALE_ENV, "1.0"))


def scaled(count: int, minimum: int) -> int:
    """`count` scaled by C128PATCH_GPU_SCALE, never below `minimum` (keeps every path)."""
    return max(minimum, int(round(count * scale())))


def base_seed() -> int:
    return int(os.environ.get(SEED_ENV, "20261129"))


def write_results(name: str, payload: dict[str, Any]) -> Path | None:
    """Write `<results dir>/<name>.json` when C128PATCH_GPU_RESULTS_DIR is set."""
    out_dir = os.environ.get(RESULTS_ENV)
    if not out_dir:
        return None
    path = Path(out_dir) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_jsonable(payload), indent=2, sort_keys=True) + "\n")
    return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    return value


def install(tree: Any) -> None:
    harness().install_sglang(Path(tree))


def dspark_ops() -> ModuleType:
    """Our overlay ops module from the installed (patched) tree."""
    try:
        return importlib.import_module("sglang.kernels.ops.attention.dsv4.online_c128_dspark")
    except ImportError as e:  # the tree lacks our overlay: a setup error, say so
        raise AssertionError(
            "the patched tree has no sglang.kernels.ops.attention.dsv4.online_c128_dspark "
            "(install overlay/ and csrc/ into it)"
        ) from e


def close_report(actual, expected, rtol: float, atol: float):
    """(ok, max_abs_err, max_excess, index) for float64 numpy/torch arrays; NaN fails."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    err = np.abs(a - e)
    bound = atol + rtol * np.abs(e)
    bad = ~(err <= bound)  # NaN counts as bad
    if a.size == 0:
        return True, 0.0, 0.0, None
    excess = np.where(np.isnan(err), np.inf, err - bound)
    idx = np.unravel_index(int(np.argmax(excess)), a.shape)
    max_err = float(np.nanmax(err)) if np.isfinite(err).any() else float("nan")
    return (not bad.any()), max_err, float(excess[idx]), idx
