"""What sglang's JIT kernels (and the series' own) need at startup on this host: nvcc (CUDA_HOME),
apache-tvm-ffi in the serving Python as sglang pins it, and an NVIDIA GPU, with its architecture.
Probed with the kernel smoke tier's helpers and ``nvidia-smi``; nothing imports torch."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement

from c128patch.serve.install import Interpreter
from c128patch.smoke.device import probe_nvcc

# Where the series' GPU evidence was recorded (ci/gpu/results/: H200).
EVIDENCE_ARCHS = {"9.0": "H200"}


@dataclass
class Gpu:
    name: str
    capability: str  # "9.0"

    @property
    def sm(self) -> str:
        return "sm_" + self.capability.replace(".", "")


def gpus() -> tuple[list[Gpu], str]:
    """The GPUs nvidia-smi lists (name, compute capability), or why there are none."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], "nvidia-smi not found"
    try:
        proc = subprocess.run([smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"nvidia-smi failed: {exc}"
    if proc.returncode != 0:
        return [], f"nvidia-smi failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:] or ['?']}"
    out = []
    for line in proc.stdout.strip().splitlines():
        name, _, cap = line.rpartition(",")
        out.append(Gpu(name.strip(), cap.strip()))
    return out, "" if out else "nvidia-smi lists no GPU"


def nvcc() -> dict[str, str]:
    """{'nvcc': path, 'nvcc_version': 'X.Y'} or {} (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)."""
    return {k: str(v) for k, v in probe_nvcc().items()}


def cuda_home() -> str | None:
    return os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")


def tvm_ffi_problem(interp: Interpreter) -> str | None:
    """None when apache-tvm-ffi is installed as sglang requires it; else what is wrong."""
    have = interp.dists.get("apache-tvm-ffi")
    sglang = interp.sglang
    wanted = []
    for text in (sglang.requires if sglang else []):
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.name == "apache-tvm-ffi" and (req.marker is None or req.marker.evaluate()):
            wanted.append(req)
    if have is None:
        pin = f" ({wanted[0]})" if wanted else ""
        return f"apache-tvm-ffi is not installed in {interp.executable}{pin}: sglang's JIT kernels load through it"
    for req in wanted:
        if not req.specifier.contains(have.version, prereleases=True):
            return f"apache-tvm-ffi {have.version} is installed, sglang requires {req}"
    return None
