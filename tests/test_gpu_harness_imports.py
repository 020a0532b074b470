"""CPU checks of the GPU harness against the real releases: the tree subset is small and complete,
`install_sglang` makes the kernel op modules import (0.5.20-0.5.23), and a new upstream import
from a stand-in fails loudly. Needs torch, tvm_ffi and msgspec (not deps of the tool): skips
without them."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

GPU_DIR = Path(__file__).resolve().parent / "gpu"
sys.path.insert(0, str(GPU_DIR))

import harness  # noqa: E402
import tree_subset  # noqa: E402

RELEASES = ["v0.5.20", "v0.5.21", "v0.5.22", "v0.5.23"]


@pytest.fixture
def release_root(release_trees):
    return release_trees.__getitem__


def need_runtime_deps() -> None:
    for mod in ("torch", "tvm_ffi", "msgspec"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} not installed")


IMPORT_CHECK = """
import sys
import sglang.kernels.ops.attention.dsv4.compress as c
import sglang.kernels.ops.attention.dsv4.online_c128_mtp as m
import sglang.kernels.jit.utils.compile.paths as p
assert hasattr(c, "_jit_compress_128_online_module") and hasattr(c, "_jit_compress_plan_module")
assert str(p.KERNEL_PATH).startswith({tree!r}), p.KERNEL_PATH
heavy = [k for k in sys.modules if k.split(".")[0] in ("transformers", "fastapi", "IPython", "triton")]
assert not heavy, heavy
print("IMPORT-OK")
"""


@pytest.mark.parametrize("version", RELEASES)
def test_subset_small_and_complete(release_root, version: str, tmp_path: Path):
    files = tree_subset.copy_subset(release_root(version), tmp_path)
    names = {str(f) for f in files}
    for must in (
        "sglang/kernels/jit/csrc/deepseek_v4/c128_online_v2.cuh",
        "sglang/kernels/jit/csrc/deepseek_v4/c_plan.cuh",
        "sglang/kernels/jit/csrc/deepseek_v4/online_c128_mtp.cuh",
        "sglang/kernels/jit/include/sgl_kernel/deepseek_v4/compress_v2.cuh",
        "sglang/kernels/ops/attention/dsv4/compress.py",
        "sglang/kernels/jit/utils/compile/loader.py",
        "sglang/srt/environ.py",
        "sglang/__init__.py",
        "sglang/kernels/ops/attention/dsv4/__init__.py",
    ):
        assert must in names, must
    size = sum((tmp_path / f).stat().st_size for f in files)
    assert 40 <= len(files) <= 120 and size < 2_000_000, (len(files), size)


@pytest.mark.parametrize("version", RELEASES)
def test_standins_cover_release_imports(release_root, version: str):
    root = release_root(version)
    assert harness.missing_standin_names(root) == {}


@pytest.mark.parametrize("version", RELEASES)
def test_install_sglang_imports_kernel_modules(release_root, version: str, tmp_path: Path):
    need_runtime_deps()
    tree_subset.copy_subset(release_root(version), tmp_path)
    proc = harness.run_with_tree(tmp_path, IMPORT_CHECK.format(tree=str(tmp_path.resolve())))
    assert "IMPORT-OK" in proc.stdout, proc.stderr[-3000:]


def test_new_upstream_import_fails_loudly(release_root, tmp_path: Path):
    need_runtime_deps()
    tree_subset.copy_subset(release_root("v0.5.23"), tmp_path)
    compress = tmp_path / "sglang/kernels/ops/attention/dsv4/compress.py"
    text = compress.read_text()
    anchor = "from sglang.srt.utils import"
    compress.write_text(text.replace(anchor, "from sglang.srt.utils import brand_new_helper\n" + anchor, 1))
    assert harness.missing_standin_names(tmp_path) == {"sglang.srt.utils": {"brand_new_helper"}}
    proc = harness.run_with_tree(tmp_path, "import sglang.kernels.ops.attention.dsv4.compress")
    assert proc.returncode != 0
    assert "brand_new_helper" in proc.stderr and "STANDINS" in proc.stderr, proc.stderr[-2000:]


def test_install_twice_same_tree_ok_other_tree_raises(release_root, tmp_path: Path):
    need_runtime_deps()
    a, b = tmp_path / "a", tmp_path / "b"
    tree_subset.copy_subset(release_root("v0.5.23"), a)
    tree_subset.copy_subset(release_root("v0.5.23"), b)
    code = f"""
import pathlib, os, tempfile
harness.install_sglang(pathlib.Path({str(a)!r}))
# the run's temporary folder (a test run's own, removed at its end), not /tmp's
assert os.environ["SGLANG_JIT_CACHE_DIR"].startswith(tempfile.gettempdir() + "/c128patch-jit/"), tempfile.gettempdir()
assert tempfile.gettempdir() != "/tmp"  # the run's (tests/conftest.py)
try:
    harness.install_sglang(pathlib.Path({str(b)!r}))
except RuntimeError as e:
    print("RAISED", e)
"""
    proc = harness.run_with_tree(a, code)
    assert "RAISED" in proc.stdout, proc.stderr[-2000:]


def test_tree_subset_cli(release_root, tmp_path: Path):
    root = release_root("v0.5.23")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.gpu.tree_subset", str(root), str(tmp_path / "out")],
        cwd=GPU_DIR.parent.parent, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "files" in proc.stdout and (tmp_path / "out/sglang/srt/environ.py").is_file()


MTP = "sglang.kernels.ops.attention.dsv4.online_c128_mtp"


@pytest.mark.parametrize("version,has", [("v0.5.20", False), ("v0.5.21", False), ("v0.5.22", False), ("v0.5.23", True)])
def test_upstream_defines_reads_each_releases_module(release_root, version: str, has: bool):
    assert harness.upstream_defines(release_root(version), MTP, "online_c128_mtp_mark_pending") is has
    assert harness.upstream_defines(release_root(version), MTP, "_jit_online_c128_mtp_module")


def test_an_arm_needing_a_missing_upstream_api_skips_naming_the_release_and_the_name(
        real_series, sglang_release_repo: Path, tmp_path: Path):
    from c128patch.evidence.staging import patched_sources
    from c128patch.git import Git

    git = Git(git_dir=sglang_release_repo)
    tree = patched_sources(real_series, git, "v0.5.21", tmp_path / "v0.5.21")  # with its provenance record
    with pytest.raises(pytest.skip.Exception) as info:
        harness.skip_unless_upstream_defines(tree, MTP, "online_c128_mtp_mark_pending", "upstream MTP arm")
    assert str(info.value) == (f"upstream MTP arm: upstream v0.5.21 has no {MTP}.online_c128_mtp_mark_pending "
                               "(a later release added it)")
    harness.skip_unless_upstream_defines(patched_sources(real_series, git, "v0.5.23", tmp_path / "v0.5.23"), MTP,
                                         "online_c128_mtp_mark_pending", "arm")
