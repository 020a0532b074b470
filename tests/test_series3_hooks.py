"""The series III hooks, run out of the patched release files against stand-ins: the
compressor's per-layer compress step and the backend's raw->full verify upgrade. With the
env unset they must make exactly upstream's calls; with it set, a DSPARK verify plan goes
to the controller."""

from __future__ import annotations

import functools
from pathlib import Path
from types import SimpleNamespace
from typing import Any, List, Tuple

import pytest

torch = pytest.importorskip("torch")

from series3_sim import STATE_DIM, FakeKVPool, ReferenceOps, fake_backend
from series3_tree import ENV, load_function, pretend_cuda_build, sglang_imports
from support import RELEASES

COMPRESSOR = "sglang/srt/layers/attention/dsv4/compressor_v2.py"
BACKEND = "sglang/srt/layers/attention/deepseek_v4_backend.py"
ONLINE_ENV = "SGLANG_OPT_USE_ONLINE_COMPRESS"
W, SLOTS, HEAD_DIM = 4, 5, 512


def _describe(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", value.data_ptr(), tuple(value.shape), value.dtype)
    if isinstance(value, (int, float, str, bool, type(None))):
        return value
    return ("object", id(value))


class Recorder:
    def __init__(self, result=None):
        self.calls: List[Tuple[str, dict]] = []
        self.result = result

    def named(self, name: str):
        def call(*args, **kwargs):
            record = {f"arg{i}": _describe(a) for i, a in enumerate(args)}
            record.update({k: _describe(v) for k, v in kwargs.items()})
            self.calls.append((name, record))
            return self.result(name, *args, **kwargs) if callable(self.result) else self.result

        return call


@pytest.fixture(params=RELEASES)
def trees(request, series_trees, monkeypatch: pytest.MonkeyPatch):
    """(patched, upstream) of one release (the session's shared trees)."""
    for name in (ENV, ONLINE_ENV, "SGLANG_EXPERIMENTAL_ONLINE_C128_MTP", "SGLANG_RAGGED_VERIFY_MODE"):
        monkeypatch.delenv(name, raising=False)
    pretend_cuda_build(monkeypatch)
    return series_trees[request.param]


def _controller(tree: Path, ops: ReferenceOps, monkeypatch, *, enabled: bool):
    if enabled:
        monkeypatch.setenv(ONLINE_ENV, "1")
        monkeypatch.setenv(ENV, "1")
    from sglang.srt.layers.attention.dsv4 import online_c128_dspark as mod

    monkeypatch.setattr(mod, "_ops", lambda: ops)
    states = [torch.zeros(((1 + W) * (SLOTS + 2), STATE_DIM)) for _ in range(2)]
    backend = fake_backend(FakeKVPool(states, SLOTS, W), width=W, device="cpu")
    controller = mod.OnlineC128DsparkController(backend)
    assert controller.enabled() is enabled
    return controller, states


# -- the compressor ------------------------------------------------------------------------


def _compress_inputs(ratio: int, state: torch.Tensor) -> dict:
    head_dim = 512 if ratio == 128 else 128
    return dict(
        kv_score_buffer=state if ratio == 128 else torch.zeros(16, 2 * 2 * head_dim),
        kv_score_input=torch.zeros(4, 2 * head_dim),
        ape=torch.zeros(ratio * head_dim * (2 if ratio == 4 else 1)),
        head_dim=head_dim,
        norm=SimpleNamespace(weight=torch.ones(head_dim), variance_epsilon=1e-6),
        freqs_cis_cache=torch.zeros(8),
        kv_cache=torch.zeros(8, dtype=torch.uint8),
        is_indexer=ratio == 4,
        rotate=ratio == 4,
        compress_ratio=ratio,
        page_size=64,
        out_loc=torch.zeros(4, dtype=torch.int32),
    )


_COMPRESSED = torch.zeros(4, HEAD_DIM)  # what the compress_forward stand-in returns


def _run_compress(tree: Path, self_obj, plan, inputs: dict):
    from sglang.srt.environ import envs  # the tree's own (inside sglang_imports)

    rec = Recorder(result=lambda name, *a, **k: _COMPRESSED if name == "compress_forward" else None)
    namespace = {
        "envs": envs,
        "compress_forward": rec.named("compress_forward"),
        "compress_norm_rope_store": rec.named("compress_norm_rope_store"),
        "_use_online_compress": lambda r: r == 128,
        "is_overlap_compress": lambda r: r == 4,
        "_is_hip": False,
        "torch": torch,
        "KVLayout": SimpleNamespace(V4="V4"),
    }
    fn = load_function(tree / COMPRESSOR, "CompressorBackendMixin._forward_compress_all_in_one", namespace)
    self_obj._get_paged_compress_metadata = lambda r: plan
    fn(self_obj, **inputs)
    return rec.calls


def test_compressor_env_unset_is_upstream(trees, monkeypatch) -> None:
    patched, upstream = trees
    plan = SimpleNamespace(compress_ratio=128)
    inputs = _compress_inputs(128, torch.zeros(40, STATE_DIM))
    with sglang_imports(upstream):
        want = _run_compress(upstream, SimpleNamespace(), plan, inputs)
    with sglang_imports(patched):
        ops = ReferenceOps()
        controller, _ = _controller(patched, ops, monkeypatch, enabled=False)
        assert _run_compress(patched, SimpleNamespace(), plan, inputs) == want
        got = _run_compress(patched, SimpleNamespace(online_c128_dspark=controller), plan, inputs)
        assert got == want and ops.calls == []
    assert [name for name, _ in want] == ["compress_forward", "compress_norm_rope_store"]


def test_compressor_routes_dspark_verify_plans(trees, monkeypatch) -> None:
    patched, _ = trees
    with sglang_imports(patched):
        ops = ReferenceOps()
        controller, states = _controller(patched, ops, monkeypatch, enabled=True)
        controller.prepare_verify(SimpleNamespace(spec_info=None), bs=1, verify_bs=1, ragged_layout=None)
        raw = SimpleNamespace(
            seq_lens=torch.tensor([3]), req_pool_indices=torch.tensor([1]),
            verify_lens=None, extend_start_loc=None,
        )
        plan = controller.build_verify_plan(raw, num_q_tokens=W)
        self_obj = SimpleNamespace(online_c128_dspark=controller)
        calls = _run_compress(patched, self_obj, plan, _compress_inputs(128, states[0]))
        # The fused verify compress ran instead of compress_forward ...
        assert [name for name, _ in calls] == ["compress_norm_rope_store"]
        name, args = ops.calls[-1]
        assert name == "verify" and args["plan"] is controller.owned_plan(plan)
        assert args["state"].data_ptr() == states[0].data_ptr()
        # ... and the store consumed its rows with the very same plan.
        store = calls[0][1]
        assert store["arg1"] == ("object", id(plan))
        assert store["arg0"][0] == "tensor" and store["arg0"][2] == (W, HEAD_DIM)

        # Any other c128 plan (prefill, decode) and the c4 layers stay upstream's.
        other = SimpleNamespace(compress_ratio=128)
        assert [n for n, _ in _run_compress(patched, self_obj, other, _compress_inputs(128, states[0]))] == [
            "compress_forward", "compress_norm_rope_store",
        ]
        spy = SimpleNamespace(compress_fn=lambda *a: pytest.fail("consulted for c4"))
        c4 = _run_compress(patched, SimpleNamespace(online_c128_dspark=spy), other, _compress_inputs(4, states[0]))
        assert [n for n, _ in c4] == ["compress_forward", "compress_norm_rope_store"]


def test_compressor_without_a_controller_fails_loudly_with_the_gate_on(trees, monkeypatch) -> None:
    """Plain attribute access: with the gate on, a backend that lacks the controller is an
    AttributeError at the first online c128 compress, never upstream's compress silently."""
    patched, _ = trees
    with sglang_imports(patched):
        _controller(patched, ReferenceOps(), monkeypatch, enabled=True)
        with pytest.raises(AttributeError, match="online_c128_dspark"):
            _run_compress(patched, SimpleNamespace(), SimpleNamespace(compress_ratio=128),
                          _compress_inputs(128, torch.zeros(40, STATE_DIM)))


# -- the backend's raw -> full verify upgrade ---------------------------------------------


class Metadata:
    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


def _run_upgrade(tree: Path, controller, raw):
    rec = Recorder(result=lambda name, *a, **k: ("plan", k.get("compress_ratio")))
    namespace = {
        "functools": functools,
        "torch": torch,
        "create_paged_compressor_data": rec.named("create"),
        "DSV4Metadata": Metadata,
    }
    fn = load_function(tree / BACKEND, "DeepseekV4AttnBackend.make_forward_metadata_from_raw_verify", namespace)
    pair = lambda **kw: (torch.zeros(4), torch.zeros(4))  # noqa: E731
    self_obj = SimpleNamespace(
        speculative_num_draft_tokens=W,
        _expand_prefill_casually_vectorized=pair,
        expand_extend_with_same_length=pair,
        make_core_attn_metadata=lambda **kw: SimpleNamespace(low_ratios=()),
        init_forward_metadata_indexer=lambda *a, **k: "indexer",
        has_c4=False,
        has_c128=True,
        MAX_SEQ_LEN_FOR_CAPTURE=1024,
        req_to_token=torch.zeros(8, 4, dtype=torch.int32),
        token_to_kv_pool=SimpleNamespace(),
    )
    if controller is not None:
        self_obj.online_c128_dspark = controller
    result = fn(self_obj, raw, 0)
    return result.kwargs["c128_compress_metadata"], [k["compress_ratio"] for _, k in rec.calls]


def _raw(ragged: bool, c128=None):
    seq = torch.tensor([130, 7], dtype=torch.int64)
    return SimpleNamespace(
        req_pool_indices=torch.tensor([1, 2]),
        seq_lens=seq,
        out_cache_loc=torch.zeros(2 * W, dtype=torch.int64),
        extend_seq_lens=torch.tensor([3, 2] if ragged else [W, W], dtype=torch.int32),
        c128_compress_metadata=c128,
        extend_start_loc=torch.tensor([0, 3], dtype=torch.int32) if ragged else None,
        verify_lens=torch.tensor([3, 2], dtype=torch.int32) if ragged else None,
        total_verify_tokens=2 * W if ragged else 0,
    )


@pytest.mark.parametrize("ragged", [False, True])
def test_verify_upgrade_env_unset_is_upstream(trees, monkeypatch, ragged: bool) -> None:
    patched, upstream = trees
    with sglang_imports(upstream):
        want = _run_upgrade(upstream, None, _raw(ragged))
    assert want[0] == ("plan", 128) and 128 in want[1]  # upstream's online planner
    with sglang_imports(patched):
        controller, _ = _controller(patched, ReferenceOps(), monkeypatch, enabled=False)
        assert _run_upgrade(patched, controller, _raw(ragged)) == want


@pytest.mark.parametrize("ragged", [False, True])
def test_verify_upgrade_takes_the_device_plan(trees, monkeypatch, ragged: bool) -> None:
    patched, _ = trees
    with sglang_imports(patched):
        ops = ReferenceOps()
        controller, _ = _controller(patched, ops, monkeypatch, enabled=True)
        raw = _raw(ragged)
        live = SimpleNamespace(bs=2, verify_lens=raw.verify_lens) if ragged else None
        controller.prepare_verify(
            SimpleNamespace(spec_info=SimpleNamespace(ragged_verify_layout=live)),
            bs=2, verify_bs=2, ragged_layout=raw if ragged else None,
        )
        c128, created = _run_upgrade(patched, controller, raw)
        assert 128 not in created  # no host-lens online planner
        assert controller.owned_plan(c128) is not None
        name, args = ops.calls[-1]
        assert name == "plan" and args["num_q_tokens"] == 2 * W
        assert args["seq_lens"].tolist() == [130, 7]  # lengths before verify
        assert args["verify_lens"].tolist() == ([3, 2] if ragged else [W, W])
        # A prebuilt c128 plan on the raw metadata is left alone.
        prebuilt = object()
        assert _run_upgrade(patched, controller, _raw(ragged, c128=prebuilt))[0] is prebuilt


# -- DSV4Metadata.copy_ (the in-place metadata copy) -------------------------------------

METADATA = "sglang/srt/layers/attention/dsv4/metadata.py"
COMPRESS = "sglang/kernels/ops/attention/dsv4/compress.py"


class _RealPlanOps(ReferenceOps):
    """ReferenceOps whose verify plan carries upstream's own CompressorPrefillPlan type."""

    def __init__(self, plan_type: type) -> None:
        super().__init__()
        self.plan_type = plan_type

    def dspark_verify_plan(self, *args, **kwargs):
        import dataclasses

        plan = super().dspark_verify_plan(*args, **kwargs)
        return dataclasses.replace(plan, prefill_plan=self.plan_type(*plan.prefill_plan))


def _metadata_copy(tree: Path):
    """The release's DSV4Metadata.copy_ with its real maybe_copy_inplace, and a metadata
    factory holding every field copy_ touches (None but the core and the c128 plan)."""
    import ast

    from series3_tree import function_node, load_with_globals

    ns: dict = {}
    load_function(tree / METADATA, "maybe_copy_inplace", ns)
    copy_ = load_with_globals(tree / BACKEND, "DSV4Metadata.copy_", ns)
    fields = {n.attr for n in ast.walk(function_node(tree / BACKEND, "DSV4Metadata.copy_"))
              if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in ("self", "other")}

    def metadata(c128):
        md = SimpleNamespace(**dict.fromkeys(fields))
        md.core_attn_metadata = SimpleNamespace(copy_=lambda other: None)
        md.c128_compress_metadata = c128
        return md

    return copy_, metadata


def _plans(tree: Path, monkeypatch):
    """(upstream CompressorPrefillPlan type, a DSPARK verify plan as the controller hands it
    to upstream code)."""
    from series3_tree import load_class

    plan_type = load_class(tree / COMPRESS, "CompressorPrefillPlan",
                           {"NamedTuple": __import__("typing").NamedTuple, "Optional": __import__("typing").Optional,
                            "torch": torch})
    controller, _ = _controller(tree, _RealPlanOps(plan_type), monkeypatch, enabled=True)
    controller.prepare_verify(SimpleNamespace(spec_info=None), bs=1, verify_bs=1, ragged_layout=None)
    raw = SimpleNamespace(seq_lens=torch.tensor([3]), req_pool_indices=torch.tensor([1]),
                          verify_lens=None, extend_start_loc=None)
    return plan_type, controller.build_verify_plan(raw, num_q_tokens=W)


def _upstream_plan(plan_type: type):
    return plan_type(128, torch.zeros((W, 16), dtype=torch.uint8), torch.zeros((W, 16), dtype=torch.uint8), None)


def test_metadata_copy_refuses_a_captured_dspark_plan(trees, monkeypatch) -> None:
    patched, _ = trees
    with sglang_imports(patched):
        copy_, metadata = _metadata_copy(patched)
        plan_type, dspark = _plans(patched, monkeypatch)
        assert isinstance(dspark, plan_type)  # upstream's type, so upstream code takes it
        with pytest.raises(RuntimeError, match="an in-place copy of a DSPARK verify plan"):
            copy_(metadata(dspark), metadata(dspark))


def test_metadata_copy_between_a_dspark_and_an_upstream_plan_fails(trees, monkeypatch) -> None:
    """Either way round, upstream's own type check (maybe_copy_inplace) stops the copy."""
    patched, _ = trees
    with sglang_imports(patched):
        copy_, metadata = _metadata_copy(patched)
        plan_type, dspark = _plans(patched, monkeypatch)
        for dst, src in ((dspark, _upstream_plan(plan_type)), (_upstream_plan(plan_type), dspark)):
            before = bytes(dst.plan_c.flatten().tolist())
            with pytest.raises(AssertionError):
                copy_(metadata(dst), metadata(src))
            assert bytes(dst.plan_c.flatten().tolist()) == before


def test_metadata_copy_of_upstream_plans_is_upstream(trees, monkeypatch) -> None:
    patched, _ = trees
    monkeypatch.setenv(ONLINE_ENV, "1")
    monkeypatch.setenv(ENV, "1")
    with sglang_imports(patched):
        copy_, metadata = _metadata_copy(patched)
        plan_type, _ = _plans(patched, monkeypatch)
        dst, src = _upstream_plan(plan_type), _upstream_plan(plan_type)
        src.plan_c.fill_(7)
        copy_(metadata(dst), metadata(src))
        assert torch.equal(dst.plan_c, src.plan_c)


# -- the verify metadata preps (graph replay and eager) -----------------------------------


def _verify_backend(tree: Path, ops: ReferenceOps, monkeypatch, *, max_bs: int = 6):
    from series3_backend import VerifyBackend
    from series3_sim import Spec

    monkeypatch.setenv(ONLINE_ENV, "1")
    monkeypatch.setenv(ENV, "1")
    monkeypatch.setenv("SGLANG_RAGGED_VERIFY_MODE", "compact")
    from sglang.srt.layers.attention.dsv4 import online_c128_dspark as mod

    monkeypatch.setattr(mod, "_ops", lambda: ops)
    states = [torch.zeros(((1 + W) * (SLOTS + 2), STATE_DIM)) for _ in range(2)]
    return VerifyBackend(tree, controller_cls=mod.OnlineC128DsparkController, pool=FakeKVPool(states, SLOTS, W),
                         width=W, max_bs=max_bs, device="cpu", spec_algorithm=Spec(),
                         req_to_token=torch.zeros((SLOTS + 8, 1024), dtype=torch.int32))


def _plan_args(ops: ReferenceOps) -> dict:
    name, args = ops.calls[-1]
    assert name == "plan"
    return args


@pytest.mark.parametrize("prep", ["replay", "eager"])
def test_compact_prep_hands_the_controller_real_rows_and_zero_padding(trees, monkeypatch, prep: str) -> None:
    """The release's own prep pads the live layout to the bucket (`_resolve_verify_layout`)
    and the controller plans only the real rows; padding rows get 0, the upgrade takes the
    device plan (no host-lens planner)."""
    patched, _ = trees
    with sglang_imports(patched):
        from sglang.srt.speculative import ragged_verify

        from series3_sim import padded_layout

        ops = ReferenceOps()
        backend = _verify_backend(patched, ops, monkeypatch)
        live, _ = padded_layout(ragged_verify, [2, 3], 4, 12, "cpu")
        fb = backend.forward_batch(seq_lens=torch.tensor([130, 7, 1, 1]), req_pool_indices=torch.tensor([1, 2, 0, 0]),
                                   out_cache_loc=torch.zeros(12, dtype=torch.int64), draft_tokens=5, live_layout=live)
        raw = backend.replay_prep(fb, in_capture=True) if prep == "replay" else backend.eager_prep(fb)
        assert raw.verify_lens.tolist() == [2, 3, 4, 3]  # upstream's padded layout (full coverage)
        plan = backend.upgrade(raw).c128_compress_metadata
        args = _plan_args(ops)
        assert args["verify_lens"].tolist() == [2, 3, 0, 0]
        assert args["extend_start_loc"].tolist() == [0, 2, 5, 9] and args["num_q_tokens"] == 12
        assert args["seq_lens"].tolist() == [130, 7, 1, 1]
        assert backend.online_c128_dspark.owned_plan(plan) is not None and 128 not in backend.created


def test_static_replay_of_an_empty_bucket_builds_a_fresh_empty_plan(trees, monkeypatch) -> None:
    """The static bucket captured with 3 real rows, replayed with none (verify_bs == 0):
    the captured raw metadata is refreshed in place and every row plans 0 tokens; nothing
    of the last step is reused (upstream's MTP path would reuse it: study 3.8(2))."""
    patched, _ = trees
    with sglang_imports(patched):
        ops = ReferenceOps()
        backend = _verify_backend(patched, ops, monkeypatch)

        def fb(slots, seqs):
            pad = 4 - len(slots)
            return backend.forward_batch(seq_lens=torch.tensor(seqs + [1] * pad),
                                         req_pool_indices=torch.tensor(slots + [0] * pad),
                                         out_cache_loc=torch.zeros(4 * W, dtype=torch.int64),
                                         draft_tokens=len(slots) * W)

        captured = backend.replay_prep(fb([1, 2, 3], [9, 10, 11]), in_capture=True)
        backend.upgrade(captured)
        assert _plan_args(ops)["verify_lens"].tolist() == [W, W, W, 0]
        assert backend.replay_prep(fb([], [])) is captured  # the bucket's metadata, refreshed
        assert captured.seq_lens.tolist() == [1, 1, 1, 1] and captured.req_pool_indices.tolist() == [0] * 4
        backend.upgrade(captured)
        args = _plan_args(ops)
        assert args["verify_lens"].tolist() == [0] * 4 and args["req_pool_indices"].tolist() == [0] * 4


def test_stand_in_pools_answer_only_what_the_release_pools_have(trees) -> None:
    """What the controller reads of the KV pool and its state pools (series3_sim.FakeKVPool /
    FakeStatePool stand in for them) exists in the release's DeepSeekV4TokenToKVPool and
    CompressStatePool."""
    import ast

    patched, _ = trees

    def class_members(rel: str, name: str) -> set:
        tree = ast.parse((patched / rel).read_text())
        cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)
        members = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
        members |= {t.attr for n in ast.walk(cls) for t in getattr(n, "targets", [getattr(n, "target", None)])
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
        return members

    pool = class_members("sglang/srt/mem_cache/deepseek_v4_memory_pool.py", "DeepSeekV4TokenToKVPool")
    assert {"compress_state_pools", "get_online_c128_mtp_max_draft_tokens", "get_online_c128_mtp_state_slot_offset",
            "get_online_c128_state_num_req_slots"} <= pool
    state = class_members("sglang/srt/mem_cache/deepseek_v4_compress_state.py", "CompressStatePool")
    assert {"ratio", "online", "kv_score_buffer"} <= state
