"""``smoke upstream``: upstream's own kernel tests, patched vs unpatched.

No upstream test is vendored here: the test files below are written here and placed in a
``test/registered/kernels/`` folder of a real checkout that ``c128patch apply`` made from the
release history (the release wheels carry no tests). They import real sglang modules of each
release through the kernel tier's harness and our stand-ins; the device probe is replaced with
an H200's answers where a run (not --list) is needed, so the real passes run here on the CPU.
"""

from __future__ import annotations

import importlib.util
import json
import textwrap
import unittest
from pathlib import Path

import pytest

from c128patch.errors import C128Error
from c128patch.smoke import device as smoke_device
from c128patch.smoke import upstream_select as sel
from c128patch.smoke import upstream_standins
from c128patch.smoke import upstream_suite as us
from smoke_helpers import H200, one_line_error
from support import RELEASES, REPO_ROOT, invoke, needs_torch

KERNELS = "test/registered/kernels/ops/attention"

# Ours, written for these tests: each file shows one way upstream's tests meet a tree.
TEST_FILES = {
    # reaches compress (loads the c128/c_plan kernels the series patches) through the dsv4 package
    "test_c128patch_package.py": """
        from sglang.kernels.ops.attention.dsv4 import CompressorPrefillPlan, compress_forward
        from sglang.test.ci.ci_register import register_cuda_ci  # noqa: F401

        def test_package_exports_the_compress_entry_points():
            assert callable(compress_forward) and hasattr(CompressorPrefillPlan, "generate")
    """,
    # reaches the same only through upstream's test helper
    "test_c128patch_helper.py": """
        from sglang.test.kernels.deepseek_v4.common import make_paged_context

        def test_helper_imports():
            assert callable(make_paged_context)
    """,
    # the overlay module exists on the patched tree only; a newer API exists on neither
    "test_c128patch_overlay.py": """
        import importlib.util

        import pytest

        def test_overlay_module_present():
            import sglang.kernels.ops.attention.dsv4.online_c128_dspark  # noqa: F401

        def test_overlay_module_absent():
            assert importlib.util.find_spec("sglang.kernels.ops.attention.dsv4.online_c128_dspark") is None

        def test_newer_api():
            from sglang.kernels.ops.attention.dsv4 import CompressorPrefillPlan
            CompressorPrefillPlan.generate_online_mtp

        def test_needs_cuda():
            pytest.skip("needs CUDA")
    """,
    # our stand-ins for sglang.srt.utils / sglang.test.test_utils / sglang.srt.platforms
    "test_c128patch_standins.py": """
        from sglang.kernels.ops.attention.dsv4 import compress_forward
        from sglang.srt.platforms import current_platform
        from sglang.srt.utils import get_device
        from sglang.test.test_utils import CustomTestCase

        class TestOnStandIns(CustomTestCase):
            def test_custom_test_case_runs(self):
                self.assertTrue(callable(compress_forward) and callable(current_platform.synchronize))

        def test_get_device_needs_cuda():
            get_device()
    """,
    # written for a newer upstream package layout: cannot be collected on either tree
    "test_c128patch_newer_layout.py": """
        from sglang.kernels.ops.attention.dsv4 import compress_forward  # noqa: F401
        from sglang.jit_kernel.dsv4 import CompressorPrefillPlan  # noqa: F401

        def test_never_collected():
            pass
    """,
    # touches nothing the series touches
    "test_c128patch_unrelated.py": """
        from sglang.kernels.jit.utils import cache_once

        def test_unrelated_helper():
            assert callable(cache_once)
    """,
}
OUT_OF_SCOPE = "test/srt/test_c128patch_not_a_kernel_test.py"


@pytest.fixture(autouse=True)
def _quick_child_pytest(monkeypatch):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def apply_checkout(dest: Path, tag: str, files: dict[str, str] = TEST_FILES) -> Path:
    """A real checkout of release ``tag`` with the series applied (as a user makes one), plus our
    test files (``files``) under its test/ folder."""
    res = invoke("apply", "--sglang-rev", tag, "--tree", dest, as_json=False)
    assert res.code == 0, res.err
    for name, text in files.items():
        path = dest / KERNELS / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    (dest / OUT_OF_SCOPE).parent.mkdir(parents=True, exist_ok=True)
    (dest / OUT_OF_SCOPE).write_text(textwrap.dedent(TEST_FILES["test_c128patch_package.py"]))
    return dest


def smoke(args: list[str], monkeypatch: pytest.MonkeyPatch | None = None):
    if monkeypatch is not None:
        monkeypatch.setattr(smoke_device, "probe_device", lambda python: dict(H200))
    return invoke("smoke", "upstream", *args, as_json=False)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return apply_checkout(tmp_path_factory.mktemp("us") / "sglang", "v0.5.23")


@pytest.fixture(scope="module")
def run_report(checkout: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One real run (both trees, real pytest passes) on this CPU machine; the probe says H200."""
    mp = pytest.MonkeyPatch()
    try:
        mp.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
        out = tmp_path_factory.mktemp("run")
        res = smoke(["--tree", str(checkout), "--out", str(out), "--json"], mp)
    finally:
        mp.undo()
    report = json.loads(res.text)
    report["_exit"] = res.code
    report["_out"] = str(out)
    return report


def rows(report: dict) -> dict[str, dict]:
    return {r["id"].removeprefix("registered/kernels/ops/attention/"): r for r in report["tests"]}


# --------------------------------------------------------------------------- selection


def test_selection_takes_the_tests_that_reach_what_the_series_touches(run_report):
    chosen = {s["file"].rsplit("/", 1)[1]: s["why"] for s in run_report["selection"]["selected"]}
    assert set(chosen) == set(TEST_FILES) - {"test_c128patch_unrelated.py"}
    assert any("sglang.kernels.ops.attention.dsv4.compress: loads deepseek_v4/c128_online_v2.cuh, "
               "deepseek_v4/c_plan.cuh "
               "(the series patches" in w for w in chosen["test_c128patch_package.py"]), chosen
    assert any("through sglang.test.kernels.deepseek_v4.common" in w for w in chosen["test_c128patch_helper.py"])
    assert any(w.startswith("sglang.kernels.ops.attention.dsv4.online_c128_dspark: the series adds it")
               for w in chosen["test_c128patch_overlay.py"])


def test_selection_reads_only_upstreams_kernel_tests(run_report):
    assert run_report["selection"]["scope"].endswith("test/registered/kernels")
    assert run_report["selection"]["scanned"] == len(TEST_FILES)  # test/srt/... is not scanned


@needs_torch
def test_keyword_adds_files_whose_names_match(checkout, tmp_path):
    res = smoke(["--tree", str(checkout), "--list", "-k", "unrelated_helper", "--json",
                 "--out", str(tmp_path)])
    report = json.loads(res.text)
    files = [s["file"].rsplit("/", 1)[1] for s in report["selection"]["selected"]]
    assert "test_c128patch_unrelated.py" in files
    collected = [r["id"] for r in report["tests"] if r["patched"] == "not run"]
    assert collected == [f"registered/kernels/ops/attention/test_c128patch_unrelated.py::test_unrelated_helper"]


def test_keyword_words_leave_out_negated_ones():
    assert sel.keyword_words("c128 and not spec or (plan and not mtp)") == ["c128", "plan"]


# --------------------------------------------------------------------------- verdicts (real passes)


@needs_torch
def test_a_test_passing_on_both_trees_is_same(run_report):
    r = rows(run_report)["test_c128patch_package.py::test_package_exports_the_compress_entry_points"]
    assert (r["patched"], r["upstream"], r["verdict"]) == ("passed", "passed", "same")


@needs_torch
def test_a_test_passing_only_upstream_is_a_regression_and_fails_the_run(run_report):
    r = rows(run_report)["test_c128patch_overlay.py::test_overlay_module_absent"]
    assert (r["patched"], r["upstream"], r["verdict"]) == ("failed", "passed", "regressed")
    assert run_report["_exit"] == 1 and not run_report["ok"]
    assert any("1 upstream test(s) pass on the unpatched tree and not on the patched one: "
               "registered/kernels/ops/attention/test_c128patch_overlay.py::test_overlay_module_absent" in p
               for p in run_report["problems"]), run_report["problems"]


@needs_torch
def test_a_test_passing_only_patched_is_fixed(run_report):
    r = rows(run_report)["test_c128patch_overlay.py::test_overlay_module_present"]
    assert (r["patched"], r["upstream"], r["verdict"]) == ("passed", "failed", "fixed")
    assert "No module named 'sglang.kernels.ops.attention.dsv4.online_c128_dspark'" in r["upstream_message"]


@needs_torch
def test_a_newer_api_fails_on_both_trees_as_a_note_with_the_message(run_report):
    r = rows(run_report)["test_c128patch_overlay.py::test_newer_api"]
    assert r["verdict"] == "both fail"
    assert "has no attribute 'generate_online_mtp'" in r["patched_message"]
    assert any(n.startswith("both fail (") and "generate_online_mtp" in n for n in run_report["notes"])
    assert not any("generate_online_mtp" in p for p in run_report["problems"])


@needs_torch
def test_a_skip_on_both_trees_is_both_skipped_with_the_reason(run_report):
    r = rows(run_report)["test_c128patch_overlay.py::test_needs_cuda"]
    assert r["verdict"] == "both skipped"
    assert "both skipped (1): needs CUDA" in run_report["notes"]


@needs_torch
def test_a_file_neither_tree_can_import_is_not_applicable_with_the_import_error(run_report):
    r = rows(run_report)["test_c128patch_newer_layout.py"]
    assert (r["patched"], r["upstream"], r["verdict"]) == ("error", "error", "not applicable")
    assert r["reason"] == "this tree has no module sglang.jit_kernel"
    assert ("registered/kernels/ops/attention/test_c128patch_newer_layout.py: not applicable to this tree: "
            "this tree has no module sglang.jit_kernel") in run_report["notes"]


@needs_torch
def test_result_file_carries_ids_verdicts_counts_command_and_device(run_report):
    result = json.loads((Path(run_report["_out"]) / us.RESULT).read_text())
    assert (result["schema"], result["kind"], result["column"]) == (1, "upstream-suite", "upstream's own tests")
    assert result["rev"] == "v0.5.23" and result["upstream_commit"] == run_report["provenance"]["upstream"]["commit"]
    assert result["counts"] == run_report["counts"] and result["counts"]["regressed"] == 1
    assert result["command"].startswith("c128patch smoke upstream --tree ")
    assert result["device"].startswith("NVIDIA H200") and "(sm_90)" in result["device"]
    ids = {t["id"]: t["verdict"] for t in result["tests"]}
    assert ids["registered/kernels/ops/attention/test_c128patch_overlay.py::test_overlay_module_present"] == "fixed"
    assert {f["file"] for f in result["files"]} == {s["file"] for s in run_report["selection"]["selected"]}


def test_the_tests_commit_is_recorded_only_where_they_are_that_checkouts_tracked_files(tmp_path):
    import subprocess

    tests = tmp_path / "repo" / "test"
    (tests / "registered/kernels").mkdir(parents=True)
    (tests / "registered/kernels/test_x.py").write_text("def test_x():\n    pass\n")
    git = ["git", "-C", str(tmp_path / "repo"), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "repo/README").write_text("x\n")
    subprocess.run([*git, "add", "README"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    assert "git_commit" not in us.sources_of(tests)  # untracked (as copied next to a repository)
    subprocess.run([*git, "add", "test"], check=True)
    subprocess.run([*git, "commit", "-qm", "tests"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert us.sources_of(tests)["git_commit"] == head


# --------------------------------------------------------------------------- stand-ins


@needs_torch
def test_standins_are_ours_and_listed_per_tree(run_report):
    for label in ("patched", "upstream"):
        used = {r["module"]: r["used"] for r in run_report["trees"][label]["standins"] if r["used"]}
        assert used["sglang.srt.utils"] == ["get_device", "is_gfx95_supported", "is_hip", "is_xpu"]
        assert used["sglang.test.test_utils"] == ["CustomTestCase"]
        assert used["sglang.srt.platforms"] == ["current_platform"]
    r = rows(run_report)["test_c128patch_standins.py::TestOnStandIns::test_custom_test_case_runs"]
    assert r["verdict"] == "same" and r["patched"] == "passed"


def test_the_packages_whose_init_the_tests_need_run_for_real(run_report):
    assert "sglang.kernels.ops.attention.dsv4" in run_report["trees"]["upstream"]["real_packages"]


@needs_torch
def test_get_device_standin_refuses_without_a_gpu(run_report):
    r = rows(run_report)["test_c128patch_standins.py::test_get_device_needs_cuda"]
    assert r["verdict"] == "both fail"
    assert "c128patch stand-in get_device: torch sees no CUDA GPU" in r["patched_message"]


def test_a_standin_offers_only_names_the_trees_module_defines(checkout, tmp_path):
    tree = tmp_path / "tree"
    (tree / "sglang/srt/utils").mkdir(parents=True)
    real = checkout / "python/sglang/srt/utils"
    (tree / "sglang/srt/utils/__init__.py").write_text((real / "__init__.py").read_text())
    # the real common.py of 0.5.23 without its get_device: a tree that predates it
    text = (real / "common.py").read_text()
    start = text.index("@lru_cache(maxsize=8)\ndef get_device(")
    end = text.index("\ndef ", start + 30)
    (tree / "sglang/srt/utils/common.py").write_text(text[:start] + text[end:])
    pool = {"sglang.srt.utils": {"get_device", "is_hip"}, "sglang.srt.platforms": {"current_platform"}}
    uses = {"sglang.srt.utils": {"get_device": ["t.py:1"], "brand_new": ["t.py:2"]}}
    wanted, rows_ = sel.standin_plan(tree, pool, uses)
    by = {r["module"]: r for r in rows_}
    assert wanted == {"sglang.srt.utils": ["is_hip"]}  # no platforms module in this tree: no stand-in
    assert by["sglang.srt.utils"]["withheld"] == ["get_device"]
    assert by["sglang.srt.utils"]["reason"] == "this tree's sglang.srt.utils does not define get_device"
    assert by["sglang.srt.platforms"]["reason"] == "this tree has no such module"
    assert "no_standin" not in by["sglang.srt.utils"]  # brand_new: the real module lacks it too


def test_a_name_no_standin_has_is_a_problem_naming_where_to_add_it(checkout):
    uses = {"sglang.srt.utils": {"brand_new_helper": ["registered/x.py:3"]}}
    _, rows_ = sel.standin_plan(checkout / "python", {"sglang.srt.utils": {"is_hip"}}, uses)
    assert rows_[0]["used"] == ["brand_new_helper"] and "no_standin" not in rows_[0]  # not in the real module
    defined = sel.defined_names(checkout / "python", "sglang.srt.utils")
    assert "get_device" in defined and "is_port_available" in defined  # star import and own names
    _, rows_ = sel.standin_plan(checkout / "python", {"sglang.srt.utils": {"is_hip"}},
                                {"sglang.srt.utils": {"get_device": ["registered/x.py:3"]}})
    assert rows_[0]["no_standin"] == {"get_device": ["registered/x.py:3"]}


def test_custom_test_case_standin_runs_teardown_when_setup_raises():
    calls = []

    class Case(upstream_standins.CustomTestCase):
        @classmethod
        def setUpClass(cls):
            raise RuntimeError("setup broke")

        @classmethod
        def tearDownClass(cls):
            calls.append("teardown")

        def test_x(self):
            pass

    result = unittest.TestResult()
    unittest.defaultTestLoader.loadTestsFromTestCase(Case).run(result)
    assert calls == ["teardown"] and "setup broke" in result.errors[0][1]


def test_current_platform_standin_fails_loudly_on_anything_else():
    with pytest.raises(AttributeError, match="stand-in current_platform has no 'device_name'"):
        upstream_standins.EXTRA["sglang.srt.platforms"]["current_platform"].device_name


@pytest.mark.parametrize("message, kind, reason", [
    ("E   ModuleNotFoundError: No module named 'triton'", "environment", "the environment lacks triton"),
    ("E   ModuleNotFoundError: No module named 'sglang.jit_kernel'", "tree",
     "this tree has no module sglang.jit_kernel"),
    ("ImportError: cannot import name 'X' from 'sglang.kernels.ops.attention.dsv4' (/t/__init__.py)", "tree",
     "sglang.kernels.ops.attention.dsv4 has no X"),
    ("ImportError: c128patch harness: the stand-in for sglang.srt.utils has no 'get_device': upstream now", "tree",
     "this tree's sglang.srt.utils does not define get_device"),
    ("ImportError: c128patch harness: the stand-in for sglang.srt.utils has no 'fresh': upstream now", "stand-in",
     "the c128patch stand-in for sglang.srt.utils lacks 'fresh'"),
])
def test_collection_errors_are_told_apart(message, kind, reason):
    rows_ = [{"module": "sglang.srt.utils", "withheld": ["get_device"]}]
    assert us.classify(message, rows_) == (kind, reason)


@pytest.mark.parametrize("patched, upstream, nodeid, collect_only, want", [
    ("passed", "passed", "f.py::t", False, "same"),
    ("failed", "passed", "f.py::t", False, "regressed"),
    ("skipped", "passed", "f.py::t", False, "regressed"),
    ("absent", "passed", "f.py::t", False, "regressed"),
    ("passed", "crashed", "f.py::t", False, "fixed"),
    ("failed", "error", "f.py::t", False, "both fail"),
    ("skipped", "skipped", "f.py::t", False, "both skipped"),
    ("error", "error", "f.py", False, "not applicable"),
    ("error", "absent", "f.py", False, "regressed"),
    ("not run", "not run", "f.py::t", True, "same"),
    ("absent", "not run", "f.py::t", True, "regressed"),
    ("not run", "not run", "f.py::t", False, "not run"),
    ("skipped", "failed", "f.py::t", False, "differs"),
])
def test_verdicts(patched, upstream, nodeid, collect_only, want):
    assert us.verdict(patched, upstream, nodeid, collect_only) == want


# --------------------------------------------------------------------------- staging


@needs_torch
def test_staging_carries_what_the_tests_import_and_selects_the_same(checkout, run_report, tmp_path):
    res = smoke(["--tree", str(checkout), "--stage", str(tmp_path / "st"), "--json"])
    assert res.code == 0, res.err
    staged = json.loads(res.text)["staged"]
    assert staged["patched"]["bytes"] < 8e6 and staged[us.STAGED_TESTS]["files"] == len(TEST_FILES) - 1
    for label in ("patched", "upstream"):
        root = tmp_path / "st" / label / "sglang"
        for rel in ("kernels/ops/attention/dsv4/attn.py", "kernels/ops/attention/dsv4/topk.py",
                    "test/kernels/deepseek_v4/common.py", "test/ci/ci_register.py", "c128patch_provenance.json"):
            assert (root / rel).is_file() == (label == "patched" or rel != "c128patch_provenance.json"), (label, rel)
        assert (root / "kernels/jit/csrc/deepseek_v4/c4_v2.cuh").is_file()
    assert (tmp_path / "st/patched/sglang/kernels/ops/attention/dsv4/online_c128_dspark.py").is_file()
    assert not (tmp_path / "st/upstream/sglang/kernels/ops/attention/dsv4/online_c128_dspark.py").exists()
    # the staged trees and tests select what the checkout selected, and collect on both
    res = smoke(["--tree", str(tmp_path / "st/patched"), "--upstream-tree", str(tmp_path / "st/upstream"),
                 "--tests", str(tmp_path / "st" / us.STAGED_TESTS), "--list", "--json",
                 "--out", str(tmp_path / "list")])
    listed = json.loads(res.text)
    assert ([s["file"] for s in listed["selection"]["selected"]]
            == [s["file"] for s in run_report["selection"]["selected"]])
    counts = listed["counts"]
    assert (counts["regressed"], counts["same"], counts["not applicable"]) == (0, 8, 1), counts


# --------------------------------------------------------------------------- torch custom ops (0.5.20-0.5.22)

# These releases' dsv4 package imports fp8_wo_a, whose @register_custom_op (upstream's
# srt/utils/custom_op.py) registers a torch op at import through
# sglang.srt.utils.common.direct_register_custom_op: a stand-in of ours.
CUSTOM_OP_RELEASES = ("v0.5.20", "v0.5.21", "v0.5.22")
CUSTOM_OP_TEST = {"test_c128patch_custom_op.py": """
    import pytest
    import torch
    from sglang.kernels.ops.attention.dsv4.fp8_wo_a import fp8_wo_a_group_major_quant_ue8m0

    OP = torch.ops.sglang.fp8_wo_a_group_major_quant_ue8m0

    def test_the_op_has_the_schema_torch_infers_from_upstreams_function():
        assert str(OP.default._schema) == ("sglang::fp8_wo_a_group_major_quant_ue8m0(Tensor input, "
                                           "Tensor(a1!) output_q, Tensor(a2!) output_s) -> ()")

    def test_the_fake_kernel_answers_meta_tensors():
        x = torch.empty(2, 4, 512, dtype=torch.bfloat16, device="meta")
        q = torch.empty(2, 4, 512, dtype=torch.float8_e4m3fn, device="meta")
        assert fp8_wo_a_group_major_quant_ue8m0(x, q, torch.empty(2, 4, 1, dtype=torch.int32, device="meta")) is None

    def test_a_cpu_tensor_has_no_kernel():
        x = torch.zeros(2, 4, 512, dtype=torch.bfloat16)
        q = torch.empty(2, 4, 512, dtype=torch.float8_e4m3fn)
        with pytest.raises(NotImplementedError, match="'CPU' backend"):
            OP(x, q, torch.empty(2, 4, 1, dtype=torch.int32))
"""}
OP_IDS = [f"test_c128patch_custom_op.py::{t}" for t in (
    "test_the_op_has_the_schema_torch_infers_from_upstreams_function",
    "test_the_fake_kernel_answers_meta_tensors", "test_a_cpu_tensor_has_no_kernel")]


@pytest.fixture(scope="module", params=CUSTOM_OP_RELEASES)
def custom_op_report(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One real run per release (both trees; the probe says H200) of the test file above."""
    tree = apply_checkout(tmp_path_factory.mktemp("op") / "sglang", request.param, CUSTOM_OP_TEST)
    out = tmp_path_factory.mktemp("op-run")
    mp = pytest.MonkeyPatch()
    try:
        mp.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
        res = smoke(["--tree", str(tree), "--out", str(out), "--json"], mp)
    finally:
        mp.undo()
    report = json.loads(res.text)
    report["_exit"], report["_out"], report["_tag"] = res.code, str(out), request.param
    return report


@needs_torch
def test_fp8_wo_a_registers_its_op_at_import_through_our_direct_register_custom_op(custom_op_report):
    r = rows(custom_op_report)
    assert custom_op_report["provenance"]["upstream"]["rev"] == custom_op_report["_tag"]
    assert [(r[i]["patched"], r[i]["upstream"], r[i]["verdict"]) for i in OP_IDS] == [("passed", "passed", "same")] * 3
    assert custom_op_report["_exit"] == 0 and custom_op_report["ok"], custom_op_report["problems"]


def test_direct_register_custom_op_is_listed_as_a_standin_taken_inside_a_function(custom_op_report):
    result = json.loads((Path(custom_op_report["_out"]) / us.RESULT).read_text())
    for label in ("patched", "upstream"):
        row = {r["module"]: r for r in custom_op_report["trees"][label]["standins"]}["sglang.srt.utils.common"]
        assert "direct_register_custom_op" in row["offered"] and "direct_register_custom_op" in row["used_in_functions"]
        listed = {r["module"]: r for r in result["standins"][label]}["sglang.srt.utils.common"]
        assert "direct_register_custom_op" in listed["used_in_functions"]


@pytest.mark.parametrize("tag", CUSTOM_OP_RELEASES)
def test_a_test_file_importing_the_dsv4_package_collects_on_both_trees(tag, tmp_path):
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed: this release's dsv4 package imports it (attn.py)")
    files = {"test_c128patch_package.py": TEST_FILES["test_c128patch_package.py"]}
    tree = apply_checkout(tmp_path / "sglang", tag, files)
    res = smoke(["--tree", str(tree), "--list", "--json", "--out", str(tmp_path / "out")])
    report = json.loads(res.text)
    r = rows(report)["test_c128patch_package.py::test_package_exports_the_compress_entry_points"]
    assert (r["patched"], r["upstream"], r["verdict"]) == ("not run", "not run", "same")  # collected on both
    assert "sglang.kernels.ops.attention.dsv4" in report["trees"]["patched"]["real_packages"]
    assert res.code == 0 and report["ok"], report["problems"]


@needs_torch
def test_direct_register_custom_op_is_idempotent_for_one_function_and_refuses_another():
    import torch

    def op_a(x, out):
        out.copy_(x)

    def op_b(x, out):
        out.copy_(x)

    for op in (op_a, op_b):  # real annotations (this module's are strings, and torch is imported here)
        op.__annotations__ = {"x": torch.Tensor, "out": torch.Tensor, "return": None}
    register = upstream_standins.direct_register_custom_op
    register(op_name="c128patch_test_copy", op_func=op_a, mutates_args=["out"])
    register(op_name="c128patch_test_copy", op_func=op_a, mutates_args=["out"])
    assert str(torch.ops.sglang.c128patch_test_copy.default._schema) == (
        "sglang::c128patch_test_copy(Tensor x, Tensor(a1!) out) -> ()")
    with pytest.raises(RuntimeError, match="sglang::c128patch_test_copy is already registered for .*op_a, not .*op_b"):
        register(op_name="c128patch_test_copy", op_func=op_b, mutates_args=["out"])


# --------------------------------------------------------------------------- every release, bad input


@needs_torch
@pytest.mark.parametrize("tag", RELEASES)
def test_every_release_collects_upstreams_tests_on_both_trees(tag, tmp_path):
    tree = apply_checkout(tmp_path / "sglang", tag)
    res = smoke(["--tree", str(tree), "--list", "--json", "--out", str(tmp_path / "out")])
    report = json.loads(res.text)
    r = rows(report)
    assert report["provenance"]["upstream"]["rev"] == tag
    assert res.code == 0 and report["ok"], report["problems"]  # the stand-ins cover every release
    assert r["test_c128patch_overlay.py::test_overlay_module_present"]["verdict"] == "same"
    package = r.get("test_c128patch_package.py::test_package_exports_the_compress_entry_points")
    if package is None:
        # this release's dsv4 package imports triton at the top (attn.py); triton is a GPU-only
        # dependency that this CPU machine lacks: said so, as a note of a --list run
        assert importlib.util.find_spec("triton") is None
        file_row = r["test_c128patch_package.py"]
        assert (file_row["verdict"], file_row["reason"]) == ("not applicable", "the environment lacks triton")
        assert ("registered/kernels/ops/attention/test_c128patch_package.py: not applicable to this environment: "
                "the environment lacks triton") in report["notes"]
    else:
        assert package["verdict"] == "same"
        assert r["test_c128patch_newer_layout.py"]["reason"] == "this tree has no module sglang.jit_kernel"


MEETING_TEST = {"test_c128patch_meeting.py": """
    import hashlib
    import os
    import time
    from pathlib import Path

    from sglang.kernels.ops.attention.dsv4 import compress  # noqa: F401  (reaches what the series patches)

    def test_both_trees_run_at_the_same_time():
        meeting = Path(os.environ["C128PATCH_TEST_MEETING"])
        (meeting / hashlib.sha256(os.environ["C128PATCH_TREE"].encode()).hexdigest()).touch()
        deadline = time.monotonic() + 60
        while len(list(meeting.iterdir())) < 2:
            assert time.monotonic() < deadline, "the other tree's pass did not run meanwhile"
            time.sleep(0.1)
"""}


@needs_torch
def test_parallel_trees_runs_the_patched_and_the_unpatched_pass_at_the_same_time(tmp_path, monkeypatch):
    tree = apply_checkout(tmp_path / "sglang", "v0.5.23", MEETING_TEST)
    (tmp_path / "meeting").mkdir()
    monkeypatch.setenv("C128PATCH_TEST_MEETING", str(tmp_path / "meeting"))
    res = smoke(["--tree", str(tree), "--parallel-trees", "--out", str(tmp_path / "out"), "--json"],
                monkeypatch)
    report = json.loads(res.text)
    r = rows(report)["test_c128patch_meeting.py::test_both_trees_run_at_the_same_time"]
    assert (r["patched"], r["upstream"], r["verdict"]) == ("passed", "passed", "same"), r
    assert len(list((tmp_path / "meeting").iterdir())) == 2
    assert res.code == 0 and report["ok"], report["problems"]


def test_parallel_trees_belongs_to_the_upstream_suite(checkout):
    one_line_error(invoke("smoke", "kernel", "--tree", str(checkout), "--parallel-trees", "--list", as_json=False),
                   "No such option '--parallel-trees'")


def test_a_release_history_checkout_has_no_tests_to_default_to(checkout, tmp_path):
    plain = tmp_path / "plain"
    res = invoke("apply", "--sglang-rev", "v0.5.23", "--tree", plain, as_json=False)
    assert res.code == 0, res.err
    one_line_error(smoke(["--tree", str(plain), "--list"]),
                   f"--tests: the tree's repository {plain.resolve()} has no test/ folder")


def test_a_folder_without_tests_is_refused(checkout, tmp_path):
    (tmp_path / "empty").mkdir()
    one_line_error(smoke(["--tree", str(checkout), "--tests", str(tmp_path / "empty"), "--list"]),
                   f"--tests: no test_*.py under {tmp_path / 'empty' / 'registered/kernels'}")


def test_upstream_suite_refuses_sanitizer(checkout):
    one_line_error(smoke(["--tree", str(checkout), "--sanitizer", "memcheck"]), "No such option '--sanitizer'")


def test_the_boot_plugin_and_standins_import_without_the_tool_deps():
    """They run inside the test process, which has neither rich nor click nor unidiff."""
    import subprocess
    import sys

    code = ("import sys; sys.modules.update({m: None for m in ('rich', 'click', 'unidiff', 'tomli_w', 'packaging')}); "
            "import c128patch.smoke.upstream_standins")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO_ROOT / "tooling"), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr


@needs_torch
def test_a_standin_package_keeps_the_trees_other_submodules(checkout, tmp_path):
    """0.5.20's dsv4 imports sglang.srt.utils.custom_op: it loads from the tree, while
    sglang.srt.utils.common stays our stand-in."""
    import subprocess
    import sys

    tree = checkout / "python"
    plan = {"standins": {"sglang.srt.utils": ["is_hip"], "sglang.srt.utils.common": ["is_cuda"]}, "real_packages": []}
    code = ("from c128patch.smoke import upstream_standins; upstream_standins.pytest_configure(None); "
            "import sglang.srt.utils as u, sglang.srt.utils.common as c, sglang.srt.utils.custom_op as op; "
            "print(u.__path__, c.__doc__.startswith('c128patch stand-in'), op.__file__)")
    env = {"PYTHONPATH": str(REPO_ROOT / "tooling"), "PATH": "/usr/bin:/bin", "C128PATCH_TREE": str(tree),
           "C128PATCH_HARNESS": str(REPO_ROOT / "tests/gpu/harness.py"), "C128PATCH_UPSTREAM_PLAN": json.dumps(plan),
           "SGLANG_JIT_CACHE_DIR": str(tmp_path / "jit")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [f"['{tree / 'sglang/srt/utils'}']", "True",
                                   str(tree / "sglang/srt/utils/custom_op.py")]


@pytest.mark.parametrize("source", ["x = " + "(" * 1000 + ")" * 1000 + "\n", "x = [" + "-" * 100_000 + "1]\n",
                                    "def (:\n"])
def test_an_upstream_file_that_does_not_parse_is_one_line_naming_it(source):
    # input: a file of the target tree nested past the parser's limits, or broken, is never a traceback
    with pytest.raises(C128Error, match=r"^x\.py: (does not parse|nested too deeply to parse)"):
        sel.parse_imports(source, "x.py", "sglang")


def test_smoke_says_it_runs_the_trees_code_unsealed_before_it_runs_any(checkout, tmp_path):
    """Helper 164: ``smoke upstream --list`` runs the tree's tests' conftest.py (pytest collects them) as the
    operator, outside the sealed box, and said nothing of it, where watch and treecheck say they run target code.
    Said as the first pass starts (a refusal before it stays one line)."""
    said = "smoke runs the tree's code as you, outside the sealed box"
    res = invoke("smoke", "upstream", "--tree", str(checkout), "--list", "--out", str(tmp_path / "out"),
                 as_json=False)
    assert res.err.count(said) == 1, res.err
    res = invoke("smoke", "kernel", "--tree", str(checkout), "--out", str(tmp_path / "k"), as_json=False)
    assert res.code == 2 and said not in res.err, res.err  # refused before any of its code ran: not said


def test_smoke_json_says_it_runs_the_trees_code_unsealed_on_stderr_and_in_the_document(checkout, tmp_path):
    """Helper 169: with --json, smoke said nothing of running the tree's code unsealed (its progress is quiet there),
    where watch and treecheck say theirs on stderr with --json too (issue 36, rule 3: "and says so")."""
    from c128patch.smoke.kernel import UNSEALED

    res = invoke("smoke", "upstream", "--tree", str(checkout), "--list", "--out", str(tmp_path / "out"))
    assert res.err.count(UNSEALED) == 1, res.err
    assert json.loads(res.text)["runs_target_code"] == UNSEALED


@pytest.mark.parametrize("text", [f'{{"n": {"9" * 5000}}}', "[" * 10000 + "]" * 10000, "\udcff"])
def test_a_sources_json_past_pythons_digit_limit_deep_or_not_utf8_is_unreadable_not_a_traceback(tmp_path, text):
    """Helper 173: SOURCES.json was read catching only JSONDecodeError: a 5000-digit integer, a 10000-deep array
    or bytes that are not UTF-8 ended the run in a traceback. Now it is said unreadable, as invalid JSON is."""
    (tmp_path / us.SOURCES).write_bytes(text.encode(errors="surrogateescape"))
    assert set(us.sources_of(tmp_path)["sources"]) == {"unreadable"}


def test_a_csrc_literal_whose_first_part_is_dot_or_dotdot_names_no_csrc_folder(tmp_path: Path):
    """An upstream string "../x.cuh" named the csrc folder "..": the staged subset widened to sglang/kernels/jit."""
    root = tmp_path / "python"
    for rel, text in {"sglang/__init__.py": "", "sglang/srt/__init__.py": "", "sglang/srt/environ.py": "",
                      "sglang/kernels/__init__.py": "",
                      "sglang/kernels/k.py": 'A = "../x.cuh"\nB = "./y.cuh"\nC = "deepseek_v4/c128_v2.cuh"\n'}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (tmp_path / "test_k.py").write_text("from sglang.kernels.k import A\n")
    out = sel.closure(sel.ModuleIndex(root), [sel.TestFile.read(tmp_path / "test_k.py", tmp_path)], set())
    assert out.csrc_dirs == {"deepseek_v4"}
