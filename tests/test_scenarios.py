"""The series' DSPARK scenarios as a tier (``fit.scenarios_runner``, issue 38 item 2), run by ``fit.treecheck`` in
its sealed box on a patched tree: each passes on the four releases, gates off and on (v0.5.23's: tests/test_env.py,
the same run through ``treecheck --sglang-rev``); an upstream commit made here
on the real v0.5.23 (``RaggedVerifyLayout.graph_num_tokens`` renamed: the field our commit hook reads) fails them,
naming the scenario, our module and the upstream definition; a scenario whose module did not import is `not run`,
and the tier unchecked, never clean."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import watch_upstream as wu
from c128patch.fit import env, treecheck
from c128patch.fit.contract import patched_tree
from c128patch.fit.resolve import PY_ROOT
from c128patch.git import Git
from c128patch.series.manifest import load_series
from support import RELEASES, REPO_ROOT, upstream_commit

SCENARIOS = ["backend-verify-metadata", "compressor-callback", "decode", "record-streams", "startup-rules",
             "verify-compact", "verify-static", "worker-commit"]
RAGGED = "python/sglang/srt/speculative/ragged_verify.py"
SERIES = load_series(REPO_ROOT)


@pytest.fixture(scope="module")
def tier_python() -> str:
    """The tier's interpreter: the v0.5.23 environment ``fit.env`` builds from its committed lock (cached; heavy; in
    the heavy tier, the one the recipe's test built and handed to the run's cache: support.share_environment)."""
    return str(env.build((REPO_ROOT / "patches/env/v0.5.23.lock").read_text(), env.cuda_only(SERIES))[0])


def scenarios(result: treecheck.TreecheckResult, gates: str) -> dict[str, dict]:
    return next(t.scenarios for t in result.tiers if t.gates == gates)


# v0.5.23's case is test_env.py's every_module_imports_in_its_own_environment: `treecheck --sglang-rev v0.5.23` there
# runs this same run_rev, in this same environment (built from v0.5.23's lock), and asserts all this of its JSON: a
# third identical tier run (~30 CPU-s) beside the recipe's (test_watch_ci.py) was the heavy tier's to spare
@pytest.mark.parametrize("tag", RELEASES[:-1])
def test_each_scenario_passes_on_the_release_patched(tag, tier_python, sglang_release_repo: Path) -> None:
    git = Git(git_dir=sglang_release_repo)
    result = treecheck.run_rev(SERIES, git, tag, git.rev_parse(tag), python=tier_python)
    said = result.modules()  # every module imported, gates off and on (issue 38 item 7; v0.5.20 too, docs/watch.md)
    assert len(said) == 11 and all(s.startswith("imported") for s in said.values()), said
    for gates in ("off", "on"):
        assert {n: s["status"] for n, s in scenarios(result, gates).items()} == dict.fromkeys(SCENARIOS, "passed")
    assert result.to_json()["scenarios_passed"] == SCENARIOS and not result.failed and result.checked
    assert f"scenarios: {len(SCENARIOS)} passed, 0 failed, 0 not run" in result.verdict()


def graph_tokens_renamed(git: Git, parent: str = "v0.5.23") -> str:
    """Upstream renames ``RaggedVerifyLayout.graph_num_tokens`` (field, reads, constructor keyword) in its file, and
    its read in the backend's target-verify metadata (which the scenarios enter since helper 103)."""
    backend = "python/sglang/srt/layers/attention/deepseek_v4_backend.py"
    read = git.blob(parent, backend).decode()
    assert read.count("ragged_layout.graph_num_tokens") == 1
    text = git.blob(parent, RAGGED).decode()
    new = text.replace("    graph_num_tokens: int\n", "    num_graph_tokens: int\n", 1)
    new = new.replace("self.graph_num_tokens", "self.num_graph_tokens")
    new = new.replace("ragged_layout.graph_num_tokens", "ragged_layout.num_graph_tokens")
    new = re.sub(r"(return cls\([^)]*?)\bgraph_num_tokens=", r"\1num_graph_tokens=", new, count=1)
    assert new.count("num_graph_tokens") == 8  # the field, its 6 reads, the constructor's keyword

    def edit(idx: Git) -> None:
        wu._put(idx, RAGGED, new)
        wu._put(idx, backend, read.replace("ragged_layout.graph_num_tokens", "ragged_layout.num_graph_tokens"))

    return upstream_commit(git, parent, "ragged_verify: graph_num_tokens -> num_graph_tokens", edit)


def test_a_broken_upstream_change_fails_naming_scenario_our_module_and_upstream(
        tier_python, sglang_release_repo: Path, tmp_path: Path) -> None:
    git = wu.stand_in(sglang_release_repo, tmp_path / "sglang.git")
    change = graph_tokens_renamed(git)
    result = treecheck.run_rev(SERIES, git, change[:12], change, python=tier_python)
    on = scenarios(result, "on")
    assert {n for n, s in on.items() if s["status"] == "failed"} == {"verify-compact", "decode", "worker-commit",
                                                                     "compressor-callback"}  # (the metadata: static)
    assert re.fullmatch(
        r"scenario verify-compact: in sglang\.srt\.layers\.attention\.dsv4\.online_c128_dspark\.commit_after_verify "
        r"\(sglang/srt/layers/attention/dsv4/online_c128_dspark\.py:\d+\); upstream sglang\.srt\.speculative\."
        r"ragged_verify\.RaggedVerifyLayout \(sglang/srt/speculative/ragged_verify\.py:\d+\): AttributeError: "
        r"'RaggedVerifyLayout' object has no attribute 'graph_num_tokens'", on["verify-compact"]["detail"])
    assert all(s["status"] == "passed" for s in scenarios(result, "off").values())  # upstream's path: untouched
    assert f"gates on: {on['decode']['detail']}" in result.failed and not result.to_json()["ok"]
    assert result.verdict().startswith("failed")


def patched_copy(git: Git, dest: Path, path: str, old: str, new: str) -> tuple[str, str]:
    """The patched v0.5.23 tree extracted to ``dest``, ``old`` replaced by ``new`` once in its ``path``."""
    base = git.rev_parse("v0.5.23")
    head = patched_tree(SERIES, git, "v0.5.23", base)
    git.extract(head, f"{PY_ROOT}/sglang", dest)
    text = (dest / path).read_text()
    assert text.count(old) == 1, path
    (dest / path).write_text(text.replace(old, new))
    return base, head


COMPRESSOR = "python/sglang/srt/layers/attention/dsv4/compressor_v2.py"
POOL = "python/sglang/srt/mem_cache/deepseek_v4_memory_pool.py"


@pytest.mark.parametrize("path, old, new, said", [
    # upstream's compressor passes a new keyword to the compress_fn the controller hands it (keyword-only)
    (COMPRESSOR, "            is_online=is_online,\n        )\n",
     "            is_online=is_online,\n            enable_pdl=False,\n        )\n",
     r"in sglang\.srt\.layers\.attention\.dsv4\.compressor_v2\.CompressorBackendMixin\._forward_compress_all_in_one "
     r"\(sglang/srt/layers/attention/dsv4/compressor_v2\.py:\d+\); upstream definition: none in the traceback "
     r"\(the failing line: kv_compressed = compress_fn\(\): TypeError: _verify_compress\(\) got an unexpected keyword "
     r"argument 'enable_pdl'"),
    # a pool getter the controller calls becomes a property
    (POOL, "    def get_online_c128_mtp_max_draft_tokens(self) -> int:\n",
     "    @property\n    def get_online_c128_mtp_max_draft_tokens(self) -> int:\n",
     r"in sglang\.srt\.layers\.attention\.dsv4\.online_c128_dspark\.OnlineC128DsparkController\.__init__ "
     r"\(sglang/srt/layers/attention/dsv4/online_c128_dspark\.py:\d+\); upstream definition: none in the traceback "
     r"\(the failing line: backend\.token_to_kv_pool\.get_online_c128_mtp_max_draft_tokens\(\)\): TypeError: 'int' "
     r"object is not callable"),
    # upstream rebuilds a plan of a subclass of its plan type (helper 92's case 6): our verify plan becomes a plain
    # one, so the controller no longer owns it and upstream's compress runs for a DSPARK verify; the scenarios' model
    # of our op returns the target's own plan type, as the op does, so this is seen
    (COMPRESSOR, "        plan = self._get_paged_compress_metadata(compress_ratio)\n        is_online =",
     "        plan = self._get_paged_compress_metadata(compress_ratio)\n"
     "        if isinstance(plan, CompressorPrefillPlan) and type(plan) is not CompressorPrefillPlan:\n"
     "            plan = CompressorPrefillPlan(*plan)\n        is_online =",
     r"in sglang\.srt\.layers\.attention\.dsv4\.compressor_v2\.CompressorBackendMixin\._forward_compress_all_in_one "
     r"\(sglang/srt/layers/attention/dsv4/compressor_v2\.py:\d+\); upstream definition: none in the traceback "
     r"\(the failing line: kv_compressed = compress_fn\(\): AssertionError: upstream's compress_forward ran for a "
     r"DSPARK verify plan \(it got a sglang\.kernels\.ops\.attention\.dsv4\.compress\.CompressorPrefillPlan\)"),
], ids=["compress-fn-gains-a-keyword", "pool-getter-becomes-a-property", "plan-subclass-rebuilt"])
def test_upstreams_compressor_calling_our_compress_fn_fails_on_a_changed_call_or_getter(
        path, old, new, said, tier_python, sglang_release_repo: Path, tmp_path: Path) -> None:
    """Only ``compressor-callback`` drives upstream's own call site, and it, ``startup-rules``, ``decode`` and the
    verify scenarios our controller over upstream's pool (a getter of the pool fails them all): the others pass."""
    git = Git(git_dir=sglang_release_repo)
    base, head = patched_copy(git, tmp_path, path, old, new)
    result = treecheck.run(SERIES, tmp_path, git.changed_files(base, head), python=tier_python)
    on, failing = scenarios(result, "on"), ["compressor-callback"] + [
        "startup-rules", "decode", "verify-compact", "verify-static"] * (path == POOL)
    assert {n: s["status"] for n, s in on.items() if s["status"] != "passed"} == dict.fromkeys(failing, "failed")
    for name in failing:
        assert re.fullmatch(f"scenario {name}: {said}", on[name]["detail"]), on
    assert all(s["status"] == "passed" for s in scenarios(result, "off").values())  # upstream's compress_forward
    assert result.verdict().startswith("failed") and not result.to_json()["ok"]


def test_upstream_taking_a_new_spelling_of_a_gate_env_fails_the_startup_rules(
        tier_python, sglang_release_repo: Path, tmp_path: Path) -> None:
    """Helper 92's case 5: upstream's EnvBool also takes "on"; the rules, which mirror its parser, refused it, so a
    launch with the gate "on" crashed at startup, and the tier said clean."""
    git = Git(git_dir=sglang_release_repo)
    base, head = patched_copy(git, tmp_path, "python/sglang/srt/environ.py",
                              '        if value in ["true", "1", "yes", "y"]:\n',
                              '        if value in ["true", "1", "yes", "y", "on"]:\n')
    result = treecheck.run(SERIES, tmp_path, git.changed_files(base, head), python=tier_python)
    for gates in ("off", "on"):  # the rules' reading is the same either way
        failed = {n: s["detail"] for n, s in scenarios(result, gates).items() if s["status"] != "passed"}
        assert list(failed) == ["startup-rules"], failed
        assert failed["startup-rules"].endswith(
            "AssertionError: SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK='on': upstream's EnvBool.parse reads True, the "
            "rules ValueError"), failed
    assert not result.to_json()["ok"]


def test_a_scenario_whose_module_did_not_import_is_not_run_and_unchecked(
        tier_python, sglang_release_repo: Path, tmp_path: Path) -> None:
    git = Git(git_dir=sglang_release_repo)
    # upstream's ragged verify layouts, which the compact scenarios need, need a package this interpreter lacks
    base, head = patched_copy(git, tmp_path, RAGGED, "from __future__ import annotations\n",
                              "from __future__ import annotations\nimport c128patch_not_installed\n")
    result = treecheck.run(SERIES, tmp_path, git.changed_files(base, head), python=tier_python)
    data = result.to_json()
    for gates in ("off", "on"):
        said = {n: s for n, s in scenarios(result, gates).items() if s["status"] != "passed"}
        assert sorted(said) == ["backend-verify-metadata"] * (gates == "on") + [  # (off: upstream's)
            "compressor-callback", "decode", "record-streams", "startup-rules", "verify-compact", "verify-static",
            "worker-commit"]  # startup-rules: the tree's own server-argument resolution imports it
        assert said["decode"]["status"] == "not run"
        assert said["decode"]["detail"].startswith("sglang.srt.speculative.ragged_verify did not import (Module")
    assert not result.checked and not data["ok"] and not result.failed
    assert "scenario decode: not run: sglang.srt.speculative.ragged_verify did not import" in " ".join(
        data["not_checked"])
    assert ("scenarios not run: backend-verify-metadata, compressor-callback, decode, record-streams, startup-rules, "
            "verify-compact, verify-static, worker-commit") in data["verdict"]  # the backend imports ragged_verify
    assert data["scenarios_passed"] == []


def patched_copy_with(git: Git, dest: Path, edits: dict[str, list[tuple[str, str]]]) -> tuple[str, str]:
    """``patched_copy`` of several edits: per path, each ``old`` replaced by its ``new`` once."""
    base = git.rev_parse("v0.5.23")
    head = patched_tree(SERIES, git, "v0.5.23", base)
    git.extract(head, f"{PY_ROOT}/sglang", dest)
    for path, pairs in edits.items():
        text = (dest / path).read_text()
        for old, new in pairs:
            assert text.count(old) == 1, (path, old)
            text = text.replace(old, new)
        (dest / path).write_text(text)
    return base, head


BF16 = '    if dtype_name in ("bfloat16", "bf16"):\n        return {}\n'
FP16 = '    if dtype_name in ("float16", "fp16"):\n        return {}\n'
# helper 122's b4-state-fp16 (/tmp/h122cases/build.py): float16 compress state supported, and the default
STATE_FP16 = {
    "python/sglang/srt/environ.py": [('SGLANG_DSV4_COMPRESS_STATE_DTYPE = EnvStr("float32")',
                                      'SGLANG_DSV4_COMPRESS_STATE_DTYPE = EnvStr("float16")')],
    "python/sglang/srt/model_executor/pool_configurator.py": [
        (BF16.format("2, 2"), BF16.format("2, 2") + FP16.format("2, 2"))],
    "python/sglang/srt/mem_cache/kv_cache_configurator.py": [
        (BF16.format("torch.bfloat16, torch.bfloat16"),
         BF16.format("torch.bfloat16, torch.bfloat16") + FP16.format("torch.float16, torch.float16"))],
}
# helper 122's b5-kvscore-bf16: upstream's compressor hands the online c128 compress a bf16 kv_score
KV_SCORE_BF16 = {"python/sglang/srt/layers/attention/dsv4/compressor.py": [
    ("                torch.cuda.current_stream(),\n            )\n        return kv_score\n",
     "                torch.cuda.current_stream(),\n            )\n"
     "        if self.ratio == 128 and envs.SGLANG_OPT_USE_ONLINE_COMPRESS.get():\n"
     "            kv_score = kv_score.to(torch.bfloat16)\n        return kv_score\n"),
    ("from sglang.srt.configs.deepseek_v4 import DeepSeekV4Config\n",
     "from sglang.srt.configs.deepseek_v4 import DeepSeekV4Config\nfrom sglang.srt.environ import envs\n")]}


@pytest.mark.parametrize("edits, failing, said", [
    # every scenario over the tree's own pool fails where it is built, naming the configurator's choice; the
    # scenarios had built it of float32 state whatever the tree chose
    (STATE_FP16, ["compressor-callback", "decode", "startup-rules", "verify-compact", "verify-static"],
     r"in sglang\.kernels\.ops\.attention\.dsv4\.online_c128_dspark\._module "
     r"\(sglang/kernels/ops/attention/dsv4/online_c128_dspark\.py:\d+\); upstream sglang\.srt\.mem_cache\."
     r"kv_cache_configurator\._get_dsv4_compress_state_dtypes \(sglang/srt/mem_cache/kv_cache_configurator\.py:\d+\): "
     r"AssertionError: the tree's pool, built for a default DSPARK launch with the gates on "
     r"\(SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK=1 SGLANG_OPT_USE_ONLINE_COMPRESS=1, SGLANG_DSV4_COMPRESS_STATE_DTYPE "
     r"unset\), holds torch\.float16 c128 compress state, as _get_dsv4_compress_state_dtypes chose it \(c4 "
     r"torch\.float16, c128 torch\.float16\): our ops refuse it at the first DSPARK verify: online c128 state dtype "
     r"must be float32 or bfloat16, got torch\.float16"),
    # only compressor-callback runs upstream's compressor: its compute_kv_score, no longer stood in, is named
    (KV_SCORE_BF16, ["compressor-callback"],
     r"in sglang\.srt\.layers\.attention\.dsv4\.online_c128_dspark\._verify_compress "
     r"\(sglang/srt/layers/attention/dsv4/online_c128_dspark\.py:\d+\); upstream sglang\.srt\.layers\.attention\.dsv4\."
     r"compressor\.Compressor\.compute_kv_score \(sglang/srt/layers/attention/dsv4/compressor\.py:\d+\): "
     r"AssertionError: dspark c128: kv_score_input has dtype torch\.bfloat16, expected torch\.float32: upstream's "
     r"Compressor\.compute_kv_score returned a torch\.bfloat16 \[\d+, 1024\] kv_score for a c128 layer \(online "
     r"compress on\), which its compressor hands our verify compress as it is"),
], ids=["state-dtype-fp16-default", "kv-score-bf16"])
def test_a_dtype_upstream_chooses_that_our_ops_refuse_fails_naming_where_it_was_chosen(
        edits, failing, said, tier_python, sglang_release_repo: Path, tmp_path: Path) -> None:
    """Helper 122's b4 and b5, called clean: the scenarios built the pool of float32 state whatever the tree's
    configurator chose, and stood in upstream's compressor (`compute_kv_score` handed back the step's float32 rows).
    (One tree each: b4 fails compressor-callback before b5 would.)"""
    git = Git(git_dir=sglang_release_repo)
    base, head = patched_copy_with(git, tmp_path, edits)
    result = treecheck.run(SERIES, tmp_path, git.changed_files(base, head), python=tier_python)
    on = scenarios(result, "on")
    assert {n: s["status"] for n, s in on.items() if s["status"] != "passed"} == dict.fromkeys(failing, "failed"), on
    for name in failing:
        assert re.fullmatch(f"scenario {name}: {said}", on[name]["detail"]), on[name]["detail"]
    assert all(s["status"] == "passed" for s in scenarios(result, "off").values())  # (no state of ours; upstream's)
    assert result.verdict().startswith("failed") and not result.to_json()["ok"]


def test_a_bfloat16_state_upstream_makes_the_default_is_taken_and_every_scenario_passes(
        tier_python, sglang_release_repo: Path, tmp_path: Path) -> None:
    """Helper 126's case d: a bfloat16 c128 state our ops take (as upstream's own bf16 choice rounds it) was `broken`,
    every scenario over the tree's pool off the float64 reference by float32's tolerance (0.005-0.016)."""
    git = Git(git_dir=sglang_release_repo)
    default = 'SGLANG_DSV4_COMPRESS_STATE_DTYPE = EnvStr("{}")'
    base, head = patched_copy_with(git, tmp_path, {"python/sglang/srt/environ.py": [
        (default.format("float32"), default.format("bfloat16"))]})
    result = treecheck.run(SERIES, tmp_path, git.changed_files(base, head), python=tier_python)
    for gates in ("off", "on"):
        assert {n: s["status"] for n, s in scenarios(result, gates).items()} == dict.fromkeys(SCENARIOS, "passed"), (
            gates, {n: s.get("detail") for n, s in scenarios(result, gates).items() if s["status"] != "passed"})
    assert result.checked and not result.failed


def test_a_backend_field_upstream_turns_into_a_method_fails_at_our_read_of_it(
        tier_python, sglang_release_repo: Path, tmp_path: Path) -> None:
    """Helper 131's C1: `DeepseekV4AttnBackend.speculative_num_draft_tokens` becomes a method, upstream's readers
    call it. The scenarios set the field on the tree's bare backend, which hid the method: upstream's own new calls
    failed first ('int' object is not callable) and our controller's read (`int(...)` of a method) was never named."""
    git = Git(git_dir=sglang_release_repo)
    base = git.rev_parse("v0.5.23")
    head = patched_tree(SERIES, git, "v0.5.23", base)
    git.extract(head, f"{PY_ROOT}/sglang", tmp_path)
    backend = tmp_path / "python/sglang/srt/layers/attention/deepseek_v4_backend.py"
    text = backend.read_text()
    field = "        self.speculative_num_draft_tokens: int = get_spec().speculative_num_draft_tokens\n"
    assert text.count(field) == 1
    text = re.sub(r"self\.speculative_num_draft_tokens\b(?!\()", "self.speculative_num_draft_tokens()",
                  text.replace(field, field.replace("self.speculative_num_draft_tokens", "self._num_draft_tokens")))
    at = text.index("    def __init__(", text.index("class DeepseekV4AttnBackend("))
    backend.write_text(text[:at] + "    def speculative_num_draft_tokens(self):\n        return self._num_draft_tokens"
                                   "\n\n" + text[at:])
    result = treecheck.run(SERIES, tmp_path, git.changed_files(base, head), python=tier_python)
    on = scenarios(result, "on")
    assert on["verify-static"]["status"] == "failed"
    assert re.match(r"scenario verify-static: in sglang\.srt\.layers\.attention\.dsv4\.online_c128_dspark\."
                    r"OnlineC128DsparkController\._verify_width \(sglang/srt/layers/attention/dsv4/online_c128_dspark"
                    r"\.py:\d+\); .*TypeError: int\(\) argument must be", on["verify-static"]["detail"]), on
    assert result.verdict().startswith("failed")
