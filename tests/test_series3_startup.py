"""Series III at startup: the env declaration, the pool configurator's online-c128 gate and
the memory pool's ring-size check, run from the patched and the unpatched release files."""

from __future__ import annotations

import ast
import importlib.util
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Optional

import pytest

from series3_tree import ENV, load_function, pretend_cuda_build, sglang_imports
from support import RELEASES

CONFIGURATOR = "sglang/srt/model_executor/pool_configurator.py"
MEMORY_POOL = "sglang/srt/mem_cache/deepseek_v4_memory_pool.py"
MTP_ENV = "SGLANG_EXPERIMENTAL_ONLINE_C128_MTP"
ONLINE_ENV = "SGLANG_OPT_USE_ONLINE_COMPRESS"


@pytest.fixture(params=RELEASES)
def trees(request, series_trees):
    """(release, patched, upstream) of one release (the session's shared trees)."""
    return (request.param, *series_trees[request.param])


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (ENV, MTP_ENV, ONLINE_ENV, "SGLANG_RAGGED_VERIFY_MODE"):
        monkeypatch.delenv(name, raising=False)
    if importlib.util.find_spec("torch") is not None:
        pretend_cuda_build(monkeypatch)


class Spec:
    def __init__(self, name: str):
        self.name = name

    def is_none(self) -> bool:
        return self.name == "NONE"

    def is_eagle(self) -> bool:
        return self.name in ("EAGLE", "EAGLE3")

    def is_dspark(self) -> bool:
        return self.name == "DSPARK"


class Log:
    def __init__(self):
        self.records = []

    def warning(self, *args) -> None:
        self.records.append(("warning", args))

    def info(self, *args) -> None:
        self.records.append(("info", args))


def test_env_declared_default_off(trees, monkeypatch: pytest.MonkeyPatch) -> None:
    _, patched, upstream = trees
    with sglang_imports(upstream):
        from sglang.srt.environ import Envs

        assert not hasattr(Envs, ENV)
    with sglang_imports(patched):
        from sglang.srt.environ import envs

        assert envs.SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK.get() is False
        monkeypatch.setenv(ENV, "1")
        assert envs.SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK.get() is True
        monkeypatch.setenv(ENV, "false")
        assert envs.SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK.get() is False


# -- the pool configurator's gate ------------------------------------------------------


def _online_gate(tree: Path) -> Callable:
    """The configurator's online-c128 gate as a function of (self, kvc) with the tree's real
    envs: the `if envs.SGLANG_OPT_USE_ONLINE_COMPRESS.get(): ...` block and, when patched,
    the DSPARK check the series puts right before it."""
    path = tree / CONFIGURATOR
    text = path.read_text()
    parents = {c: p for p in ast.walk(ast.parse(text)) for c in ast.iter_child_nodes(p)}
    block = next(
        n
        for n in parents
        if isinstance(n, ast.If)
        and ast.unparse(n.test) == "envs.SGLANG_OPT_USE_ONLINE_COMPRESS.get()"
        and "allow_experimental_online_c128_mtp" in ast.unparse(n)
    )
    body = parents[block].body
    first = next(i for i, n in enumerate(body) if n is block or "online_c128_dspark" in ast.unparse(n))
    lines = text.splitlines()[body[first].lineno - 1 : block.end_lineno]
    source = "def _gate(self, kvc):\n" + textwrap.indent(textwrap.dedent("\n".join(lines)), "    ")
    from sglang.srt.environ import envs

    namespace = {"envs": envs, "logger": Log()}
    exec(compile(source, str(path), "exec"), namespace)
    return namespace["_gate"], namespace["logger"]


def _run_gate(tree: Path, spec: str, banks: int, **launch) -> Optional[str]:
    """None when the gate accepts, else 'Type: message'. `launch`: the resolved config
    namespaces' fields (series3_standins.launch_namespaces)."""
    with sglang_imports(tree, **launch):
        gate, _ = _online_gate(tree)
        try:
            gate(SimpleNamespace(online_c128_mtp_max_draft_tokens=banks), SimpleNamespace(spec_algorithm=Spec(spec)))
        except (AssertionError, ValueError) as e:
            return f"{type(e).__name__}: {e}"
    return None


def _refusal(*lines: str) -> str:
    return f"ValueError: {ENV}=1 refuses this configuration:\n" + "\n".join(f"  - {x}" for x in lines)


def _rules(tree: Path, spec: str, banks: int, environ: dict, **launch) -> list:
    """What the rules module of `tree` refuses for this launch (the gate must say exactly that)."""
    from series3_standins import launch_namespaces

    with sglang_imports(tree):
        from sglang.srt.layers.attention.dsv4 import online_c128_dspark_rules as rules

        config = rules.config_from_context(**launch_namespaces(**launch), spec_algorithm=spec,
                                           num_draft_tokens=banks, environ=environ, platform="cuda")
        return rules.startup_refusals(config)


@pytest.mark.parametrize(
    "spec,mtp_env", [("NONE", False), ("EAGLE", False), ("EAGLE", True), ("DSPARK", False), ("DSPARK", True)]
)
def test_gate_env_unset_is_upstream(trees, monkeypatch, spec: str, mtp_env: bool) -> None:
    _, patched, upstream = trees
    monkeypatch.setenv(ONLINE_ENV, "1")
    if mtp_env:
        monkeypatch.setenv(MTP_ENV, "1")
    ours, theirs = _run_gate(patched, spec, 8), _run_gate(upstream, spec, 8)
    assert ours == theirs
    if spec == "DSPARK":
        assert theirs is not None and theirs.startswith("AssertionError")


def test_gate_env_set_admits_dspark(trees, monkeypatch) -> None:
    pytest.importorskip("torch")  # the overlay module the gate imports
    _, patched, upstream = trees
    monkeypatch.setenv(ONLINE_ENV, "1")
    monkeypatch.setenv(ENV, "1")
    with sglang_imports(patched):
        from sglang.srt.layers.attention.dsv4.online_c128_dspark_rules import MAX_VERIFY_WIDTH
    assert _run_gate(patched, "DSPARK", 8) is None
    assert _run_gate(patched, "DSPARK", MAX_VERIFY_WIDTH) is None
    assert _run_gate(upstream, "DSPARK", 8).startswith("AssertionError")


@pytest.mark.parametrize("banks", [0, 11, 1025])
def test_gate_refuses_a_bank_count_the_kernels_cannot_hold(trees, monkeypatch, banks: int) -> None:
    pytest.importorskip("torch")
    _, patched, _ = trees
    monkeypatch.setenv(ONLINE_ENV, "1")
    monkeypatch.setenv(ENV, "1")
    err = _run_gate(patched, "DSPARK", banks)
    assert err == _refusal(*_rules(patched, "DSPARK", banks, {ONLINE_ENV: "1", ENV: "1"}))
    assert f"verify width is {banks}" in err


@pytest.mark.parametrize("spec", ["NONE", "EAGLE"])
def test_gate_refuses_another_algorithm(trees, monkeypatch, spec: str) -> None:
    pytest.importorskip("torch")
    _, patched, _ = trees
    monkeypatch.setenv(ONLINE_ENV, "1")
    monkeypatch.setenv(ENV, "1")
    got = "not set" if spec == "NONE" else spec
    assert _run_gate(patched, spec, 8) == _refusal(
        f"--speculative-algorithm is {got}: {ENV}=1 runs online c128 through DSPARK target verify only; "
        f"use --speculative-algorithm DSPARK, or unset {ENV}"
    )


def test_gate_refuses_the_mtp_env_alongside(trees, monkeypatch) -> None:
    pytest.importorskip("torch")
    _, patched, _ = trees
    monkeypatch.setenv(ONLINE_ENV, "1")
    monkeypatch.setenv(ENV, "1")
    monkeypatch.setenv(MTP_ENV, "1")
    err = _run_gate(patched, "DSPARK", 8)
    assert err.startswith(_refusal()) and err.count("\n  - ") == 1 and f"  - {MTP_ENV}=1 is the EAGLE" in err


def test_gate_refuses_without_online_compress(trees, monkeypatch) -> None:
    """The DSPARK env alone: upstream's online block does not even run; the check before it
    refuses (there would be no online c128 state pool to bank)."""
    pytest.importorskip("torch")
    _, patched, upstream = trees
    monkeypatch.setenv(ENV, "1")
    assert _run_gate(upstream, "DSPARK", 8) is None
    err = _run_gate(patched, "DSPARK", 8)
    assert err == _refusal(*_rules(patched, "DSPARK", 8, {ENV: "1"}))
    assert "SGLANG_OPT_USE_ONLINE_COMPRESS is not set" in err


@pytest.mark.parametrize(
    "launch,words",
    [
        ({"enable_two_batch_overlap": True}, "--enable-two-batch-overlap: the target's attention backend"),
        ({"enable_pdmux": True}, "--enable-pdmux: PD-multiplexing"),
        ({"device": "npu"}, "--device npu: the online c128 DSPARK kernels are CUDA-only"),
        ({"attn_dp_size": 4}, "DP attention (attention DP size 4)"),
        ({"attn_cp_size": 2}, "--attn-cp-size 2: "),
        ({"pp_size": 2}, "--pp-size 2: "),
        ({"disaggregation_mode": "decode"}, "--disaggregation-mode decode: "),
        ({"dcp_size": 2}, "--dcp-size 2: decode context parallelism"),
        ({"prefill_attention_backend": "fa3"}, "prefill attention backend fa3 and decode attention backend dsv4 "
                                               "differ: the target's backend becomes a HybridAttnBackend"),
        ({"enable_two_batch_overlap": True, "enable_pdmux": True}, "--enable-pdmux: "),
    ],
    ids=["tbo", "pdmux", "device", "dp-attention", "cp", "pp", "disaggregation", "dcp", "hybrid-backend",
         "two-at-once"],
)
def test_gate_refuses_what_the_rules_refuse(trees, monkeypatch, launch: dict, words: str) -> None:
    """The live config (resolved namespaces, env, torch build) goes through the rules: the
    gate raises one ValueError with every line they give, in their order."""
    pytest.importorskip("torch")
    _, patched, _ = trees
    monkeypatch.setenv(ONLINE_ENV, "1")
    monkeypatch.setenv(ENV, "1")
    err = _run_gate(patched, "DSPARK", 8, **launch)
    lines = _rules(patched, "DSPARK", 8, {ONLINE_ENV: "1", ENV: "1"}, **launch)
    assert len(lines) == len(launch) and err == _refusal(*lines)
    assert words in err


@pytest.mark.parametrize("mode", ["cap-accept", "dynamic"])
def test_gate_refuses_a_ragged_verify_mode_not_shown(trees, monkeypatch, mode: str) -> None:
    """SGLANG_RAGGED_VERIFY_MODE is read from the live environment by the startup gate."""
    pytest.importorskip("torch")
    _, patched, _ = trees
    monkeypatch.setenv(ONLINE_ENV, "1")
    monkeypatch.setenv(ENV, "1")
    monkeypatch.setenv("SGLANG_RAGGED_VERIFY_MODE", mode)
    err = _run_gate(patched, "DSPARK", 8)
    assert err == _refusal(*_rules(patched, "DSPARK", 8,
                                   {ONLINE_ENV: "1", ENV: "1", "SGLANG_RAGGED_VERIFY_MODE": mode}))
    assert f"SGLANG_RAGGED_VERIFY_MODE={mode}: the controller is shown on static and compact" in err
    monkeypatch.setenv("SGLANG_RAGGED_VERIFY_MODE", "compact")
    assert _run_gate(patched, "DSPARK", 8) is None


def test_gate_refuses_a_rocm_build(trees, monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    _, patched, _ = trees
    monkeypatch.setenv(ONLINE_ENV, "1")
    monkeypatch.setenv(ENV, "1")
    monkeypatch.setattr(torch.version, "hip", "6.2")
    err = _run_gate(patched, "DSPARK", 8)
    assert err == _refusal("this is a rocm build: the online c128 DSPARK kernels are CUDA-only "
                           "(upstream's online c128 path is too)")


def test_gate_logs_dspark(trees, monkeypatch) -> None:
    pytest.importorskip("torch")
    _, patched, _ = trees
    monkeypatch.setenv(ONLINE_ENV, "1")
    monkeypatch.setenv(ENV, "1")
    with sglang_imports(patched):
        import logging

        from sglang.srt.layers.attention.dsv4 import online_c128_dspark

        seen = []
        handler = logging.Handler()
        handler.emit = seen.append
        online_c128_dspark.logger.addHandler(handler)
        gate, log = _online_gate(patched)
        gate(SimpleNamespace(online_c128_mtp_max_draft_tokens=8), SimpleNamespace(spec_algorithm=Spec("DSPARK")))
    assert any("DSPARK verify enabled" in r.getMessage() and "banks=8" in r.getMessage() for r in seen)
    # upstream's MTP line ("EAGLE topk=1 only") is not logged for the DSPARK path
    assert not [r for r in log.records if "EAGLE topk=1" in " ".join(map(str, r[1]))], log.records


# -- the memory pool's ring size -------------------------------------------------------


def _ring_size(tree: Path, online: bool) -> Callable:
    with sglang_imports(tree):
        from sglang.srt.environ import envs

        namespace = {"envs": envs, "ONLINE_C128": online}
        return load_function(tree / MEMORY_POOL, "get_compress_state_ring_size", namespace)


def _ring(fn: Callable, release: str, ratio: int, drafts: int):
    arg = drafts > 0 if release == "v0.5.20" else drafts  # 0.5.20 takes is_speculative
    try:
        return fn(ratio, arg)
    except AssertionError as e:
        return f"AssertionError: {e}"


@pytest.mark.parametrize("online", [True, False])
@pytest.mark.parametrize("envs_set", [(), (MTP_ENV,), (ENV,), (MTP_ENV, ENV)])
def test_ring_size(trees, monkeypatch, online: bool, envs_set) -> None:
    release, patched, upstream = trees
    for name in envs_set:
        monkeypatch.setenv(name, "1")
    ours, theirs = _ring_size(patched, online), _ring_size(upstream, online)
    for ratio in (4, 128):
        for drafts in (0, 8):
            got, want = _ring(ours, release, ratio, drafts), _ring(theirs, release, ratio, drafts)
            if online and ratio == 128 and drafts and envs_set == (ENV,):
                # The one changed answer: DSPARK's env admits speculative online c128.
                assert want == "AssertionError: online c128 does not support MTP"
                assert got == 1
            else:
                assert got == want
