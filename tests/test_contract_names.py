"""The contract sees both directions and the names (issue 38, item 3): upstream changes built as one commit each on
the real v0.5.23 that used to leave the contract `holds` on a tree that crashes: a callback of ours that upstream
calls with a new keyword, a getter of an untyped receiver turned property (another dropped), a field renamed on an
untyped receiver, a new ragged-verify mode env, a renamed enum value the rules accept, the c4 ring size the rules
mirror changed, a field our patch reads on a typed parameter renamed, a property it reads on ``self`` renamed in the
patched class's base; each is `broken` naming the culprit, as is a changed default of the env the rules read. A
renamed keyword we pass beside ``*args`` is an error at the call's line that ``--accept`` never turns into `holds`."""

from __future__ import annotations

import ast
import re

import pytest

import watch_upstream as wu
from c128patch.git import Git
from support import REPO_ROOT, copy_series
from test_contract import KERNEL_OPS, _edit, _line, findings, run_contract

CONTROLLER = "overlay/sglang/srt/layers/attention/dsv4/online_c128_dspark.py"
RULES = "overlay/sglang/srt/layers/attention/dsv4/online_c128_dspark_rules.py"
COMPRESS = "python/sglang/kernels/ops/attention/dsv4/compress.py"
COMPRESSOR = "python/sglang/srt/layers/attention/dsv4/compressor_v2.py"
POOL = "python/sglang/srt/mem_cache/deepseek_v4_memory_pool.py"
SPEC_INFO = "python/sglang/srt/speculative/spec_info.py"
RAGGED = "python/sglang/srt/speculative/ragged_verify.py"
ENVIRON = "python/sglang/srt/environ.py"
LOADER = "python/sglang/kernels/jit/utils/compile/loader.py"
CONFIGURATOR = "python/sglang/srt/mem_cache/kv_cache_configurator.py"
POOL_CONFIG = "python/sglang/srt/model_executor/pool_configurator.py"
BASE_WORKER = "python/sglang/srt/speculative/base_spec_worker.py"
WORKER = "python/sglang/srt/speculative/dspark_components/dspark_worker_v2.py"


def _replace(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def callback_keyword(git: Git) -> str:
    """compress_forward gains ``enable_pdl=`` and the compressor passes it: to our ``_verify_compress`` too."""
    return _edit(git, "compress: enable_pdl", lambda text_of: {
        COMPRESS: _replace(text_of(COMPRESS), "    is_online: bool = False,\n) -> torch.Tensor:",
                           "    is_online: bool = False,\n    enable_pdl: bool = False,\n) -> torch.Tensor:"),
        COMPRESSOR: _replace(text_of(COMPRESSOR), "            is_online=is_online,\n        )\n",
                             "            is_online=is_online,\n            enable_pdl=False,\n        )\n")})


def getter_property(git: Git) -> str:
    """The pool's draft-token getter becomes a property; the request-slot getter is dropped."""
    def changes(text_of):
        text = _replace(text_of(POOL), "    def get_online_c128_mtp_max_draft_tokens(self) -> int:",
                        "    @property\n    def get_online_c128_mtp_max_draft_tokens(self) -> int:")
        return {POOL: _replace(text, "def get_online_c128_state_num_req_slots(self)",
                               "def online_c128_num_slots(self)")}
    return _edit(git, "pool: getters as properties", changes)


def field_renamed(git: Git) -> str:
    """SpecInput.ragged_verify_layout -> verify_layout (the controller reads it by name with getattr)."""
    return _edit(git, "spec_info: rename the ragged layout field", lambda text_of: {
        SPEC_INFO: _replace(text_of(SPEC_INFO), "    ragged_verify_layout: Optional[RaggedVerifyLayout] = None",
                            "    verify_layout: Optional[RaggedVerifyLayout] = None")})


def mode_env(git: Git) -> str:
    """A new ragged-verify mode env the rules neither read nor refuse."""
    return _edit(git, "environ: a tree ragged verify", lambda text_of: {
        ENVIRON: _replace(text_of(ENVIRON), '    SGLANG_RAGGED_VERIFY_MODE = EnvStr("static")\n',
                          '    SGLANG_RAGGED_VERIFY_MODE = EnvStr("static")\n'
                          "    SGLANG_RAGGED_VERIFY_TREE = EnvBool(False)\n")})


def enum_renamed(git: Git) -> str:
    """RaggedVerifyMode.COMPACT's value, which the rules accept, becomes "compacted"."""
    return _edit(git, "ragged_verify: compacted", lambda text_of: {
        RAGGED: _replace(text_of(RAGGED), '    COMPACT = "compact"', '    COMPACT = "compacted"')})


def ring_changed(git: Git) -> str:
    """The c4 compress state ring under speculative decoding grows from 16 to 32 rows."""
    return _edit(git, "pool: a wider c4 ring", lambda text_of: {
        POOL: _replace(text_of(POOL), "return 16 if compress_ratio == 4 else 256",
                       "return 32 if compress_ratio == 4 else 256")})


def keyword_renamed(git: Git) -> str:
    """load_jit's ``extra_cuda_cflags=`` becomes ``extra_cuda_flags=`` (upstream's callers updated)."""
    def changes(text_of):
        paths = git.out("grep", "-l", "-w", "extra_cuda_cflags", "v0.5.23", "--", "python/sglang").splitlines()
        return {p.split(":", 1)[1]: re.sub(r"\bextra_cuda_cflags\b", "extra_cuda_flags", text_of(p.split(":", 1)[1]))
                for p in paths}
    return _edit(git, "loader: extra_cuda_flags", changes)


def env_default(git: Git) -> str:
    """The ragged-verify mode env the rules read defaults to "compact" instead of "static"."""
    return _edit(git, "environ: compact by default", lambda text_of: {
        ENVIRON: _replace(text_of(ENVIRON), 'SGLANG_RAGGED_VERIFY_MODE = EnvStr("static")',
                          'SGLANG_RAGGED_VERIFY_MODE = EnvStr("compact")')})


def env_default_refused(git: Git) -> str:
    """The ragged-verify mode env defaults to "tree", a mode the rules refuse (their copy of the default: static)."""
    return _edit(git, "environ: tree by default", lambda text_of: {
        ENVIRON: _replace(text_of(ENVIRON), 'SGLANG_RAGGED_VERIFY_MODE = EnvStr("static")',
                          'SGLANG_RAGGED_VERIFY_MODE = EnvStr("tree")')})


def typed_field_renamed(git: Git) -> str:
    """KVCacheConfigurator.spec_algorithm -> speculative_algorithm (our patch reads ``kvc.spec_algorithm``)."""
    return _edit(git, "kv_cache_configurator: rename spec_algorithm", lambda text_of: {
        CONFIGURATOR: _replace(text_of(CONFIGURATOR), "    spec_algorithm: SpeculativeAlgorithm\n",
                               "    speculative_algorithm: SpeculativeAlgorithm\n")})


def self_property_renamed(git: Git) -> str:
    """BaseSpecWorker.target_worker -> target_model_worker (our patch reads ``self.target_worker`` in the worker)."""
    return _edit(git, "base_spec_worker: rename target_worker", lambda text_of: {
        BASE_WORKER: _replace(text_of(BASE_WORKER), "def target_worker(self)", "def target_model_worker(self)")})


def state_pools_renamed(git: Git) -> str:
    """DeepSeekV4TokenToKVPool.compress_state_pools -> c128_state_pools in its file (helper 92's case 4: its getters
    still work; the controller reads it with getattr on an untyped local, so the lock had no row)."""
    return _edit(git, "pool: c128_state_pools", lambda text_of: {
        POOL: re.sub(r"\bself\.compress_state_pools\b", "self.c128_state_pools", text_of(POOL))})


PREFILL_COPY = "    def copy_(self, other) -> None:\n        assert isinstance(other, CompressorPrefillPlan)\n"
METADATA = "python/sglang/srt/layers/attention/dsv4/metadata.py"


def copy_renamed(git: Git) -> str:
    """CompressorPrefillPlan.copy_ -> copy_from: the refusing copy_ we install on its DSPARK subclass goes uncalled."""
    return _edit(git, "compress: copy_from", lambda text_of: {
        COMPRESS: _replace(text_of(COMPRESS), PREFILL_COPY, PREFILL_COPY.replace("copy_(", "copy_from("))})


def copy_arguments(git: Git) -> str:
    """CompressorPrefillPlan.copy_ gains ``non_blocking`` and upstream's in-place copy passes it (positionally)."""
    return _edit(git, "compress: non-blocking plan copies", lambda text_of: {
        COMPRESS: _replace(text_of(COMPRESS), PREFILL_COPY,
                           PREFILL_COPY.replace("other)", "other, non_blocking=False)")),
        METADATA: _replace(text_of(METADATA), "        dst.copy_(src)\n", "        dst.copy_(src, True)\n")})


def copy_keyword(git: Git) -> str:
    """Upstream's in-place copy passes ``non_blocking=True`` and CompressorPrefillPlan.copy_ takes ``**kwargs``: the
    method still takes every call upstream's class shape allows, but the call reaches our refusing copy_ too."""
    return _edit(git, "metadata: non-blocking in-place copies", lambda text_of: {
        COMPRESS: _replace(text_of(COMPRESS), PREFILL_COPY, PREFILL_COPY.replace("other)", "other, **kwargs)")),
        METADATA: _replace(text_of(METADATA), "dst.copy_(src)\n", "dst.copy_(src, non_blocking=True)\n")})


COMPRESS_STATE = "python/sglang/srt/mem_cache/deepseek_v4_compress_state.py"
BACKEND = "python/sglang/srt/layers/attention/deepseek_v4_backend.py"
MODEL_RUNNER = "python/sglang/srt/model_executor/model_runner.py"


def pool_online_renamed(git: Git) -> str:
    """CompressStatePool.online (``self.online = online`` in ``__init__``) -> is_online: ``p.online`` reads it."""
    return _edit(git, "compress state: is_online", lambda text_of: {
        COMPRESS_STATE: re.sub(r"\bself\.online\b", "self.is_online", text_of(COMPRESS_STATE)),
        POOL: re.sub(r"\.online\b", ".is_online", text_of(POOL))})


def rawverify_field_renamed(git: Git) -> str:
    """DSV4RawVerifyMetadata.extend_start_loc (a field three more classes define) -> verify_start_loc."""
    def changes(text_of):
        text = _replace(text_of(BACKEND), "    extend_start_loc: Optional[torch.Tensor] = None\n",
                        "    verify_start_loc: Optional[torch.Tensor] = None\n")
        return {BACKEND: _replace(text, "self.extend_start_loc = other.extend_start_loc",
                                  "self.verify_start_loc = other.verify_start_loc")}
    return _edit(git, "backend: verify_start_loc", changes)


def draft_worker_renamed(git: Git) -> str:
    """ModelRunner.is_draft_worker (set in ``__init__``) -> is_draft_model_runner: ``getattr(backend.model_runner,
    "is_draft_worker", False)`` is always False."""
    return _edit(git, "model runner: is_draft_model_runner", lambda text_of: {
        MODEL_RUNNER: re.sub(r"\bis_draft_worker\b", "is_draft_model_runner", text_of(MODEL_RUNNER))})


def backend_local_renamed(git: Git) -> str:
    """A local of the backend's target-verify graph replay, ``ragged_layout``, -> ``verify_layout``: our added
    ``prepare_verify(..., ragged_layout=ragged_layout)`` there reads a name nothing binds (a NameError, gates off
    too)."""
    return _edit(git, "backend: verify_layout", lambda text_of: {BACKEND: _replace(_replace(
        text_of(BACKEND),
        "            ragged_layout = self._resolve_verify_layout(forward_batch, bs=bs)\n            graph_key, "
        "num_tokens_v = self._target_verify_graph_key(\n                bs=bs, ragged_layout=ragged_layout\n",
        "            verify_layout = self._resolve_verify_layout(forward_batch, bs=bs)\n            graph_key, "
        "num_tokens_v = self._target_verify_graph_key(\n                bs=bs, ragged_layout=verify_layout\n"),
        "                ragged_layout=ragged_layout,\n            )\n            if self._uses_early_verify_metadata("
        "ragged_layout=ragged_layout):",
        "                ragged_layout=verify_layout,\n            )\n            if self._uses_early_verify_metadata("
        "ragged_layout=verify_layout):")})


RUNTIME_CONTEXT = "python/sglang/srt/runtime_context.py"
DISAGG_FIELDS = "python/sglang/srt/arg_groups/fields/disagg.py"
SP_FLAGS = 'class SpFlags(_FlagGroupBase):\n    """LayerNorm sequence-parallelism flags, materialized by\n'


def sp_enabled_renamed(git: Git) -> str:
    """SpFlags.enabled -> active (layernorm sequence parallelism, helper 106's case 12): nothing of ours reads it;
    ``self.online_c128_dspark.enabled()`` (our controller) was read as ``SpFlags.enabled``/``DpFlags.enabled``."""
    def changes(text_of):
        head, _, tail = text_of(RUNTIME_CONTEXT).partition(SP_FLAGS)
        return {RUNTIME_CONTEXT: head + SP_FLAGS + tail.replace("    enabled: bool = False\n",
                                                                "    active: bool = False\n", 1)}
    return _edit(git, "runtime_context: SpFlags.active", changes)


def pdmux_renamed(git: Git) -> str:
    """The config leaf disagg.enable_pdmux -> enable_pd_multiplexing (helper 106's case 3 moves it to exec.overlap):
    the rules read ``disagg.enable_pdmux`` on the namespace ``get_disagg()`` gives, not on a Scheduler."""
    return _edit(git, "disagg: enable_pd_multiplexing", lambda text_of: {
        DISAGG_FIELDS: _replace(text_of(DISAGG_FIELDS), "    enable_pdmux: A[", "    enable_pd_multiplexing: A[")})


CHANGES = {"sp-enabled-renamed": sp_enabled_renamed, "pdmux-renamed": pdmux_renamed,
           "backend-local-renamed": backend_local_renamed, "pool-online-renamed": pool_online_renamed,
           "rawverify-field-renamed": rawverify_field_renamed,
           "draft-worker-renamed": draft_worker_renamed, "callback-keyword": callback_keyword,
           "copy-renamed": copy_renamed, "copy-arguments": copy_arguments,
           "copy-keyword": copy_keyword,
           "getter-property": getter_property, "field-renamed": field_renamed,
           "mode-env": mode_env, "enum-renamed": enum_renamed, "ring-changed": ring_changed,
           "keyword-renamed": keyword_renamed, "env-default": env_default,
           "env-default-refused": env_default_refused, "typed-field-renamed": typed_field_renamed,
           "self-property-renamed": self_property_renamed, "state-pools-renamed": state_pools_renamed}


@pytest.fixture(scope="module")
def names_drift(sglang_release_repo, tmp_path_factory) -> Git:
    git = wu.stand_in(sglang_release_repo, tmp_path_factory.mktemp("names-remote") / "sglang.git")
    for branch, make in CHANGES.items():
        wu.set_branch(git, branch, make(git))
    return git


def _errors(rev: str, repo: Git) -> list[str]:
    run = run_contract(rev, repo=repo)
    assert run.code == 1 and not run.out["ok"] and run.out["revs"][0]["verdict"].startswith("broken: ")
    return findings(run, "error")


def test_upstream_calling_our_callback_with_a_new_keyword_is_broken(names_drift):
    [error] = _errors("callback-keyword", names_drift)
    assert re.match(rf"{COMPRESSOR}:\d+: upstream's call of our sglang.srt.layers.attention.dsv4.online_c128_dspark."
                    r"_verify_compress\(kv_score_buffer=\.\.\., .*, is_online=\.\.\., enable_pdl=\.\.\.\) does not "
                    rf"bind to {CONTROLLER}:{_line(CONTROLLER, 'def _verify_compress(')} "
                    r"`def _verify_compress\(verify_plan, owned, \*, kv_score_buffer, .*, is_online=True\)`: "
                    "got an unexpected keyword argument 'enable_pdl'$", error), error


def test_a_renamed_method_we_install_in_upstreams_place_is_broken_at_the_install(names_drift):
    """Broken at the install, and where our plan calls it on a field the class annotates (``prefill_plan:
    CompressorPrefillPlan``, read as ``self.prefill_plan.copy_``: typed on the class, not on a parameter)."""
    called, installed = sorted(_errors("copy-renamed", names_drift))  # overlay/sglang/kernels/... sorts first
    for error, path, text in ((installed, CONTROLLER, '"copy_": _refuse_copy'),
                              (called, KERNEL_OPS, "self.prefill_plan.copy_(other.prefill_plan)")):
        assert re.match(rf"{path}:{_line(path, text)}: sglang.kernels.ops.attention.dsv4.compress.CompressorPrefillPlan"
                        rf".copy_: class CompressorPrefillPlan \({COMPRESS}:\d+\) has no copy_\b", error), error


def test_upstream_passing_more_to_a_method_we_install_in_its_place_does_not_bind_to_ours(names_drift):
    errors = _errors("copy-arguments", names_drift)
    line, ours = _line(CONTROLLER, '"copy_": _refuse_copy'), _line(CONTROLLER, "def _refuse_copy(")
    plan = "sglang.kernels.ops.attention.dsv4.compress.CompressorPrefillPlan"
    assert f"{CONTROLLER}:{line}: upstream's call of {plan}.copy_(arg1, arg2, arg3) does not bind to our " \
           f"_refuse_copy ({CONTROLLER}:{ours}) `def _refuse_copy(self, other)`: too many positional arguments" \
        in errors, errors
    assert any(e.startswith(f"{CONTROLLER}:{line}: {plan}.copy_ changed since the lock: {COMPRESS}:") and
               e.endswith("`def copy_(self, other, non_blocking=False)`") for e in errors), errors
    call = _upstream_line(names_drift, "copy-arguments", METADATA, "dst.copy_(src, True)")
    assert f"{METADATA}:{call}: upstream's call of {plan}.copy_(arg1, arg2, arg3) does not bind to our _refuse_copy " \
           f"({CONTROLLER}:{ours}) `def _refuse_copy(self, other)`: too many positional arguments" in errors, errors
    assert len(errors) == 4, errors  # and where our plan calls it (typed): changed since the lock


def _upstream_line(git: Git, rev: str, path: str, text: str) -> int:
    [line] = [i for i, s in enumerate(git.blob(rev, path).decode().splitlines(), 1) if text in s]
    return line


def test_upstream_calling_a_method_we_install_with_a_new_keyword_is_broken_at_the_call(names_drift, tmp_path):
    """Upstream's own call of the plan's copy_ (``maybe_copy_inplace``, reached with the field the backend keeps our
    plan in, ``c128_compress_metadata: Optional[FusedCompressMetadata]``, an alias of a Union naming the class) is
    bound to our refusing copy_: a keyword it does not take is an error at that call, which --accept never records
    (the install's own check sees only the class's signature, which ``**kwargs`` keeps open)."""
    series = copy_series(tmp_path / "series")
    run = run_contract("copy-keyword", "--accept", repo=names_drift, series=series)
    assert run.code == 1 and run.out["revs"][0]["verdict"].startswith("broken: ")
    before = (REPO_ROOT / "patches" / "contract.lock").read_text()
    assert run.out["accepted"] == 0 and (series / "patches" / "contract.lock").read_text() == before
    error, *changed = findings(run, "error")  # and the two installs' "changed since the lock" (**kwargs)
    assert len(changed) == 2 and all(" changed since the lock: " in e for e in changed), changed
    call = _upstream_line(names_drift, "copy-keyword", METADATA, "non_blocking=True")
    ours = _line(CONTROLLER, "def _refuse_copy(")
    assert error == (f"{METADATA}:{call}: upstream's call of sglang.kernels.ops.attention.dsv4.compress."
                     "CompressorPrefillPlan.copy_(arg1, arg2, non_blocking=...) does not bind to our _refuse_copy "
                     f"({CONTROLLER}:{ours}) `def _refuse_copy(self, other)`: got an unexpected keyword argument "
                     "'non_blocking'"), error


@pytest.mark.parametrize("annotation", ["Plan", "Optional[Plan]", "Plan | None", "None | Plan", "'Optional[Plan]'",
                                        "m.Plan"])
def test_a_receiver_typed_through_optional_a_union_with_none_or_a_string_is_typed(annotation):
    from c128patch.fit.resolve import uses_in

    source = ("from sglang.x import m\nfrom sglang.x.m import Plan\n"
              f"def f(p: {annotation}):\n    return p.plan_c\n"
              f"class C:\n    q: {annotation}\n    def g(self):\n        return self.q.plan_w\n")
    typed = [u.chain for u in uses_in("python/sglang/y.py", ast.parse(source), None) if u.kind == "typed"]
    assert typed == [["sglang", "x", "m", "Plan", "plan_c"], ["sglang", "x", "m", "Plan", "plan_w"]]


def test_a_getter_turned_property_and_a_dropped_one_on_an_untyped_pool_are_broken(names_drift):
    errors = _errors("getter-property", names_drift)
    pool = "sglang.srt.mem_cache.deepseek_v4_memory_pool.DeepSeekV4TokenToKVPool"
    line = _line(CONTROLLER, "backend.token_to_kv_pool.get_online_c128_mtp_max_draft_tokens()")
    assert any(e.startswith(f"{CONTROLLER}:{line}: {pool}.get_online_c128_mtp_max_draft_tokens changed since the "
                            f"lock: {POOL}:") and e.endswith("`@property get_online_c128_mtp_max_draft_tokens`")
               for e in errors), errors
    line = _line(CONTROLLER, "max_num_reqs=int(pool.get_online_c128_state_num_req_slots())")
    assert any(e.startswith(f"{CONTROLLER}:{line}: {pool}.get_online_c128_state_num_req_slots: class "
                            "DeepSeekV4TokenToKVPool (") and " has no get_online_c128_state_num_req_slots" in e
               for e in errors), errors


def test_a_field_renamed_on_an_untyped_spec_info_is_broken(names_drift):
    [error] = _errors("field-renamed", names_drift)
    line = _line(CONTROLLER, '"ragged_verify_layout"')
    assert re.match(rf"{CONTROLLER}:{line}: sglang.srt.speculative.spec_info.SpecInput.ragged_verify_layout: "
                    rf"class SpecInput \({SPEC_INFO}:\d+\) has no ragged_verify_layout\b", error), error


def test_an_instance_attribute_read_by_getattr_on_an_untyped_local_is_broken_when_renamed(names_drift):
    """The class named with its own file (helper 105: it gave KVCache's, the base the lookup stopped at)."""
    [error] = _errors("state-pools-renamed", names_drift)
    line = _line(CONTROLLER, 'getattr(kv_pool, "compress_state_pools", None)')
    assert re.match(rf"{CONTROLLER}:{line}: sglang.srt.mem_cache.deepseek_v4_memory_pool.DeepSeekV4TokenToKVPool."
                    r"compress_state_pools: class DeepSeekV4TokenToKVPool "
                    r"\(python/sglang/srt/mem_cache/deepseek_v4_memory_pool\.py:\d+\) has no compress_state_pools",
                    error), error


def test_a_new_ragged_verify_mode_env_is_broken_until_reviewed(names_drift, tmp_path):
    [error] = _errors("mode-env", names_drift)
    assert re.match(rf"{ENVIRON}:\d+: upstream declares sglang.srt.environ.Envs.SGLANG_RAGGED_VERIFY_TREE, which the "
                    rf"rules \({RULES}:{_line(RULES, 'RAGGED_ENV = ')}\) neither accept nor refuse", error), error
    series = copy_series(tmp_path / "series")
    run = run_contract("mode-env", "--accept", repo=names_drift, series=series)
    assert run.code == 0 and run.out["accepted"] == 1
    assert "declared  sglang.srt.environ.Envs.SGLANG_RAGGED_VERIFY_TREE  " in (series / "patches" /
                                                                               "contract.lock").read_text()
    assert run_contract("mode-env", repo=names_drift, series=series).code == 0


def test_a_renamed_enum_value_the_rules_accept_is_broken(names_drift):
    [error] = _errors("enum-renamed", names_drift)
    assert error.startswith(f"{RULES}:{_line(RULES, '_SHOWN_RAGGED_MODES = ')}: sglang.srt.speculative.ragged_verify."
                            f"RaggedVerifyMode.COMPACT changed since the lock: {RAGGED}:16 `= 'compact'` at v0.5.23, "
                            f"now {RAGGED}:16 `= 'compacted'`"), error


def test_a_changed_ring_size_the_rules_mirror_is_broken(names_drift):
    [error] = _errors("ring-changed", names_drift)
    assert error.startswith(f"{RULES}:{_line(RULES, 'C4_RING_DRAFT_CAP = ')}: sglang.srt.mem_cache."
                            "deepseek_v4_memory_pool.get_compress_state_ring_size changed since the lock: ")
    assert "return 16 if compress_ratio == 4 else 256" in error and "return 32 if compress_ratio == 4" in error


def test_a_changed_default_of_the_env_the_rules_read_is_broken_only_where_the_rules_decide_it_differently(
        names_drift):
    """Helper 106's case 9: static -> compact, both admitted: the rules' copy of the default decides as upstream's (a
    note, holds); a default the rules refuse (their copy admitted) is broken, saying why."""
    run = run_contract("env-default", "--verbose", repo=names_drift)
    assert run.code == 0 and run.out["ok"], findings(run, "error")
    [note] = [n for n in findings(run, "note") if "SGLANG_RAGGED_VERIFY_MODE changed since the lock" in n]
    assert note.startswith(f"{RULES}:{_line(RULES, 'RAGGED_ENV = ')}: sglang.srt.environ.envs."
                           f"SGLANG_RAGGED_VERIFY_MODE changed since the lock: {ENVIRON}:"), note
    assert "`= EnvStr('compact')`: the rules admit both 'static' and 'compact'" in note, note
    [error] = _errors("env-default-refused", names_drift)
    assert "`= EnvStr('static')` at v0.5.23" in error and "`= EnvStr('tree')`: the rules refuse upstream's new " \
        "default 'tree' but admit their copy 'static'" in error, error


def test_a_field_renamed_on_a_typed_parameter_is_broken(names_drift):
    [error] = _errors("typed-field-renamed", names_drift)
    assert re.match(rf"{POOL_CONFIG}:\d+: sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator."
                    rf"spec_algorithm: class KVCacheConfigurator \({CONFIGURATOR}:\d+\) has no spec_algorithm$",
                    error), error


def test_a_property_renamed_in_the_base_of_the_class_we_patch_is_broken(names_drift):
    [error] = _errors("self-property-renamed", names_drift)
    assert re.match(rf"{WORKER}:\d+: sglang.srt.speculative.dspark_components.dspark_worker_v2.DSparkWorkerV2."
                    rf"target_worker: class DSparkWorkerV2 \({WORKER}:\d+\) has no target_worker \(DSparkWorkerV2 "
                    r"resolves names in __getattr__\)$", error), error


def test_a_renamed_keyword_beside_star_args_is_an_error_at_the_call_and_never_accepted(names_drift, tmp_path):
    series = copy_series(tmp_path / "series")
    before = (series / "patches" / "contract.lock").read_text()
    run = run_contract("keyword-renamed", "--accept", repo=names_drift, series=series)
    assert run.code == 1 and not run.out["ok"] and run.out["accepted"] == 0
    [error] = findings(run, "error")
    call = _line(KERNEL_OPS, "return load_jit(")
    assert error.startswith(f"{KERNEL_OPS}:{call}: call sglang.kernels.jit.utils.compile.loader.load_jit(arg1, arg2, "
                            "cuda_files=..., cuda_wrappers=..., extra_cuda_cflags=...) does not bind to "
                            f"{LOADER}:"), error
    assert error.endswith("got an unexpected keyword argument 'extra_cuda_cflags'"), error
    assert (series / "patches" / "contract.lock").read_text() == before
    [warning] = findings(run, "warning")
    assert warning.startswith(f"{KERNEL_OPS}:{call}: sglang.kernels.jit.utils.compile.loader.load_jit changed ")


def test_the_lock_records_each_new_kind_at_the_base():
    text = (REPO_ROOT / "patches" / "contract.lock").read_text()
    assert (f"callback  sglang.srt.layers.attention.dsv4.online_c128_dspark._verify_compress  {COMPRESSOR}:"
            in text)
    assert "member  sglang.srt.speculative.spec_info.SpecInput.ragged_verify_layout  " in text
    install = _line(CONTROLLER, '"copy_": _refuse_copy')
    assert (f"installed  sglang.kernels.ops.attention.dsv4.compress.CompressorPrefillPlan.copy_  "
            f"{CONTROLLER}:{install}  {COMPRESS}:") in text
    assert "mirror  sglang.srt.speculative.ragged_verify.RaggedVerifyMode.COMPACT  " in text
    assert "declared  sglang.srt.speculative.spec_info.SpeculativeAlgorithm.DSPARK  " in text
    assert (f"typed  sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator.spec_algorithm  {POOL_CONFIG}:"
            in text)


@pytest.mark.parametrize("change, path, keyword", [("callback-keyword", COMPRESSOR, "enable_pdl"),
                                                   ("copy-keyword", METADATA, "non_blocking")],
                         ids=["callback", "installed-call"])
def test_watch_says_broken_naming_the_callback_and_bisect_agrees(names_drift, tmp_path, change, path, keyword):
    from c128patch.fit.watch import EXIT
    from support import invoke

    run = invoke("watch", "--onto", change, "--repo", str(names_drift.git_dir), "--out",
                 str(tmp_path / "out"), "--series", str(REPO_ROOT), "--no-run")  # the contract's break, not the tier's
    assert run.code == EXIT["broken"], run.err
    assert any(f.startswith(f"{path}:") and keyword in f for f in run.out["contract"]["failing"])
    assert run.out["bisect"]["found"] and run.out["bisect"]["commit"] == names_drift.rev_parse(change)


def test_an_instance_attribute_renamed_on_an_untyped_receiver_is_broken(names_drift):
    """``self.online = online`` in CompressStatePool.__init__: the pools ``p`` our controller reads ``p.ratio``,
    ``p.online`` and ``p.kv_score_buffer`` on are the class defining all three."""
    [error] = _errors("pool-online-renamed", names_drift)
    line = _line(CONTROLLER, "p.ratio == 128 and p.online")
    assert re.match(rf"{CONTROLLER}:{line}: sglang.srt.mem_cache.deepseek_v4_compress_state.CompressStatePool.online: "
                    rf"class CompressStatePool \({COMPRESS_STATE}:\d+\) has no online$", error), error


def test_a_field_more_classes_define_renamed_on_the_receivers_class_is_broken(names_drift):
    """extend_start_loc is a field of four classes; ``raw_metadata`` is read for seq_lens, verify_lens,
    extend_start_loc and req_pool_indices too, which only DSV4RawVerifyMetadata defines all of."""
    [error] = _errors("rawverify-field-renamed", names_drift)
    line = _line(CONTROLLER, "extend_start_loc = raw_metadata.extend_start_loc")
    assert re.match(rf"{CONTROLLER}:{line}: sglang.srt.layers.attention.deepseek_v4_backend.DSV4RawVerifyMetadata."
                    rf"extend_start_loc: class DSV4RawVerifyMetadata \({BACKEND}:\d+\) has no extend_start_loc$",
                    error), error


def test_a_name_read_with_getattr_and_a_default_renamed_is_broken(names_drift):
    [error] = _errors("draft-worker-renamed", names_drift)
    line = _line(CONTROLLER, '"is_draft_worker", False')
    assert re.match(rf"{CONTROLLER}:{line}: sglang.srt.model_executor.model_runner.ModelRunner.is_draft_worker: "
                    rf"class ModelRunner \({MODEL_RUNNER}:\d+\) has no is_draft_worker$", error), error


def test_watch_says_broken_naming_a_renamed_instance_attribute_and_bisect_agrees(names_drift, tmp_path):
    from c128patch.fit.watch import EXIT
    from support import invoke

    run = invoke("watch", "--onto", "pool-online-renamed", "--repo", str(names_drift.git_dir), "--out",
                 str(tmp_path / "out"), "--series", str(REPO_ROOT), "--no-run")
    assert run.code == EXIT["broken"], run.err
    line = _line(CONTROLLER, "p.ratio == 128 and p.online")
    assert any(f.startswith(f"{CONTROLLER}:{line}:") and "CompressStatePool.online" in f
               for f in run.out["contract"]["failing"]), run.out["contract"]
    assert run.out["bisect"]["found"] and run.out["bisect"]["commit"] == names_drift.rev_parse("pool-online-renamed")


def test_a_local_our_added_line_reads_renamed_upstream_is_broken_at_our_line(names_drift):
    """No use resolves against a class here: the name is a local of upstream's function, which our hunk reads; after
    the rename nothing binds it there (Python's symtable: a global the module lacks)."""
    [error] = _errors("backend-local-renamed", names_drift)
    assert re.match(rf"{BACKEND}:\d+: our line reads ragged_layout, which neither init_forward_metadata_out_graph nor "
                    r"its module binds on this tree \(a NameError when the line runs\)$", error), error


def test_names_bound_by_a_closure_a_comprehension_a_global_or_the_module_are_not_unbound():
    import ast

    from c128patch.fit.unbound import unbound

    text = ("import os\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from x import Hint\nLIMIT = 1\n\n"
            "def setup():\n    global LATER\n    LATER = 2\n\n"
            "def f(a: Hint) -> Hint:\n    b = [a + c for c in range(LIMIT)]\n    g = lambda d: d + b[0]\n"
            "    def inner():\n        return a + LATER + len(os.sep)\n    return g(inner()) + gone + __name__\n")
    assert unbound(ast.parse(text), text, "m.py", None) == [(16, "gone", "f")]
    assert unbound(ast.parse(text), text, "m.py", {12, 13, 15}) == []  # only the lines given
    starred = "from x import *\n\ndef f():\n    return gone\n"
    assert unbound(ast.parse(starred), starred, "m.py", None) == []  # a * import binds names nobody can list


def test_a_renamed_flag_our_controller_shares_a_name_with_is_not_broken(names_drift):
    """Helper 106's case 12: ``self.online_c128_dspark.enabled()`` (and ``controller.enabled()``,
    ``backend.online_c128_mtp.enabled()``) is on an object whose type the contract does not determine; DpFlags and
    SpFlags both declare ``enabled``: the use is unresolved (a note), never read on either of them."""
    run = run_contract("sp-enabled-renamed", repo=names_drift)
    assert run.code == 0 and run.out["ok"], findings(run, "error")
    [result] = run.out["revs"]
    assert not [i for i in result["items"] if i["target"].endswith("Flags.enabled")]


def test_a_name_several_near_classes_declare_on_a_receiver_nothing_tells_is_unresolved():
    from c128patch.fit import contract_names as names
    from c128patch.fit.resolve import Use

    flags = {"sglang.srt.runtime_context.DpFlags": {"enabled": "sglang.srt.runtime_context.DpFlags"},
             "sglang.srt.runtime_context.SpFlags": {"enabled": "sglang.srt.runtime_context.SpFlags"}}
    pool = {"sglang.srt.mem_cache.pool.Pool": {"online": "sglang.srt.mem_cache.pool.Pool"}}
    uses = [Use(1, ["enabled"], kind="untyped", receiver=f"{BACKEND}:9:self.online_c128_dspark"),
            Use(2, ["online"], kind="untyped", receiver=f"{BACKEND}::p")]
    unresolved: dict = {}
    told = names.narrowed(names.Definers({**flags, **pool}, {**flags, **pool}), uses, unresolved)
    assert told == {(f"{BACKEND}:9:self.online_c128_dspark", "enabled"): [],
                    (f"{BACKEND}::p", "online"): ["sglang.srt.mem_cache.pool.Pool"]}
    assert unresolved == {(f"{BACKEND}:9:self.online_c128_dspark", "enabled"): sorted(flags)}


def test_an_untyped_receiver_is_not_attributed_to_a_class_that_happens_to_define_its_names(names_drift):
    """The rules' ``disagg`` (``Any``: ``get_disagg()``'s namespace) was read as a Scheduler (which assigns
    ``self.enable_pdmux`` and ``self.disaggregation_mode``); it is the config namespace ``disagg``: the lock records
    its leaves (kind ``config``) and a renamed leaf names the namespace, never Scheduler."""
    lock = (REPO_ROOT / "patches" / "contract.lock").read_text()
    assert "Scheduler" not in lock and "Flags.enabled" not in lock
    for target in ("disagg.enable_pdmux", "disagg.disaggregation_mode", "exec.overlap.enable_two_batch_overlap",
                   "exec.kernel.attention_backend", "device.device", "parallel.attn_dp_size"):
        assert re.search(rf"^config  {re.escape(target)}  {RULES}:\d+  python/sglang/srt/arg_groups/fields/\S+  sig=-$",
                         lock, re.M), target
    [error] = _errors("pdmux-renamed", names_drift)
    line = _line(RULES, "disagg.enable_pdmux")
    assert error.startswith(f"{RULES}:{line}: disagg.enable_pdmux: the config namespace disagg "
                            f"(sglang.srt.arg_groups.fields.disagg.Disagg, {DISAGG_FIELDS}:"), error
    assert "Scheduler" not in error and "an AttributeError at startup" in error, error
