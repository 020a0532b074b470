"""What the GPU machine has (GPU, driver, torch, nvcc, tvm_ffi, compute-sanitizer) and whether
the kernel tier can run there. Probed in subprocesses: the tool itself never imports torch."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from c128patch.errors import C128Error
from c128patch.procs import run

# Run by the suite's Python; prints one JSON object. Initialises CUDA only through torch.
# (first: ``python -c`` puts the current folder first on sys.path: a tree's top-level json.py ran, as the operator, when
# smoke was run from inside it; helper 147, as doctor's probes, serve.serving._COMMON)
NO_CWD = "import sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]\n"
_PROBE = NO_CWD + r"""
import json, platform
info = {"python": platform.python_version()}
try:
    import torch
    info["torch"] = torch.__version__
    info["torch_cuda"] = torch.version.cuda
    info["cuda_available"] = bool(torch.cuda.is_available())
    if info["cuda_available"]:
        info["gpu_count"] = torch.cuda.device_count()
        info["gpu"] = torch.cuda.get_device_name(0)
        info["capability"] = "%d.%d" % torch.cuda.get_device_capability(0)
except Exception as e:
    info["torch_error"] = "%s: %s" % (type(e).__name__, e)
try:
    import pytest
    info["pytest"] = pytest.__version__
except Exception as e:
    info["pytest_error"] = "%s: %s" % (type(e).__name__, e)
try:
    import tvm_ffi
    info["tvm_ffi"] = getattr(tvm_ffi, "__version__", "unknown")
except Exception as e:
    info["tvm_ffi_error"] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(info))
"""


def run_child(argv: list[str], timeout: float) -> tuple[str, str]:
    """(stdout, "") of ``argv`` run under ``timeout``; ("", its last output line) where it exits non-zero."""
    try:
        proc = run(argv, timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc  # (the path once, not in exc too)
        raise C128Error(f"cannot run {argv[0]}: {why}") from exc
    if proc.returncode == 0:
        return proc.stdout, ""
    return "", ((proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"])[0]


def probe_python(python: str) -> dict[str, Any]:
    """torch, CUDA, pytest and tvm_ffi as the suite's Python sees them."""
    try:
        out, why = run_child([python, "-c", _PROBE], 300)
    except C128Error as exc:
        return {"python_error": f"{python}: {exc.message}"}
    lines = out.strip().splitlines()
    if not lines:
        return {"python_error": f"{python}: {why or 'it printed nothing'}"}
    return json.loads(lines[-1])


def nvidia_smi(fields: str) -> tuple[list[tuple[str, str]], str]:
    """nvidia-smi's rows of two ``fields`` (such as "name,compute_cap"), or why there are none."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], "nvidia-smi not found"
    try:
        out, why = run_child([smi, f"--query-gpu={fields}", "--format=csv,noheader"], 60)
    except C128Error as exc:
        why = exc.message
    if why:
        return [], f"nvidia-smi failed: {why}"
    rows = [(name.strip(), value.strip()) for name, _, value in (r.rpartition(",") for r in out.strip().splitlines())]
    return rows, "" if rows else "nvidia-smi lists no GPU"


def _tool(name: str, key: str, version: str) -> dict[str, Any]:
    """``name`` (PATH, next to nvcc, $CUDA_HOME/bin, /usr/local/cuda/bin) and the version ``--version`` prints."""
    nvcc = shutil.which("nvcc")
    homes = [Path(p) for p in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")) if p]
    dirs = [Path(nvcc).resolve().parent] if nvcc else []
    dirs += [h / "bin" for h in (*homes, Path("/usr/local/cuda"))]
    exe = shutil.which(name) or next((str(d / name) for d in dirs if (d / name).is_file()
                                      and os.access(d / name, os.X_OK)), None)
    if exe is None:
        return {}
    try:
        match = re.search(version, run_child([exe, "--version"], 60)[0])
    except C128Error:
        match = None
    return {key: exe, f"{key}_version": match.group(1) if match else "unknown"}


def probe_nvcc() -> dict[str, Any]:
    return _tool("nvcc", "nvcc", r"release (\d+\.\d+)")


def probe_device(python: str) -> dict[str, Any]:
    """Everything the report's ``device`` records."""
    device = {"python_executable": python, **probe_python(python), **probe_nvcc(),
              **_tool("compute-sanitizer", "compute_sanitizer", r"Version (\S+)")}
    rows, _ = nvidia_smi("name,driver_version")
    if rows:
        device.update(smi_gpu=rows[0][0], driver=rows[0][1])
    return device


def prerequisite_problem(device: dict[str, Any], sanitizers: tuple[str, ...] = ()) -> str | None:
    """None when the kernel tier can run here; else one line saying what is missing."""
    if "python_error" in device:
        return f"cannot run the suite's Python: {device['python_error']}"
    if "pytest_error" in device:
        return (f"pytest does not import ({device['pytest_error']}); the suite runs as `python -m pytest`: install "
                "pytest for the suite's Python")
    if "torch_error" in device:
        return f"torch does not import ({device['torch_error']}); the kernel tier needs a CUDA build of torch"
    if not device.get("torch_cuda"):
        return f"torch {device.get('torch')} is a CPU build (torch.version.cuda is None); install a CUDA build"
    if not device.get("cuda_available"):
        return f"torch {device.get('torch')} sees no CUDA GPU (driver not loaded, or CUDA_VISIBLE_DEVICES hides it)"
    if not device.get("nvcc"):
        return "nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin): sglang's JIT kernels are built with it"
    nvcc_major, torch_major = (str(device.get(k) or "").split(".")[0] for k in ("nvcc_version", "torch_cuda"))
    if nvcc_major and nvcc_major != "unknown" and torch_major and nvcc_major != torch_major:
        return (f"torch is built for CUDA {device['torch_cuda']} but nvcc is {device['nvcc_version']}: the JIT "
                "kernels would link a CUDA runtime torch did not load; use a matching toolkit (CUDA_HOME)")
    if "tvm_ffi_error" in device or not device.get("tvm_ffi"):
        return (f"tvm_ffi does not import ({device.get('tvm_ffi_error', 'missing')}); "
                "install apache-tvm-ffi (sglang 0.5.23 pins 0.1.11) for the suite's Python")
    if sanitizers and not device.get("compute_sanitizer"):
        return "compute-sanitizer not found (PATH, next to nvcc, $CUDA_HOME/bin), needed by --sanitizer"
    return None


def require_device(python: str, sanitizers: tuple[str, ...] = ()) -> dict[str, Any]:
    """What :func:`probe_device` finds, refused with the one line saying what is missing."""
    device = probe_device(python)
    problem = prerequisite_problem(device, sanitizers)
    if problem:
        raise C128Error(problem)
    return device


def describe(device: dict[str, Any]) -> str:
    parts = [device.get("gpu") or device.get("smi_gpu") or "no GPU"]
    labels = (("driver", "driver"), ("torch", "torch"), ("nvcc_version", "nvcc"), ("tvm_ffi", "tvm_ffi"))
    return ", ".join(parts + [f"{label} {device[key]}" for key, label in labels if device.get(key)])
