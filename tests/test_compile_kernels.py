"""ci/compile_kernels.py: same translation unit as sglang's loader, every series header covered,
every patched and added kernel plus the upstream signature probe built for sm_90a on every
supported release, and a build that fails names the kernel (or the upstream helper)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import RELEASES

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "ci"))
sys.path.insert(0, str(REPO / "tests" / "gpu"))

import compile_kernels as ck  # noqa: E402

import harness  # noqa: E402
import tree_subset  # noqa: E402

needs_nvcc = pytest.mark.skipif(not shutil.which("nvcc") or importlib.util.find_spec("tvm_ffi") is None,
                                reason="nvcc / tvm_ffi not available")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "ci/compile_kernels.py"), *args], capture_output=True, text=True)


def test_every_series_header_has_a_row():
    headers = ck.series_headers()
    assert {"deepseek_v4/c128_online_v2.cuh", "deepseek_v4/c_plan.cuh"} <= headers
    assert headers <= {k.cuh for k in ck.KERNELS}


@pytest.mark.parametrize("tag", RELEASES)
def test_wrapper_matches_sglang_loader(tmp_path: Path, patched_trees, tag: str):
    for mod in ("torch", "tvm_ffi", "msgspec"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} not installed")
    tree_subset.copy_subset(patched_trees[tag], tmp_path)
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


@needs_nvcc
def test_compile_failure_names_the_kernel(tmp_path: Path, release_trees):
    tree_subset.copy_subset(release_trees["v0.5.23"], tmp_path)
    c_plan = tmp_path / ck.CSRC_UNDER / "deepseek_v4/c_plan.cuh"
    c_plan.write_text(c_plan.read_text().replace("RuntimeCheck(counter == num_q_tokens);", "RuntimeCheck(counter == num_q_tokens)", 1))
    proc = _run(str(tmp_path), "--only", "compress_plan", "--json")
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert [k["name"] for k in report["kernels"] if not k["ok"]] == ["compress_plan"]
    assert "FAILED: compress_plan (deepseek_v4/c_plan.cuh)" in proc.stderr
    assert "c_plan.cuh" in report["kernels"][0]["log"]


@needs_nvcc
def test_signature_probe_names_the_upstream_helper_that_changed(tmp_path: Path, release_trees):
    """An upstream release that changes AlignedVector::load's offset type (the kernels would still
    compile) fails the probe, naming the helper."""
    tree_subset.copy_subset(release_trees["v0.5.23"], tmp_path)
    vec = tmp_path / "sglang/kernels/jit/include/sgl_kernel/vec.cuh"
    old = "SGL_DEVICE void load(const void* ptr, int64_t offset = 0)"
    assert old in vec.read_text()
    vec.write_text(vec.read_text().replace(old, "SGL_DEVICE void load(const void* ptr, int32_t offset = 0)"))
    proc = _run(str(tmp_path), "--only", ck.PROBE.name, "--json")
    assert proc.returncode == 1
    (row,) = json.loads(proc.stdout)["kernels"]
    assert row["failed_helpers"] == ["device::AlignedVector<T, N>::load(const void*, int64_t offset = 0) -> void"]
    assert "FAILED: upstream signature probe: device::AlignedVector<T, N>::load" in proc.stderr


def test_probe_failures_map_a_hard_error_to_its_pin():
    """An error that is not a static_assert (a helper gone) is named by the pin it falls in."""
    text = ck.PROBE_SOURCE.read_text().splitlines()
    line = next(i for i, t in enumerate(text, 1) if t.startswith("C128_FACT(pdl_wait,")) + 1
    log = f"{ck.PROBE_SOURCE.name}({line}): error: namespace has no member \"PDLWaitPrimary\""
    assert ck.probe_failures(log) == ["device::PDLWaitPrimary<bool>() -> void"]


@needs_nvcc
def test_patched_kernels_and_probe_compile_for_sm90a_on_every_release():
    """CI has nvcc but no GPU: every patched and added kernel, and the signature probe, must build
    for sm_90a on each supported release with the series applied."""
    proc = _run("--all-releases", "--json")
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert sorted(report["releases"]) == sorted(RELEASES)
    for tag, rel in report["releases"].items():
        assert {k["name"] for k in rel["kernels"] if k["ok"]} == {k.name for k in ck.ROWS}, tag
    # the CI log says what was built, per release
    print("\n".join(f"{tag}: {len(rel['kernels'])} builds ok (incl. signature probe), key {rel['key']}"
                    for tag, rel in report["releases"].items()))
