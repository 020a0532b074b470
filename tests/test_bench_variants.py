"""ci/bench/kernel_variants.py: the bench-only variants still derive from the shipped header
(each edit finds its text), renamed copies share no symbol with it, and they compile for sm_90a."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "ci"), str(REPO / "ci" / "bench")]

import compile_kernels as ck  # noqa: E402
import kernel_variants as kv  # noqa: E402

HEADER = (REPO / "csrc" / "deepseek_v4" / "online_c128_dspark.cuh").read_text()


def test_variants_edit_what_they_say():
    variants = kv.derived_variants(HEADER)
    assert kv.WAIT in HEADER and kv.WAIT not in variants["postwait"]
    assert "return;\n  PDLWaitPrimary<kUsePDL>();\n\n  // Row metadata and ape" in variants["postwait"]
    assert kv.BANK_STORES in HEADER and "m.store(dst);" not in variants["nobanks"]
    assert variants["nobanks"].count("o.store(") == HEADER.count("o.store(")  # the emit stays


def test_a_header_without_the_text_is_refused():
    with pytest.raises(SystemExit, match="variant nobanks"):
        kv.derived_variants(HEADER.replace(kv.BANK_STORES, ""))


def test_renamed_copy_shares_no_symbol():
    text = kv.renamed(HEADER, "nobanks")
    assert not re.search(r"\bDsparkC128|\bdspark_c128_(plan|verify|commit)_kernel\b|namespace device::dspark_c128\b",
                         text)
    assert "DsparkNobanksC128Kernel" in text and "dspark_c128_nobanks_verify_kernel" in text


def test_variants_compile_for_sm90a(tmp_path: Path, release_trees):
    if not shutil.which("nvcc") or importlib.util.find_spec("tvm_ffi") is None:
        pytest.skip("nvcc / tvm_ffi not available")
    tree = release_trees["v0.5.23"]
    tc = ck.find_toolchain(tree, "90a")
    cuh = tmp_path / "online_c128_dspark_nobanks.cuh"
    cuh.write_text(kv.renamed(kv.derived_variants(HEADER)["nobanks"], "nobanks"))
    cls = "DsparkNobanksC128Kernel<{args}>"
    rows = [
        ck.Kernel("nobanks", str(cuh), (("verify_compress", f"{cls}::run_verify"), ("commit", f"{cls}::run_commit")),
                  ("512", "fp32_t", "true")),
        ck.Kernel("launch_floor", str(kv.HERE / "kernels" / "launch_floor.cuh"),
                  (("run", "LaunchFloorKernel<true>::run"),)),
    ]
    results, builds = ck.build_all([(tc, tree, k, tmp_path / "build" / k.name, "v0.5.23") for k in rows], jobs=2,
                                   dedupe=False)  # the two builds side by side
    assert builds == len(rows)
    for result in results:
        assert result.ok, result.log[-3000:]


def test_candidates_edit_what_they_say():
    cands = kv.derived_variants(HEADER) | kv.candidate_variants(HEADER)
    assert "kDsparkVerifyVec = 4;" in cands["vec4"] and "__ldcs(src + i)" not in cands["vec4"]
    assert "__ldcs(src + i)" in cands["cs"] and "__stcs(dst + i, tmp[u])" in cands["cs"]
    assert "kDsparkVerifyVec = 4;" in cands["vec4cs"] and "__stcs(dst + i, tmp[u])" in cands["vec4cs"]
