"""The scenarios' tier on single upstream commits made here on the real v0.5.23 that break the series with the gates
on, each once called clean: each names the failed scenario, our code and the upstream definition involved (split
from test_scenarios.py so that CI's two workers share the tier's runs: --dist loadfile keeps a file on one)."""

from __future__ import annotations

import re
from pathlib import Path

import watch_upstream as wu
from c128patch.fit import treecheck
from c128patch.fit.contract import patched_tree
from c128patch.git import Git
from support import upstream_commit
from test_scenarios import POOL, SCENARIOS, SERIES, scenarios, tier_python  # noqa: F401 (tier_python: a fixture)

# -- helper 97: single upstream commits on the real v0.5.23 that break the series with the gates on, where the tier
# said clean: each scenario now drives what it skipped, and names the culprit

SPEC = "python/sglang/srt/speculative/"
WORKER = SPEC + "dspark_components/dspark_worker_v2.py"


def landed(git: Git, subject: str, changes: dict, parent: str = "v0.5.23") -> str:
    """An upstream commit on ``parent``: ``changes`` maps a path to a function of its text (each must change it)."""
    def edit(idx: Git) -> None:
        for path, change in changes.items():
            text = git.blob(parent, path).decode()
            new = change(text)
            assert new != text, path
            wu._put(idx, path, new)

    return upstream_commit(git, parent, subject, edit)


def failed_with_the_gates_on(tier_python: str, git: Git, change: str) -> dict[str, str]:
    """The tier on ``change``: the scenarios failed with the gates on (name -> detail); gates off all passed."""
    result = treecheck.run_rev(SERIES, git, change[:12], change, python=tier_python)
    off = {n: s for n, s in scenarios(result, "off").items() if s["status"] != "passed"}
    assert not off, off  # upstream's own path
    assert not result.to_json()["ok"] and result.verdict().startswith("failed")
    return {n: s["detail"] for n, s in scenarios(result, "on").items() if s["status"] != "passed"}


def test_upstream_routing_online_c128_layers_past_the_callback_fails_compressor_callback(
        tier_python, sglang_release_repo: Path, tmp_path: Path) -> None:
    """Helper 97's case c1b: `forward_unified` routes online c128 layers to a new method that calls
    `compress_forward` itself, so a DSPARK verify plan never reaches our `compress_fn`. The scenario called
    `_forward_compress_all_in_one` directly and said clean; it now enters where the model does
    (`forward_core_compressor`)."""
    git = wu.stand_in(sglang_release_repo, tmp_path / "sglang.git")
    method = '''    def _forward_compress_online_c128(self, *, state_pool, kv_score_input, compressor, kv_cache,
            page_size, out_loc):
        head_dim, plan = compressor.head_dim, self._get_paged_compress_metadata(128)
        pooled = compress_forward(kv_score_buffer=state_pool.kv_score_buffer.kv_score.view(-1, 1, 3 * head_dim),
            kv_score_input=kv_score_input, ape=compressor.ape.view(-1, head_dim), plan=plan,
            compress_ratio=128, head_dim=head_dim, is_online=True)
        compress_norm_rope_store(pooled, plan, norm_weight=compressor.norm.weight,
            norm_eps=compressor.norm.variance_epsilon, freq_cis=compressor.freqs_cis, out_loc=out_loc,
            kvcache=kv_cache.view(dtype=torch.uint8), page_size=page_size)

'''
    call = "        self._forward_compress_all_in_one(\n            kv_score_buffer=state_pool"

    def routed(text: str) -> str:
        assert text.count(call) == 1
        at = text.index("    def forward_unified(")
        text = text[:at] + method + text[at:]
        return text.replace(call, (
            "        if _use_online_compress(compressor.ratio) and not compressor.is_in_indexer:\n"
            "            return self._forward_compress_online_c128(state_pool=state_pool,\n"
            "                kv_score_input=kv_score_input, compressor=compressor, kv_cache=kv_cache,\n"
            "                page_size=page_size, out_loc=out_loc)\n") + call, 1)

    change = landed(git, "compressor: online c128 layers take their own path", {
        "python/sglang/srt/layers/attention/dsv4/compressor_v2.py": routed})
    failed = failed_with_the_gates_on(tier_python, git, change)
    assert list(failed) == ["compressor-callback"], failed
    assert re.fullmatch(
        r"scenario compressor-callback: in sglang\.srt\.layers\.attention\.dsv4\.compressor_v2\.CompressorBackendMixin"
        r"\._forward_compress_online_c128 \(sglang/srt/layers/attention/dsv4/compressor_v2\.py:\d+\); upstream "
        r"definition: none in the traceback \(the failing line: pooled = compress_forward\(.*\): AssertionError: "
        r"upstream's compress_forward ran for a DSPARK verify plan \(it got a sglang\.srt\.layers\.attention\.dsv4\."
        r"online_c128_dspark\.DsparkVerifyPrefillPlan\)", failed["compressor-callback"])


# upstream changes each breaking one scenario only, in one commit (one tier run for them all: each ran the whole tier
# alone, 25-33 s a run in CI's heavy tier)

def one_more_draft_token(text: str) -> str:
    """Helper 97's case c6: the pool's `get_online_c128_mtp_max_draft_tokens()` returns N+1; the controller passes
    N+1 banks over state rows laid out for N, which the CUDA kernels' `check_banks` refuses at the first verify."""
    line = re.compile(r"^( {16}return int\(pool\.online_mtp_max_draft_tokens\))$", re.M)
    assert len(line.findall(text)) == 1
    return line.sub(r"\1  + 1", text)


def early_return(text: str) -> str:
    """Helper 97's case c9: the worker step returns from the sampling-accept region's branch before our commit
    after accept (the banks are never committed)."""
    hook = ("        self._commit_target_mamba_states_after_verify(\n            batch=batch,\n"
            "            seq_lens_pre_verify=prefix_lens,")
    assert text.count(hook) == 1
    return text.replace(hook, (
        "        if region_accept is not None and self._sampling_accept_graph.committed_all:\n"
        "            return self._sampling_accept_graph.finish_step(\n"
        "                batch=batch, accept=accept, logits_output=logits_output,\n"
        "                can_run_cuda_graph=can_run_cuda_graph,\n            )\n") + hook, 1)


def record_helper_as_context_manager(text: str) -> str:
    """Helper 97's case c4: `record_stream_for_v2_verify` becomes a context manager (its callers use `with`); our
    `record_verify_inputs` calls it bare, so with SGLANG_DSPARK_RECORD_VERIFY_STREAMS=1 the verify records nothing."""
    text = text.replace("def record_stream_for_v2_verify(",
                        "@contextlib.contextmanager\ndef record_stream_for_v2_verify(", 1)
    at = text.index("def record_stream_for_v2_verify(")
    end = text.index("\ndef ", at + 10)
    return (text[:at] + text[at:end].rstrip("\n") + "\n    yield\n"
            "    record_stream_each((batch.input_ids, batch.out_cache_loc), fwd_stream)\n\n" + text[end:])


def with_block(call: str):
    def change(text: str) -> str:
        indent = call[:len(call) - len(call.lstrip())]
        assert text.count(call) == 1
        return text.replace(call, f"{indent}with {call.strip()}:\n{indent}    pass\n", 1)
    return change


def c128_plan_for_every_online_verify(text: str) -> str:
    """Helper 92's case 3: upstream builds its own c128 verify plan for any online-compress verify, not only MTP's;
    the metadata takes it before the controller's, so our plan and kernels never run."""
    old = "        if not self.has_c128 or not self.online_c128_mtp.enabled():\n"
    assert text.count(old) == 1
    return text.replace(old, "        if not self.has_c128 or not envs.SGLANG_OPT_USE_ONLINE_COMPRESS.get():\n")


def test_three_upstream_changes_in_one_commit_each_fail_their_own_scenario_naming_the_culprit(
        tier_python, sglang_release_repo: Path, tmp_path: Path) -> None:
    """One upstream commit on the real v0.5.23 with three independent breaks, each the tier once called clean: the
    scenario each one breaks fails (and no other), naming our code and the upstream definition involved; with the
    gates off every scenario passes (upstream's own path). c6: the kernel models raise where the kernels' host checks
    do, naming the getter that handed our controller the refused value; c9: `worker-commit` runs each accept branch
    of the tree's step and names the line it returned from; c4: `record-streams` runs the tree's verify step through
    our recording and upstream's helper."""
    git = wu.stand_in(sglang_release_repo, tmp_path / "sglang.git")
    eagle, ngram = "    record_stream_for_v2_verify(batch, verify_input, fwd_stream)\n", \
        "        record_stream_for_v2_verify(batch, None, fwd_stream)\n"
    change = landed(git, "three upstream changes", {
        POOL: one_more_draft_token, WORKER: early_return, SPEC + "spec_utils.py": record_helper_as_context_manager,
        SPEC + "eagle_worker_common.py": with_block(eagle), SPEC + "ngram_worker.py": with_block(ngram)})
    failed = failed_with_the_gates_on(tier_python, git, change)
    assert sorted(failed) == ["compressor-callback", "decode", "record-streams", "verify-compact", "verify-static",
                              "worker-commit"], failed  # c6: every scenario over the tree's pool (helper 106)
    pool = r"sglang\.srt\.mem_cache\.deepseek_v4_memory_pool\.DeepSeekV4TokenToKVPool"
    for name in ("compressor-callback", "decode", "verify-compact", "verify-static"):
        assert re.fullmatch(  # c6
            rf"scenario {name}: in sglang\.srt\.layers\.attention\.dsv4\.online_c128_dspark\._verify_compress "
            r"\(sglang/srt/layers/attention/dsv4/online_c128_dspark\.py:\d+\); upstream "
            rf"{pool}\.get_online_c128_mtp_max_draft_tokens \(sglang/srt/mem_cache/deepseek_v4_memory_pool\.py:\d+\)"
            r": RuntimeError: dspark c128: state has 72 rows but 10 banks of stride 8 need 80 \(num_banks 9 as "
            r"DeepSeekV4TokenToKVPool\.get_online_c128_mtp_max_draft_tokens returned it; state_slot_stride 8 as "
            r"DeepSeekV4TokenToKVPool\.get_online_c128_mtp_state_slot_offset returned it\)", failed[name]), failed[name]
    found = re.fullmatch(  # c9
        r"scenario worker-commit: in sglang\.srt\.layers\.attention\.dsv4\.online_c128_dspark\.commit_after_verify "
        r"\(sglang/srt/layers/attention/dsv4/online_c128_dspark\.py:\d+\); upstream sglang\.srt\.speculative\."
        r"dspark_components\.dspark_worker_v2\.DSparkWorkerV2\._forward_decode \(sglang/srt/speculative/"
        r"dspark_components/dspark_worker_v2\.py:(\d+)\): AssertionError: the worker's step \(sampling-accept region, "
        r"static\) ran \['accept'\] and returned at line (\d+): 0 commits, not a commit after accept",
        failed["worker-commit"])
    assert found and found[1] == found[2], failed
    patched = git.blob(patched_tree(SERIES, git, change[:12], change), WORKER).decode().splitlines()
    assert patched[int(found[1]) - 1].strip() == "return self._sampling_accept_graph.finish_step("  # upstream's
    assert re.fullmatch(  # c4
        r"scenario record-streams: in sglang\.srt\.speculative\.dspark_components\.c128_record_streams\."
        r"record_verify_inputs \(sglang/srt/speculative/dspark_components/c128_record_streams\.py:\d+\); upstream "
        r"sglang\.srt\.speculative\.spec_utils\.record_stream_for_v2_verify \(sglang/srt/speculative/spec_utils\.py:"
        r"\d+\): AssertionError: SGLANG_DSPARK_RECORD_VERIFY_STREAMS on: the verify step recorded 0 tensors before "
        r"prepare_for_verify, expected 7 \(seq_lens, req_pool_indices, input_ids, out_cache_loc, draft_token, "
        r"positions, custom_mask\)", failed["record-streams"])


def test_upstream_planning_c128_for_every_online_verify_fails_backend_verify_metadata(
        tier_python, sglang_release_repo: Path, tmp_path: Path) -> None:
    """Helper 92's case 3 (one commit on v0.5.23): backend-verify-metadata names upstream's own plan; the verify
    scenarios, which enter the backend's metadata since helper 103, stop in upstream's MTP plan too (a separate
    test since: in one commit with the three other changes it failed the scenarios they break). In the same commit
    (one tier run), helper 122's harmless `@torch.no_grad()` on the worker's `_forward_decode`: `worker-commit` and
    `record-streams` run its body under it and pass, gates off and on (they failed both, "arg 5 (closure) must be
    tuple", blaming our controller)."""
    git = wu.stand_in(sglang_release_repo, tmp_path / "sglang.git")

    def decorated(text: str) -> str:
        assert text.count("    def _forward_decode(\n") == 1
        return text.replace("    def _forward_decode(\n", "    @torch.no_grad()\n    def _forward_decode(\n")

    change = landed(git, "backend: a c128 plan for every online verify; the worker's decode step under no_grad", {
        "python/sglang/srt/layers/attention/deepseek_v4_backend.py": c128_plan_for_every_online_verify,
        WORKER: decorated})
    failed = failed_with_the_gates_on(tier_python, git, change)
    assert sorted(failed) == ["backend-verify-metadata", "compressor-callback", "decode", "verify-compact",
                              "verify-static"], failed  # startup, the worker's commit and its streams: upstream's
    backend = r"sglang\.srt\.layers\.attention\.deepseek_v4_backend"
    assert re.search(r"AssertionError: upstream's target-verify metadata \(static\) holds a c128 plan of its own with "
                     rf"the gates on \(made in {backend}\.DeepseekV4AttnBackend\._make_target_verify_c128_metadata "
                     r"\(sglang/srt/layers/attention/deepseek_v4_backend\.py:\d+\)\): the controller's verify plan is "
                     r"never built$", failed["backend-verify-metadata"]), failed
    plan = "sglang.srt.layers.attention.deepseek_v4_backend.DeepseekV4AttnBackend._make_target_verify_c128_metadata"
    assert all(plan in failed[n] for n in ("verify-static", "verify-compact", "decode")), failed


def test_upstream_advancing_lengths_in_the_accept_or_allocating_banks_only_for_mtp_fails_naming_each(
        tier_python, sglang_release_repo: Path, tmp_path: Path) -> None:
    """Two upstream changes in one commit (one tier run), each once called clean. c01: upstream's accept
    (`build_accept_outs`) advances the prefix lengths it is given in place: the eager accept's are the batch's
    `seq_lens`, which the worker's commit after accept reads as the pre-verify lengths, so our controller commits the
    banks at the post-verify lengths; `worker-commit` runs the tree's own accept (its kernels' CPU paths) and names
    the function that wrote the batch's lengths. c12: the scenarios build the tree's own pool
    (`DeepSeekV4TokenToKVPool`'s state pools, `CompressStatePool.__init__`) under the gates for a DSPARK launch: a
    pool that allocates fewer draft banks than the verify width fails `startup-rules` and `compressor-callback`,
    naming upstream's allocation and our controller, which needs them."""
    git = wu.stand_in(sglang_release_repo, tmp_path / "sglang.git")
    finalize = ("    finalized = FinalizeAcceptLens.execute(\n        correct_len=correct_len,\n"
                "        cap_trim_lens=cap_trim_lens,\n        prefix_lens=prefix_lens,\n    )\n")

    def in_place(text: str) -> str:
        assert text.count(finalize) == 1
        return text.replace(finalize, finalize + "    prefix_lens.copy_(finalized.new_seq_lens)\n", 1)

    change = landed(git, "dspark: the accept advances the lengths; draft banks only for online c128 MTP", {
        SPEC + "dspark_components/dspark_verify.py": in_place,
        "python/sglang/srt/mem_cache/deepseek_v4_compress_state.py": draft_banks_only_under_mtp_env})
    failed = failed_with_the_gates_on(tier_python, git, change)
    assert sorted(failed) == ["compressor-callback", "decode", "startup-rules", "verify-compact", "verify-static",
                              "worker-commit"], failed  # c12: every scenario over the tree's pool (helper 106)
    found = re.fullmatch(
        r"scenario worker-commit: in sglang\.srt\.layers\.attention\.dsv4\.online_c128_dspark\.commit_after_verify "
        r"\(sglang/srt/layers/attention/dsv4/online_c128_dspark\.py:\d+\); upstream sglang\.srt\.speculative\."
        r"dspark_components\.dspark_verify\.build_accept_outs \(sglang/srt/speculative/dspark_components/"
        r"dspark_verify\.py:(\d+)\): AssertionError: the commit after accept \(eager accept, compact\) got seq_lens "
        r"\[132, 8, 257\], not the step's pre-verify \[130, 7, 255\]: the batch's seq_lens were written in place "
        r"\(copy_\) before it", failed["worker-commit"])
    assert found, failed
    patched = git.blob(patched_tree(SERIES, git, change[:12], change),
                       SPEC + "dspark_components/dspark_verify.py").decode().splitlines()
    assert patched[int(found[1]) - 1].strip() == "prefix_lens.copy_(finalized.new_seq_lens)"  # upstream's new line
    for name in ("compressor-callback", "decode", "startup-rules", "verify-compact", "verify-static"):
        assert re.fullmatch(
            rf"scenario {name}: in sglang\.srt\.layers\.attention\.dsv4\.online_c128_dspark\.OnlineC128DsparkController"
            r"\.__init__ \(sglang/srt/layers/attention/dsv4/online_c128_dspark\.py:\d+\); upstream sglang\.srt\."
            r"mem_cache\.deepseek_v4_compress_state\.CompressStatePool\.__init__ \(sglang/srt/mem_cache/"
            r"deepseek_v4_compress_state\.py:\d+\): AssertionError: the tree's pool, built for a DSPARK launch of "
            r"verify width 8 with the gates on, holds 0 draft banks \(CompressStatePool\.__init__ was asked for 8\)"
            r": the controller's verify writes 8 .*", failed[name]), failed
# -- helper 103: the scenarios enter the tree's backend where the model runner does, over its own MTP controller

BACKEND_PY, MTP = "python/sglang/srt/layers/attention/deepseek_v4_backend.py", \
    "python/sglang/srt/layers/attention/dsv4/online_c128_mtp.py"
OURS = r"sglang\.srt\.layers\.attention\.dsv4\.online_c128_dspark\.OnlineC128DsparkController"


def verify_bs_only_for_mtp(text: str) -> str:
    """Helper 103's case c07: the eager metadata computes `verify_bs` only for online MTP (0 otherwise), so a static
    DSPARK verify hands our `prepare_verify` 0 rows: no bank is written and the commit copies unwritten banks."""
    old = "        verify_bs = _get_target_verify_bs(forward_batch)\n        online_c128_state_slot_offset"
    assert text.count(old) == 1
    return text.replace(old, "        verify_bs = (\n            _get_target_verify_bs(forward_batch)\n"
                             "            if self.online_c128_mtp.enabled()\n            else 0\n        )\n"
                             "        online_c128_state_slot_offset", 1)


def mtp_enabled_for_dspark(text: str) -> str:
    """Helper 103's case c06: upstream's online c128 MTP controller is on for DSPARK too (no MTP env): our
    controller's startup check refuses a DSPARK target with both on, so every launch with the gates on fails."""
    old = ("            and envs.SGLANG_EXPERIMENTAL_ONLINE_C128_MTP.get()\n"
           "            and self.backend.mtp_enabled\n")
    assert text.count(old) == 1
    return text.replace(old, "            and (\n                self.backend.mtp_enabled\n                or "
                             "self.backend.model_runner.spec_algorithm.is_dspark()\n            )\n", 1)


def test_upstream_handing_prepare_verify_no_rows_in_an_eager_verify_fails_naming_the_caller(
        tier_python, sglang_release_repo: Path, tmp_path: Path) -> None:
    """c07: the scenarios called `prepare_verify` themselves and said clean; each verify step now asks the tree's
    backend for its metadata (`init_forward_metadata`, or a graph replay's `init_forward_metadata_out_graph`), so the
    eager static steps fail, naming our hook and upstream's caller; the replayed and compact steps pass. In the same
    commit (one tier run), case 03 (helper 112): the PD-multiplexing flags move to `exec.overlap`; `startup-rules`,
    which reads the rules through the tree's own config bags of a launch it resolved, names our reading line and
    the tree's namespace that holds `enable_pdmux` now (`pdmux_out_of_disagg`)."""
    git = wu.stand_in(sglang_release_repo, tmp_path / "sglang.git")
    change = landed(git, "dsv4 backend: compute verify_bs only for online c128 MTP; PD-multiplexing under exec.overlap",
                    {BACKEND_PY: verify_bs_only_for_mtp, FIELDS + "disagg.py": pdmux_out_of_disagg,
                     FIELDS + "exec_.py": pdmux_into_overlap})
    failed = failed_with_the_gates_on(tier_python, git, change)
    assert sorted(failed) == ["compressor-callback", "decode", "startup-rules", "verify-static"], failed
    assert re.fullmatch(  # case 03, in the same commit (one tier run)
        rf"scenario startup-rules: in {RULES_OURS}; upstream sglang\.srt\.arg_groups\.fields\.exec_\.ExecOverlap "
        r"\(sglang/srt/arg_groups/fields/exec_\.py:\d+\): AssertionError: our code reads 'enable_pdmux' of the "
        r"tree's config namespace 'disagg' \(\"enable_pdmux\": bool\(disagg\.enable_pdmux\),\), which has none: the "
        rf"tree keeps it at exec\.overlap \({LAUNCH}, resolved by the tree\)", failed["startup-rules"]), failed
    assert re.fullmatch(
        rf"scenario verify-static: in {OURS}\.prepare_verify "
        r"\(sglang/srt/layers/attention/dsv4/online_c128_dspark\.py:\d+\); upstream sglang\.srt\.layers\.attention\."
        r"deepseek_v4_backend\.DeepseekV4AttnBackend\._build_forward_metadata "
        r"\(sglang/srt/layers/attention/deepseek_v4_backend\.py:\d+\): AssertionError: the eager target-verify "
        r"metadata \(static\) called prepare_verify with \{'bs': 6, 'verify_bs': 0, 'ragged_layout': None\} for a "
        r"batch of 5 verify rows in 6", failed["verify-static"])


def test_upstreams_mtp_controller_on_for_dspark_fails_our_startup_check_naming_its_enabled(
        tier_python, sglang_release_repo: Path, tmp_path: Path) -> None:
    """c06: the scenarios' backend had a stand-in MTP controller (never enabled); it is now the tree's own, built
    before ours as the backend builds them, so our controller's startup check refuses where a launch would, naming
    upstream's `enabled` (the predicate it refused on). In the same commit (one tier run), case 02 (helper 112):
    `apply_deepseek_v4_defaults` refuses online compress with DSPARK at launch; `startup-rules`, which runs the tree's
    own server-argument resolution of the launch, names it and our startup check (`online_compress_only_with_eagle`)."""
    git = wu.stand_in(sglang_release_repo, tmp_path / "sglang.git")
    change = landed(git, "online c128 MTP: enable by default, DSPARK included; online compress with EAGLE only", {
        MTP: mtp_enabled_for_dspark,
        "python/sglang/srt/arg_groups/deepseek_v4_hook.py": online_compress_only_with_eagle})
    failed = failed_with_the_gates_on(tier_python, git, change)
    assert sorted(failed) == sorted(SCENARIOS), failed
    assert re.fullmatch(  # case 02, in the same commit (one tier run)
        r"scenario startup-rules: in sglang\.srt\.layers\.attention\.dsv4\.online_c128_dspark\."
        r"check_online_c128_dspark_startup \(sglang/srt/layers/attention/dsv4/online_c128_dspark\.py:\d+\); upstream "
        r"sglang\.srt\.arg_groups\.deepseek_v4_hook\.apply_deepseek_v4_defaults \(sglang/srt/arg_groups/"
        r"deepseek_v4_hook\.py:\d+\): AssertionError: the tree's server-argument resolution refuses the DeepSeek-V4 "
        r"launch --speculative-algorithm DSPARK --speculative-dspark-block-size 7 --device cuda with the gates on "
        r"\(SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK=1 SGLANG_OPT_USE_ONLINE_COMPRESS=1\), which it takes with them "
        r"off: ValueError: SGLANG_OPT_USE_ONLINE_COMPRESS supports speculative decoding only with EAGLE, got "
        r"--speculative-algorithm DSPARK for DeepseekV4ForCausalLM", failed.pop("startup-rules")), failed
    for name, detail in failed.items():
        assert re.fullmatch(
            rf"scenario {name}: in {OURS}\.__init__ \(sglang/srt/layers/attention/dsv4/online_c128_dspark\.py:\d+\); "
            r"upstream sglang\.srt\.layers\.attention\.dsv4\.online_c128_mtp\.OnlineC128MTPController\.enabled "
            r"\(sglang/srt/layers/attention/dsv4/online_c128_mtp\.py:\d+\): RuntimeError: online c128: "
            r"SGLANG_EXPERIMENTAL_ONLINE_C128_MTP and SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK are both set for a "
            r"DSPARK target; set only the DSPARK one\. \(OnlineC128MTPController\.enabled returned True\)",
            detail), detail
def draft_banks_only_under_mtp_env(text: str) -> str:
    """Helper 104's case c12: the compress state pool allocates its draft banks only with
    SGLANG_EXPERIMENTAL_ONLINE_C128_MTP set. Under DSPARK (that env unset) the pool holds bank 0 alone and reports 0
    draft banks: the launch failed at startup with advice about the block size (a verify width of 0), and the
    scenarios, which made the pool without its `__init__` and passed the bank count themselves, said clean."""
    old = "            if online_mtp_max_draft_tokens > 0:\n"
    assert text.count(old) == 1
    constants = "from sglang.srt.constants import GPU_MEMORY_TYPE_KV_CACHE\n"
    text = text.replace(constants, constants + "from sglang.srt.environ import envs\n", 1)
    return text.replace(old, "            if (\n                online_mtp_max_draft_tokens > 0\n"
                             "                and envs.SGLANG_EXPERIMENTAL_ONLINE_C128_MTP.get()\n            ):\n", 1)


# -- helper 112: `startup-rules` reads the rules through the tree's own runtime context of a DeepSeek-V4 DSPARK launch
# resolved by the tree's own server-argument resolution (it stood in both: the checker's cases 11, 03 and 02)

FIELDS = "python/sglang/srt/arg_groups/fields/"
RULES_OURS = r"sglang\.srt\.layers\.attention\.dsv4\.online_c128_dspark_rules\.config_from_context " \
    r"\(sglang/srt/layers/attention/dsv4/online_c128_dspark_rules\.py:\d+\)"
LAUNCH = r"the DeepSeek-V4 launch --speculative-algorithm DSPARK --speculative-dspark-block-size 7 --device cuda"


def attention_backends_in_their_own_namespace(text: str) -> str:
    """Case 11: the attention-backend flags move from `exec.kernel` to a new namespace `exec.attention` (class
    `ExecAttention`; the readers follow: `runtime_context.attention_backends`, below). Our rules' `config_from_context`
    reads `exec_.kernel.attention_backend`: AttributeError at startup, gates on."""
    head = 'class ExecKernel(msgspec.Struct):\n    """Namespace ``exec.kernel``."""\n\n    _NS_PATH = "exec.kernel"\n'
    prefill = re.search(r"    prefill_attention_backend: A\[\n.*?\n    \] = None\n", text, re.S)[0]
    lean = "    enable_lean_attention: A[\n"
    assert text.count(head) == text.count(lean) == 1
    text = text.replace(prefill, "", 1).replace(head, head.replace("Kernel", "Attention").replace(
        "kernel", "attention"), 1)
    return text.replace(lean, prefill + "\n\n" + head + lean, 1)


def namespaces_with_attention(text: str) -> str:
    assert text.count("    ExecKernel,\n") == 2
    return text.replace("    ExecKernel,\n", "    ExecAttention,\n    ExecKernel,\n")


def reads_exec_attention(text: str) -> str:
    return text.replace("get_exec().kernel.attention_backend", "get_exec().attention.attention_backend").replace(
        "attention_backends_of(get_exec().kernel)", "attention_backends_of(get_exec().attention)")


def test_upstream_moving_the_attention_backends_to_their_own_namespace_fails_startup_rules_naming_where(
        tier_python, sglang_release_repo: Path, tmp_path: Path) -> None:
    """Case 11: `startup-rules` stood in `sglang.srt.runtime_context` with the namespaces as the series' base has them,
    so our rules read `exec.kernel.attention_backend` there and passed; it now reads the tree's own config bags of a
    launch the tree resolved, and names our reading line and the tree's namespace that holds the field now."""
    git = wu.stand_in(sglang_release_repo, tmp_path / "sglang.git")
    srt = "python/sglang/srt/"
    change = landed(git, "args: attention backend choice under its own namespace exec.attention", {
        FIELDS + "exec_.py": attention_backends_in_their_own_namespace,
        srt + "server_args.py": namespaces_with_attention,
        **{srt + path: reads_exec_attention for path in ("runtime_context.py", "mem_cache/kv_cache_configurator.py",
                                                         "models/gpt_oss.py", "models/granite.py")}})
    failed = failed_with_the_gates_on(tier_python, git, change)
    assert list(failed) == ["startup-rules"], failed
    assert re.fullmatch(
        rf"scenario startup-rules: in {RULES_OURS}; upstream sglang\.srt\.arg_groups\.fields\.exec_\.ExecAttention "
        r"\(sglang/srt/arg_groups/fields/exec_\.py:\d+\): AssertionError: our code reads 'attention_backend' of the "
        r"tree's config namespace 'exec\.kernel' \(exec_\.kernel\.attention_backend,\), which has none: the tree keeps "
        rf"it at exec\.attention \({LAUNCH}, resolved by the tree\)", failed["startup-rules"]), failed


PDMUX = ("    # -------------------------------------------------------------------------\n    # PD-Multiplexing\n"
         "    # -------------------------------------------------------------------------\n    enable_pdmux: A[\n"
         "        bool,\n        \"Enable PD-Multiplexing, PD running on greenctx stream.\",\n    ] = False\n"
         "    pdmux_config_path: A[\n        Optional[str],\n"
         "        \"The path of the PD-Multiplexing config file.\",\n    ] = None\n"
         "    sm_group_num: A[int, \"Number of sm partition groups.\"] = 8\n")


def pdmux_out_of_disagg(text: str) -> str:
    """Case 03: the PD-multiplexing flags move from namespace `disagg` to `exec.overlap` (scheduling, not
    disaggregation; the readers follow, none of which the tier runs). Our rules' `config_from_context` reads
    `disagg.enable_pdmux`: AttributeError at startup, gates on."""
    assert text.count("\n" + PDMUX) == 1
    return text.replace("\n" + PDMUX, "", 1)


def pdmux_into_overlap(text: str) -> str:
    tbo = "    ] = 0.48\n\n\nclass ExecOffload("
    assert text.count(tbo) == 1
    return text.replace(tbo, "    ] = 0.48\n\n" + PDMUX + "\n\nclass ExecOffload(", 1)


def online_compress_only_with_eagle(text: str) -> str:
    """Case 02: `apply_deepseek_v4_defaults` refuses SGLANG_OPT_USE_ONLINE_COMPRESS with any speculative algorithm
    but EAGLE at launch (the check our startup patch relaxes, moved into the server-argument resolution): a DSPARK
    launch with the gates on fails before our code runs."""
    old = ('                f"Only EAGLE speculative algorithm with topk == 1 is supported for {model_arch}"\n'
           "            )\n")
    assert text.count(old) == 1
    return text.replace(old, old + (
        '        if envs.SGLANG_OPT_USE_ONLINE_COMPRESS.get() and cfg.speculative_algorithm != "EAGLE":\n'
        "            raise ValueError(\n"
        '                "SGLANG_OPT_USE_ONLINE_COMPRESS supports speculative decoding only with EAGLE, "\n'
        '                f"got --speculative-algorithm {cfg.speculative_algorithm} for {model_arch}"\n'
        "            )\n"), 1)


# -- helper 106: the verify graphs' capture, and the pool's request slots as the tree's __init__ sets them

POOL_PY = "python/sglang/srt/mem_cache/deepseek_v4_memory_pool.py"
CAPTURE_BRANCH = '''        elif bucket == _GraphBucket.TARGET_VERIFY and in_capture:
            assert out_cache_loc is not None
            temp_metadata, graph_key = self._capture_target_verify_metadata(
                forward_batch, bs=bs, max_seq_len=chosen_max_seq_len, req_pool_indices=req_pool_indices,
                seq_lens=seq_lens, seq_lens_cpu=seq_lens_cpu, out_cache_loc=out_cache_loc)
'''
CAPTURE_HELPER = '''    def _capture_target_verify_metadata(self, forward_batch, *, bs, max_seq_len, req_pool_indices,
            seq_lens, seq_lens_cpu, out_cache_loc):
        """Raw verify metadata for a capture batch (no host prep)."""
        ragged_layout = self._resolve_verify_layout(forward_batch, bs=bs)
        graph_key, num_tokens_v = self._target_verify_graph_key(bs=bs, ragged_layout=ragged_layout)
        out_cache_loc_padded = torch.nn.functional.pad(out_cache_loc, pad=(0, num_tokens_v - len(out_cache_loc)),
            mode="constant", value=0)
        temp_metadata = self.init_forward_metadata_target_verify(max_seq_len=max_seq_len,
            req_pool_indices=req_pool_indices, seq_lens=seq_lens, seq_lens_cpu=seq_lens_cpu,
            out_cache_loc=out_cache_loc_padded, use_prefill_cuda_graph=True,
            online_c128_state_slot_offset=self.online_c128_mtp.state_slot_offset(), ragged_layout=ragged_layout)
        return temp_metadata, graph_key

'''


def capture_without_host_prep(text: str) -> str:
    """Helper 106's case 01: the backend's capture of a target-verify graph (`init_forward_metadata_out_graph(...,
    in_capture=True)`) goes through a new helper that skips the per-step host prep, where our `prepare_verify` sits:
    the in-graph upgrade then builds our plan without it and raises, so the server does not start with CUDA graphs."""
    branch = ("        elif bucket == _GraphBucket.TARGET_VERIFY:\n"
              "            verify_bs = _get_target_verify_bs(")
    entry = "    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:\n"
    assert text.count(branch) == 1 and text.count(entry) == 1
    return text.replace(branch, CAPTURE_BRANCH + branch, 1).replace(entry, CAPTURE_HELPER + entry, 1)


def req_slots_only_for_mtp(text: str) -> str:
    """Helper 106's case 04: the pool's online c128 request-slot bound is 0 unless the MTP env is set: our kernels get
    `max_num_reqs=0` and skip every row silently (no emit, no bank, no commit)."""
    old = "        self.online_c128_state_num_req_slots = c128_state_pool_size\n"
    assert text.count(old) == 1
    return text.replace(old, "        self.online_c128_state_num_req_slots = (\n            c128_state_pool_size\n"
                             "            if ONLINE_C128 and envs.SGLANG_EXPERIMENTAL_ONLINE_C128_MTP.get()\n"
                             "            else 0\n        )\n", 1)


def test_upstream_capturing_verify_graphs_past_our_hook_or_giving_no_request_slots_fails_naming_each(
        tier_python, sglang_release_repo: Path, tmp_path: Path) -> None:
    """Two upstream changes in one commit (one tier run), each once called clean. c01: the scenarios replayed verify
    graphs but never captured them; `decode` and `compressor-callback` now capture the graphs they replay as the decode
    CUDA-graph runner does at startup (`init_forward_metadata_out_graph(fb, in_capture=True)`, then the in-graph
    upgrade), naming the capture helper that skipped our `prepare_verify`. c04: the scenarios set the pool's request
    slots by hand; the pool is now the tree's own `__init__`'s, and a request-slot bound that leaves a verify row out
    (the kernels skip it silently) names the getter that handed it to our controller."""
    git = wu.stand_in(sglang_release_repo, tmp_path / "sglang.git")
    change = landed(git, "dsv4: capture verify metadata without the host prep; request slots only for online MTP", {
        BACKEND_PY: capture_without_host_prep, POOL_PY: req_slots_only_for_mtp})
    failed = failed_with_the_gates_on(tier_python, git, change)
    assert sorted(failed) == ["compressor-callback", "decode", "verify-compact", "verify-static"], failed
    for name in ("decode", "compressor-callback"):  # c01: captured at startup, before any step
        assert re.fullmatch(
            rf"scenario {name}: in {OURS}\.prepare_verify \(sglang/srt/layers/attention/dsv4/online_c128_dspark\.py:"
            r"\d+\); upstream sglang\.srt\.layers\.attention\.deepseek_v4_backend\.DeepseekV4AttnBackend\."
            r"_capture_target_verify_metadata \(sglang/srt/layers/attention/deepseek_v4_backend\.py:\d+\): "
            r"AssertionError: the capture target-verify metadata \((static|compact), \d+ rows\) called prepare_verify "
            r"0 times, not once", failed[name]), failed[name]
    for name in ("verify-static", "verify-compact"):  # c04
        assert re.fullmatch(
            rf"scenario {name}: in {OURS}\.build_verify_plan \(sglang/srt/layers/attention/dsv4/"
            r"online_c128_dspark\.py:\d+\); upstream sglang\.srt\.mem_cache\.deepseek_v4_memory_pool\."
            r"DeepSeekV4TokenToKVPool\.get_online_c128_state_num_req_slots \(sglang/srt/mem_cache/deepseek_v4_memory_"
            r"pool\.py:\d+\): AssertionError: dspark c128 verify plan: max_num_reqs 0 leaves out the rows of "
            r"request slots \[[\d, ]+\], which the kernel skips .* \(max_num_reqs 0 as DeepSeekV4TokenToKVPool\."
            r"get_online_c128_state_num_req_slots returned it\)", failed[name]), failed[name]
