"""ci/compile_kernels.py: same translation unit as sglang's loader, every series header covered,
and a header that does not compile fails the run, naming the kernel."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "ci"))
sys.path.insert(0, str(REPO / "tests" / "gpu"))

import compile_kernels as ck  # noqa: E402

import harness  # noqa: E402
import tree_subset  # noqa: E402


def test_every_series_header_has_a_row():
    headers = ck.series_headers()
    assert {"deepseek_v4/c128_online_v2.cuh", "deepseek_v4/c_plan.cuh"} <= headers
    assert headers <= {k.cuh for k in ck.KERNELS}


def test_wrapper_matches_sglang_loader(tmp_path: Path, patched_tree_023: Path):
    for mod in ("torch", "tvm_ffi", "msgspec"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} not installed")
    tree_subset.copy_subset(patched_tree_023, tmp_path)
    rows = [
        (str((tmp_path / ck.CSRC_UNDER / k.cuh).resolve()),
         [(e, s.format(args=", ".join(k.args))) for e, s in k.wrappers],
         ck.wrapper_source((tmp_path / ck.CSRC_UNDER / k.cuh).resolve(), k))
        for k in ck.KERNELS
    ]  # fmt: skip
    code = (
        "import json, sys\n"
        "from sglang.kernels.jit.utils.compile.spec import _wrapper_source\n"
        f"rows = json.loads({json.dumps(json.dumps(rows))})\n"
        "print('SAME' if all(_wrapper_source((f,), tuple(map(tuple, w))) == ours for f, w, ours in rows) else 'DIFF')\n"
    )
    proc = harness.run_with_tree(tmp_path, code)
    assert "SAME" in proc.stdout, proc.stdout + proc.stderr[-3000:]


def test_compile_failure_names_the_kernel(tmp_path: Path, release_trees):
    if not shutil.which("nvcc") or importlib.util.find_spec("tvm_ffi") is None:
        pytest.skip("nvcc / tvm_ffi not available")
    tree_subset.copy_subset(release_trees["v0.5.23"], tmp_path)
    c_plan = tmp_path / ck.CSRC_UNDER / "deepseek_v4/c_plan.cuh"
    c_plan.write_text(c_plan.read_text().replace("RuntimeCheck(counter == num_q_tokens);", "RuntimeCheck(counter == num_q_tokens)", 1))
    proc = subprocess.run(
        [sys.executable, str(REPO / "ci/compile_kernels.py"), str(tmp_path), "--only", "compress_plan", "--json"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert [k["name"] for k in report["kernels"] if not k["ok"]] == ["compress_plan"]
    assert "FAILED: compress_plan (deepseek_v4/c_plan.cuh)" in proc.stderr
    assert "c_plan.cuh" in report["kernels"][0]["log"]


def test_patched_series_kernels_compile_for_sm90a(patched_tree_023: Path):
    """CI has nvcc but no GPU: every patched and added kernel must build for sm_90a."""
    if not shutil.which("nvcc") or importlib.util.find_spec("tvm_ffi") is None:
        pytest.skip("nvcc / tvm_ffi not available")
    proc = subprocess.run([sys.executable, str(REPO / "ci/compile_kernels.py"), str(patched_tree_023), "--json"],
                          capture_output=True, text=True)
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    built = {k["name"] for k in report["kernels"] if k["ok"]}
    assert built == {k.name for k in ck.KERNELS}
