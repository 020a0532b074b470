"""ci/compile_kernels.py: same translation unit as sglang's loader, every series header covered,
every patched and added kernel plus the upstream signature probe built for sm_90a on every
supported release, and a build that fails names the kernel (or the upstream helper)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
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
    c_plan.write_text(c_plan.read_text().replace("RuntimeCheck(counter == num_q_tokens);",
                                                 "RuntimeCheck(counter == num_q_tokens)", 1))
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


# ---------------------------------------------------------------------------- one build per distinct unit
# ci/compile_kernels.py with tests/fake_nvcc.py as nvcc (any machine): on the four real release trees, a unit
# is compiled once per distinct preprocessed source, a unit left out carries that build's result, and a
# failing build fails every release whose unit it stands for.
needs_tvm_ffi = pytest.mark.skipif(importlib.util.find_spec("tvm_ffi") is None, reason="tvm_ffi not installed")


def _fake_run(tmp_path: Path, *args: str, fail: str = "") -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """compile_kernels.py --all-releases --json --keep tmp_path/keep ARGS with the fake nvcc, and the calls
    (compile and link) it saw."""
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "nvcc").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{REPO}/tests/fake_nvcc.py" "$@"\n')
    (home / "bin" / "nvcc").chmod(0o755)
    log = tmp_path / "calls.jsonl"
    env = {**os.environ, "CUDA_HOME": str(home), "FAKE_NVCC_LOG": str(log), "FAKE_NVCC_FAIL": fail}
    proc = subprocess.run([sys.executable, str(REPO / "ci/compile_kernels.py"), "--all-releases", "--json",
                           "--keep", str(tmp_path / "keep"), *args], capture_output=True, text=True, env=env)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc, calls


def _unit_text(keep: Path, rev: str, name: str) -> str:
    """What the fake preprocessed for a unit, host and device, without line markers and folders."""
    d = keep / "build" / rev / name
    texts = [re.sub(r'^# \d+ ".*\n', "", p.read_text(), flags=re.M) for p in sorted(d.glob("preprocessed-*.ii"))]
    assert len(texts) == 2, d
    return "\0".join(texts).replace(str(keep / "trees" / rev), "<tree>").replace(str(d), "<unit>")


@needs_tvm_ffi
def test_a_unit_is_compiled_once_per_distinct_preprocessed_source(tmp_path: Path, sglang_release_repo: Path):
    proc, calls = _fake_run(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    compiled = [c for c in calls if "-c" in c]
    assert report["units"] == len(RELEASES) * len(ck.ROWS) and report["builds"] == len(compiled)
    assert 0 < report["builds"] < report["units"]  # the real releases share some units (0.5.21 and 0.5.22 do)
    keep = tmp_path / "keep"
    for row in ck.ROWS:
        rows = {tag: next(k for k in rel["kernels"] if k["name"] == row.name)
                for tag, rel in report["releases"].items()}
        assert all(k["ok"] for k in rows.values()), row.name
        text = {tag: _unit_text(keep, tag, row.name) for tag in rows}
        built = [tag for tag, k in rows.items() if "same_as" not in k]
        assert len(set(text[t] for t in built)) == len(built), row.name  # no two builds of one source
        for tag, k in rows.items():
            if "same_as" in k:  # left out: the same source as a release that was built
                assert k["same_as"] in built and text[tag] == text[k["same_as"]], (row.name, tag)
    assert sum(f"/build/{tag}/" in " ".join(c) for c in compiled for tag in RELEASES) == len(compiled)


@needs_tvm_ffi
def test_a_failed_build_fails_every_release_it_stands_for(tmp_path: Path, sglang_release_repo: Path):
    proc, calls = _fake_run(tmp_path, fail="/trees/v0.5.21/")
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    stood_for = 0
    for tag, rel in report["releases"].items():
        for k in rel["kernels"]:
            built_on = k.get("same_as", tag)  # the release whose build answers for this unit
            assert k["ok"] == (built_on != "v0.5.21"), (tag, k["name"])
            if not k["ok"]:
                named = "upstream signature probe" if k["name"] == ck.PROBE.name else f"{k['name']} ({k['cuh']})"
                assert f"FAILED: {named} on {tag}" in proc.stderr
            if tag != built_on == "v0.5.21":
                stood_for += 1
                assert "same preprocessed source and flags as v0.5.21's build" in k["log"]
    assert stood_for and not report["ok"]


@needs_tvm_ffi
def test_build_every_unit_compiles_each(tmp_path: Path, sglang_release_repo: Path):
    proc, calls = _fake_run(tmp_path, "--build-every-unit", "--only", "compress_plan", "--only", ck.PROBE.name)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["builds"] == report["units"] == 2 * len(RELEASES) == len([c for c in calls if "-c" in c])


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
    # the CI log says what was built, per release (a unit left out had the same preprocessed source as a build)
    print("\n".join(f"{tag}: {len(rel['kernels'])} units ok (incl. signature probe), "
                    f"{sum('same_as' not in k for k in rel['kernels'])} compiled, key {rel['key']}"
                    for tag, rel in report["releases"].items()))
    print(f"{report['builds']} builds for {report['units']} units, {report['wall_s']} s wall")
