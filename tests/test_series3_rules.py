"""online_c128_dspark_rules.py: what online c128 under DSPARK refuses at startup, one line per
reason, and how the config is derived (launch arguments, the live config namespaces), checked
against every release's own CLI, config namespaces and env parsing."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from series3_tree import ENV, sglang_imports
from series3_upstream_cli import (
    RUNTIME_CONTEXT,
    Recorder,
    cli_flags,
    flag_names,
    module_functions,
    namespace_fields,
    parallel_fields,
    release_files,
)
from support import RELEASES, REPO_ROOT

RULES_FILE = REPO_ROOT / "overlay/sglang/srt/layers/attention/dsv4/online_c128_dspark_rules.py"
INSTALLED = "sglang/srt/layers/attention/dsv4/online_c128_dspark_rules.py"
KERNEL = REPO_ROOT / "csrc/deepseek_v4/online_c128_dspark.cuh"


def load_by_path(path: Path):
    """As `c128patch doctor` loads it: by file path, not registered in sys.modules."""
    spec = importlib.util.spec_from_file_location("c128_rules_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rules = load_by_path(RULES_FILE)

# A launch the rules accept: gate, online compress, DSPARK, defaults otherwise.
RUNNABLE = {"dspark_gate": True, "online_compress": True, "speculative_algorithm": "DSPARK"}

# rule name -> (config overrides of RUNNABLE that trigger it alone, words its line says)
CASES = {
    "online-compress": ({"online_compress": False}, "SGLANG_OPT_USE_ONLINE_COMPRESS is not set"),
    "speculative-algorithm": ({"speculative_algorithm": "EAGLE"}, "--speculative-algorithm is EAGLE"),
    "online-c128-mtp": ({"online_c128_mtp": True}, "SGLANG_EXPERIMENTAL_ONLINE_C128_MTP=1"),
    "state-banks": ({"num_draft_tokens": rules.MAX_VERIFY_WIDTH + 1}, f"verify width is {rules.MAX_VERIFY_WIDTH + 1}"),
    "ragged-verify-mode": ({"ragged_verify_mode": "cap-accept"}, "SGLANG_RAGGED_VERIFY_MODE=cap-accept"),
    "two-batch-overlap": ({"enable_two_batch_overlap": True}, "--enable-two-batch-overlap: "),
    "pdmux": ({"enable_pdmux": True}, "--enable-pdmux: "),
    "device": ({"device": "npu"}, "--device npu: "),
    "platform": ({"platform": "rocm"}, "this is a rocm build"),
    "dp-attention": ({"attn_dp_size": 2}, "DP attention (attention DP size 2)"),
    "context-parallel": ({"attn_cp_size": 2}, "--attn-cp-size 2: "),
    "decode-context-parallel": ({"dcp_size": 2}, "--dcp-size 2: "),
    "pipeline-parallel": ({"pp_size": 2}, "--pp-size 2: "),
    "disaggregation": ({"disaggregation_mode": "decode"}, "--disaggregation-mode decode: "),
    "hybrid-attention-backend": ({"prefill_attention_backend": "fa3", "decode_attention_backend": "flashinfer"},
                                 "prefill attention backend fa3 and decode attention backend flashinfer differ"),
}


# -- the module ---------------------------------------------------------------------


def test_rules_module_is_stdlib_only() -> None:
    tree = ast.parse(RULES_FILE.read_text())
    imported = {
        (a.name if isinstance(n, ast.Import) else n.module).split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    }
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


@pytest.mark.parametrize("release", RELEASES)
def test_installed_rules_load_by_path_without_sglang_or_torch(release: str, series_trees) -> None:
    patched, _ = series_trees[release]
    installed = patched / INSTALLED
    assert installed.read_bytes() == RULES_FILE.read_bytes()
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('r', {str(installed)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "c = m.config_from_args(['--speculative-algorithm', 'DSPARK', '--enable-pdmux'],\n"
        "    {'SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK': '1', 'SGLANG_OPT_USE_ONLINE_COMPRESS': '1'})\n"
        "print(len(m.startup_refusals(c)))\n"
        "assert not [k for k in sys.modules if k.split('.')[0] in ('torch', 'sglang')]\n"
    )
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"


def test_bank_limit_matches_kernel() -> None:
    assert KERNEL.is_file(), f"{KERNEL.relative_to(REPO_ROOT)} is gone: the rules' bank limit is its kMaxBanks"
    m = re.search(r"kMaxBanks\s*=\s*(\d+)", KERNEL.read_text())
    assert m, "kMaxBanks not found in the kernel"
    assert rules.MAX_BANKS == int(m.group(1))


# -- startup_refusals ------------------------------------------------------------------


def test_runnable_launch_is_not_refused() -> None:
    assert rules.startup_refusals(RUNNABLE) == []
    assert rules.startup_refusals({**RUNNABLE, "num_draft_tokens": rules.MAX_VERIFY_WIDTH, "platform": "cuda",
                                   "device": "cuda:1", "ragged_verify_mode": "compact",
                                   "prefill_attention_backend": "dsv4", "decode_attention_backend": "dsv4"}) == []


def test_bank_message_names_the_lower_c4_ring_cap() -> None:
    """The c4 ring (upstream's cap, 10 draft tokens) binds long before the kernels' 1024 banks;
    the refusal says so, and a width between the two is refused at startup, not by upstream's
    ring assert later."""
    assert rules.MAX_VERIFY_WIDTH == rules.C4_RING_DRAFT_CAP == 10 < rules.MAX_BANKS
    (line,) = rules.startup_refusals({**RUNNABLE, "num_draft_tokens": 64})
    assert "must be 1..10" in line and "c4 compress state ring" in line and "1024 state banks" in line


@pytest.mark.parametrize("release", RELEASES)
def test_c4_ring_cap_is_the_releases(release: str, sglang_release_repo) -> None:
    """C4_RING_DRAFT_CAP is get_compress_state_write_pad(4, speculative c4 ring size) of the release."""
    from c128patch.git import Git

    src = Git(git_dir=sglang_release_repo).blob(release,
                                                "python/sglang/srt/mem_cache/deepseek_v4_memory_pool.py").decode()
    assert "return 16 if compress_ratio == 4 else 256" in src
    assert "window_size = compress_ratio * (2 if compress_ratio == 4 else 1)" in src
    assert "return ring_size - window_size + 2 if ring_size > window_size else 0" in src
    assert rules.C4_RING_DRAFT_CAP == 16 - 4 * 2 + 2


def test_gate_off_refuses_nothing() -> None:
    everything = {k: v for case, _ in CASES.values() for k, v in case.items()}
    assert rules.startup_refusals({**RUNNABLE, **everything, "dspark_gate": False}) == []
    assert rules.startup_refusals({}) == []


def test_every_rule_has_a_case() -> None:
    assert [r.name for r in rules.RULES] == list(CASES)


@pytest.mark.parametrize("name", list(CASES))
def test_each_rule_refuses_its_configuration_with_one_line(name: str) -> None:
    overrides, words = CASES[name]
    lines = rules.startup_refusals({**RUNNABLE, **overrides})
    assert len(lines) == 1 and words in lines[0], lines
    assert "\n" not in lines[0]


def test_refusals_come_in_rule_order() -> None:
    config = {**RUNNABLE, **CASES["pdmux"][0], **CASES["online-compress"][0], **CASES["pipeline-parallel"][0]}
    lines = rules.startup_refusals(config)
    assert [w for w in ("SGLANG_OPT_USE", "--enable-pdmux", "--pp-size") if any(w in x for x in lines)] == [
        "SGLANG_OPT_USE", "--enable-pdmux", "--pp-size"]
    assert lines[0].startswith("SGLANG_OPT_USE") and lines[-1].startswith("--pp-size")


def test_speculative_algorithm_unset_is_named() -> None:
    (line,) = rules.startup_refusals({**RUNNABLE, "speculative_algorithm": None})
    assert line.startswith("--speculative-algorithm is not set: ")


@pytest.mark.parametrize("width", [0, -1])
def test_empty_bank_range_is_refused(width: int) -> None:
    (line,) = rules.startup_refusals({**RUNNABLE, "num_draft_tokens": width})
    assert f"verify width is {width}" in line


def test_unknown_key_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown online c128 DSPARK config keys: enable_tbo"):
        rules.startup_refusals({**RUNNABLE, "enable_tbo": True})


@pytest.mark.parametrize(
    "key,value,expected",
    [("pp_size", True, "int"), ("enable_pdmux", "yes", "bool"), ("device", 3, "str or None")],
)
def test_wrong_type_is_an_error(key: str, value, expected: str) -> None:
    with pytest.raises(ValueError, match=f"config {key}={value!r}: expected {expected}$"):
        rules.startup_refusals({**RUNNABLE, key: value})


# -- config_from_args -------------------------------------------------------------------

GATED_ENV = {ENV: "1", "SGLANG_OPT_USE_ONLINE_COMPRESS": "1"}


@pytest.mark.parametrize(
    "argv,key,value",
    [
        (["--speculative-algorithm", "dspark"], "speculative_algorithm", "DSPARK"),
        (["--speculative-num-draft-tokens", "8"], "num_draft_tokens", 8),
        (["--speculative-dspark-block-size", "7"], "num_draft_tokens", 8),
        (["--speculative-num-draft-tokens=5", "--speculative-dspark-block-size", "7"], "num_draft_tokens", 5),
        (["--enable-two-batch-overlap"], "enable_two_batch_overlap", True),
        (["--enable-pdmux"], "enable_pdmux", True),
        (["--device", "xpu"], "device", "xpu"),
        (["--attn-dp-size", "4"], "attn_dp_size", 4),
        (["--attention-data-parallel-size", "2"], "attn_dp_size", 2),
        (["--dp-size", "4", "--enable-dp-attention"], "attn_dp_size", 4),
        (["--dp-size", "4"], "attn_dp_size", 1),  # DP replicas, not DP attention
        (["--attn-cp-size", "2"], "attn_cp_size", 2),
        (["--dcp-size", "2"], "dcp_size", 2),
        (["--pipeline-parallel-size", "2"], "pp_size", 2),
        (["--disaggregation-mode", "prefill"], "disaggregation_mode", "prefill"),
        (["--attention-backend", "dsv4"], "decode_attention_backend", "dsv4"),
        (["--attention-backend", "dsv4", "--prefill-attention-backend", "fa3"], "prefill_attention_backend", "fa3"),
        (["--attention-backend", "dsv4", "--prefill-attention-backend", "fa3"], "decode_attention_backend", "dsv4"),
        (["--decode-attention-backend", "flashinfer"], "decode_attention_backend", "flashinfer"),
    ],
)
def test_config_from_args_reads_the_flag(argv, key: str, value) -> None:
    config = rules.config_from_args(["--model-path", "m", *argv, "--tp", "8"], GATED_ENV)
    assert config[key] == value
    assert rules.normalized(config) == config  # every key, right types


def test_config_from_args_defaults_are_an_upstream_launch() -> None:
    config = rules.config_from_args([], {})
    assert config == {key: default for key, (_, default) in rules.KEYS.items()}


@pytest.mark.parametrize(
    "environ,key,value",
    [
        ({ENV: "true"}, "dspark_gate", True),
        ({ENV: "0"}, "dspark_gate", False),
        ({"SGLANG_OPT_USE_ONLINE_COMPRESS": "Y"}, "online_compress", True),
        ({"SGLANG_EXPERIMENTAL_ONLINE_C128_MTP": "yes"}, "online_c128_mtp", True),
        ({"SGLANG_RAGGED_VERIFY_MODE": "compact"}, "ragged_verify_mode", "compact"),
    ],
)
def test_config_from_args_reads_the_environment(environ, key: str, value) -> None:
    assert rules.config_from_args([], environ)[key] == value


def test_config_file_is_refused_not_skipped() -> None:
    with pytest.raises(ValueError, match="--config serve.yaml: options in a config file are not read here"):
        rules.config_from_args(["--config", "serve.yaml"], GATED_ENV)


def test_bad_flag_value_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="cannot read the launch arguments: argument --pp-size"):
        rules.config_from_args(["--pp-size", "two"], GATED_ENV)


def test_bad_env_boolean_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=f'{ENV}="maybe" is not a valid boolean value'):
        rules.config_from_args([], {ENV: "maybe"})


# -- checked against each release -----------------------------------------------------

# the upstream field each key of config_from_args comes from
ARG_FIELDS = {
    "speculative_algorithm": "speculative_algorithm",
    "speculative_num_draft_tokens": "num_draft_tokens",
    "speculative_dspark_block_size": "num_draft_tokens",
    "enable_two_batch_overlap": "enable_two_batch_overlap",
    "enable_pdmux": "enable_pdmux",
    "device": "device",
    "dp_size": "attn_dp_size",
    "enable_dp_attention": "attn_dp_size",
    "attn_dp_size": "attn_dp_size",
    "attn_cp_size": "attn_cp_size",
    "dcp_size": "dcp_size",
    "pp_size": "pp_size",
    "disaggregation_mode": "disaggregation_mode",
    "attention_backend": "prefill_attention_backend",
    "prefill_attention_backend": "prefill_attention_backend",
    "decode_attention_backend": "decode_attention_backend",
    "config": None,
}


@pytest.fixture(scope="module")
def release_sources(sglang_release_repo):
    return {tag: release_files(sglang_release_repo, tag) for tag in RELEASES}


def test_every_field_the_rules_read_is_known() -> None:
    assert {dest for _, dest, _ in rules.LAUNCH_FLAGS} == set(ARG_FIELDS)


@pytest.mark.parametrize("release", RELEASES)
def test_each_release_flag_of_those_fields_is_parsed_alike(release: str, release_sources) -> None:
    """Every CLI spelling (aliases too) a release has for the fields the rules read is one
    `config_from_args` reads, as a switch where upstream's is one; upstream's default of
    each is what the rules assume."""
    flags = cli_flags(release_sources[release])
    ours = {dest: (names, kind) for names, dest, kind in rules.LAUNCH_FLAGS}
    for dest in ARG_FIELDS:
        if dest not in flags:
            assert dest == "attn_dp_size" and release in ("v0.5.20", "v0.5.21"), (release, dest)
            continue
        names, kind = ours[dest]
        assert set(flags[dest].names) <= set(names), (release, dest, flags[dest].names)
        assert flags[dest].is_switch == (kind == "flag"), (release, dest)
    defaults = rules.config_from_args([], {})
    assert flags["disaggregation_mode"].default == defaults["disaggregation_mode"]
    for dest in ("pp_size", "attn_cp_size", "dcp_size"):
        assert flags[dest].default == defaults[dest], (release, dest)
    assert flags["device"].default is defaults["device"] is None


def test_every_flag_parsed_exists_in_a_release(release_sources) -> None:
    known = set().union(*(flag_names(cli_flags(src).values()) for src in release_sources.values()))
    ours = {n for names, _, _ in rules.LAUNCH_FLAGS for n in names}
    assert ours <= known, ours - known


@pytest.mark.parametrize("release", RELEASES)
def test_config_from_context_reads_what_the_release_publishes(release: str, release_sources) -> None:
    """Each attribute `config_from_context` reads from the live namespaces is a field of
    that namespace in the release (or, for get_parallel(), a name it answers), and the
    runtime_context getters the controller calls exist."""
    src = release_sources[release]
    reads: set = set()
    values = {"exec.overlap.enable_two_batch_overlap": False, "disagg.enable_pdmux": False,
              "disagg.disaggregation_mode": "null", "device.device": "cuda", "parallel.attn_dp_size": 1,
              "parallel.attn_cp_size": 1, "parallel.dcp_size": 1, "parallel.pp_size": 1,
              "exec.kernel.attention_backend": "dsv4", "exec.kernel.prefill_attention_backend": "dsv4",
              "exec.kernel.decode_attention_backend": "dsv4"}
    ns = {name: Recorder(path, reads, values.get) for name, path in
          (("exec_", "exec"), ("disagg", "disagg"), ("device", "device"), ("parallel", "parallel"))}
    config = rules.config_from_context(**ns, spec_algorithm="DSPARK", num_draft_tokens=8, environ={}, platform="cuda")
    assert rules.startup_refusals({**config, "dspark_gate": True, "online_compress": True}) == []
    assert reads == set(values)
    fields = namespace_fields(src)
    for path in reads:
        namespace, field = path.rsplit(".", 1)
        known = parallel_fields(src) if namespace == "parallel" else fields[namespace]
        assert field in known, (release, path)
    assert {"get_exec", "get_disagg", "get_device", "get_parallel"} <= module_functions(src[RUNTIME_CONTEXT])


@pytest.mark.parametrize("release", RELEASES)
def test_env_booleans_parse_as_the_release_parses_them(release: str, series_trees) -> None:
    _, upstream = series_trees[release]
    values = ["1", "0", "true", "False", "YES", "no", "y", "N", "on", "", " 1"]
    with sglang_imports(upstream):
        from sglang.srt.environ import EnvBool

        def theirs(value: str):
            try:
                return EnvBool(False).parse(value)
            except ValueError:
                return "error"

        want = [theirs(v) for v in values]

    def ours(value: str):
        try:
            return rules.env_bool({ENV: value}, ENV)
        except ValueError:
            return "error"

    assert [ours(v) for v in values] == want
    assert rules.env_bool({}, ENV) is False


def test_algorithm_enum_names_are_read() -> None:
    import enum

    from series3_standins import launch_namespaces

    Spec = enum.Enum("SpeculativeAlgorithm", "NONE EAGLE DSPARK")
    for member, want in ((Spec.DSPARK, "DSPARK"), (Spec.NONE, None), (None, None), ("eagle", "EAGLE")):
        config = rules.config_from_context(**launch_namespaces(), spec_algorithm=member, num_draft_tokens=None,
                                           environ={}, platform=None)
        assert config["speculative_algorithm"] == want
