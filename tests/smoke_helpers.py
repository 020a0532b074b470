"""Throwaway GPU suites, trees and device descriptions for the smoke tests (CPU only).

The suites are real pytest folders run by ``smoke`` in a real subprocess; they stand in for
tests/gpu (harness API: C128PATCH_TREE, C128PATCH_UPSTREAM_TREE, C128PATCH_GPU_SCALE,
C128PATCH_GPU_RESULTS_DIR) and record what they saw, so the tests check the plumbing end to end.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from c128patch.series.provenance import PROVENANCE_PATH
from c128patch.smoke import procs
from c128patch.smoke.kernel import UNSEALED


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (Linux /proc: the tests' machines)."""
    st = procs._stat(pid)
    return st is not None and st.state != "Z"

# What the GPU machine reports (docs/gpu-kernel-harness.md): used where a test must get past the
# prerequisite check on this CPU machine.
H200 = {
    "python_executable": "python3", "python": "3.12.3", "torch": "2.11.0+cu130", "torch_cuda": "13.0",
    "cuda_available": True, "gpu_count": 1, "gpu": "NVIDIA H200", "capability": "9.0", "tvm_ffi": "0.1.11",
    "nvcc": "/usr/local/cuda/bin/nvcc", "nvcc_version": "13.0", "driver": "580.65.06", "smi_gpu": "NVIDIA H200",
}

CONFTEST = '''
import json, os
from pathlib import Path
import pytest

def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU")

def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(pytest.mark.gpu)

@pytest.fixture
def patched_tree():
    if os.environ.get("FAKE_NO_GPU"):
        pytest.skip("GPU tier: torch sees no CUDA GPU")
    return Path(os.environ["C128PATCH_TREE"])

def write_result(name, data):
    out = os.environ.get("C128PATCH_GPU_RESULTS_DIR")
    if out:
        Path(out, name + ".json").write_text(json.dumps(data))
'''


def make_suite(root: Path, tests: dict[str, str]) -> Path:
    """A GPU-suite folder: the conftest above plus ``tests`` (file name -> source)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "conftest.py").write_text(CONFTEST)
    for name, src in tests.items():
        (root / name).write_text(textwrap.dedent(src))
    return root


def make_tree(root: Path, provenance: dict | None = None, marker: str | None = None) -> Path:
    """A checkout-like folder (``root/python/sglang/kernels/jit``), optionally patched-looking."""
    pkg = root / "python" / "sglang"
    (pkg / "kernels" / "jit").mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    if marker:
        (pkg / marker).write_text("1\n")
    if provenance is not None:
        (root / PROVENANCE_PATH).write_text(json.dumps(provenance))
    return root


def provenance_record(commit: str = "0" * 40, rev: str = "v0.5.23") -> dict:
    """A record in the shape provenance.build writes."""
    return {
        "schema": 1,
        "tool": {"name": "c128patch", "version": "0.1.0"},
        "series": {"name": "c128", "version": "1", "digest": "ab" * 32},
        "upstream": {"rev": rev, "commit": commit, "source": "release"},
        "entries": [{"name": "c128-plan-zero-rows", "kind": "patch", "gate": "", "files": []},
                    {"name": "dspark-record-streams", "kind": "patch", "gate": "SGLANG_DSPARK_RECORD_VERIFY_STREAMS",
                     "files": []}],
    }


def signal_when_ready(cmd: list[str], env: dict, ready, sig: int, code: int, poll: float = 0.05) -> str:
    """Start ``cmd``, wait (<= 30 s) until ``ready()``, send ``sig``; assert the exit ``code``.
    Returns stderr."""
    import subprocess
    import time

    from support import default_signals

    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_signals)
    try:
        deadline = time.monotonic() + 30
        while not ready():
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(poll)
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err
    return err


def one_line_error(res, contains: str) -> None:
    """A refused smoke command: exit 2, one ``c128patch: error:`` line on stderr naming ``contains``."""
    assert res.code == 2, (res.code, res.text, res.err)
    lines = [x for x in res.err.strip().splitlines() if x != UNSEALED]  # (the tree's code ran: said before)
    assert len(lines) == 1 and lines[0].startswith("c128patch: error: "), res.err
    assert contains in lines[0], lines[0]
