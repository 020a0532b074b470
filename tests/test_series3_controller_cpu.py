"""OnlineC128DsparkController on the CPU: gating, the arguments it hands the series II
kernel API (recorded by a torch model of that API), and a simulated multi-step DSPARK
decode checked against a float64 reference."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from series3_sim import (
    HEAD_DIM,
    STATE_DIM,
    FakeKVPool,
    ReferenceOps,
    SimConfig,
    Simulation,
    fake_backend,
    run_decode,
)
from series3_tree import ENV, pretend_cuda_build, sglang_imports
from support import RELEASES

ONLINE_ENV = "SGLANG_OPT_USE_ONLINE_COMPRESS"
MTP_ENV = "SGLANG_EXPERIMENTAL_ONLINE_C128_MTP"
KERNEL_OPS = "sglang.kernels.ops.attention.dsv4.online_c128_dspark"
W, SLOTS = 8, 6


@pytest.fixture(params=RELEASES)
def patched(request, series_trees) -> Path:
    return series_trees[request.param][0]


@pytest.fixture
def mod(patched: Path, monkeypatch: pytest.MonkeyPatch):
    """The controller module, imported from the patched tree of the release (a default
    single-GPU launch in the stand-in runtime context)."""
    for name in (ENV, ONLINE_ENV, MTP_ENV, "SGLANG_RAGGED_VERIFY_MODE"):
        monkeypatch.delenv(name, raising=False)
    pretend_cuda_build(monkeypatch)
    with sglang_imports(patched):
        from sglang.srt.layers.attention.dsv4 import online_c128_dspark

        assert KERNEL_OPS not in sys.modules  # the kernel ops load lazily
        yield online_c128_dspark


@pytest.fixture
def ragged(mod):
    """The release's own ragged verify layouts (speculative/ragged_verify.py)."""
    from sglang.srt.speculative import ragged_verify

    return ragged_verify


@pytest.fixture
def ops(mod, monkeypatch: pytest.MonkeyPatch) -> ReferenceOps:
    ops = ReferenceOps()
    monkeypatch.setattr(mod, "_ops", lambda: ops)
    return ops


def _enable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ONLINE_ENV, "1")
    monkeypatch.setenv(ENV, "1")


def _backend(layers: int = 2, **kwargs):
    states = [torch.zeros(((1 + W) * (SLOTS + 2), STATE_DIM)) for _ in range(layers)]
    return fake_backend(FakeKVPool(states, SLOTS, W), width=W, device="cpu", **kwargs), states


def _raw(seq, rids, verify_lens=None, extend_start_loc=None):
    return SimpleNamespace(
        seq_lens=torch.tensor(seq, dtype=torch.int32),
        req_pool_indices=torch.tensor(rids, dtype=torch.int64),
        verify_lens=verify_lens,
        extend_start_loc=extend_start_loc,
    )


def _fb(live=None):
    return SimpleNamespace(spec_info=SimpleNamespace(ragged_verify_layout=live))


def _i32(*values):
    return torch.tensor(values, dtype=torch.int32)


# -- gating ------------------------------------------------------------------------------


@pytest.mark.parametrize("envs_set", [(), (ONLINE_ENV,)])
def test_disabled_does_nothing(mod, monkeypatch, envs_set) -> None:
    for name in envs_set:
        monkeypatch.setenv(name, "1")
    monkeypatch.setattr(mod, "_ops", lambda: pytest.fail("kernel ops touched while disabled"))
    backend, _ = _backend()
    controller = mod.OnlineC128DsparkController(backend)
    assert controller.enabled() is False
    controller.prepare_verify(_fb(), bs=4, verify_bs=4, ragged_layout=None)
    assert controller._verify_lens is None and controller._uniform_start_loc is None
    assert controller.build_verify_plan(_raw([5] * 4, [1, 2, 3, 4]), num_q_tokens=4 * W) is None
    sentinel = object()
    assert controller.compress_fn(object(), sentinel) is sentinel
    assert controller.owned_plan(object()) is None
    controller.commit(
        seq_lens=torch.ones(2, dtype=torch.int64),
        new_seq_lens=torch.full((2,), 3, dtype=torch.int64),
        req_pool_indices=torch.tensor([1, 2]),
    )
    assert controller._states is None  # not even the pool was read


def test_gate_without_online_compress_is_refused_at_construction(mod, monkeypatch) -> None:
    monkeypatch.setenv(ENV, "1")
    with pytest.raises(ValueError,
                       match=f"{ENV}=1 refuses this configuration:\n  - SGLANG_OPT_USE_ONLINE_COMPRESS is not set"):
        mod.OnlineC128DsparkController(_backend()[0])


def test_disabled_on_the_draft_runner(mod, monkeypatch) -> None:
    _enable(monkeypatch)
    assert mod.OnlineC128DsparkController(_backend(draft=True)[0]).enabled() is False
    assert mod.OnlineC128DsparkController(_backend()[0]).enabled() is True


def test_another_algorithm_is_refused_at_construction(mod, monkeypatch) -> None:
    _enable(monkeypatch)
    with pytest.raises(ValueError, match="--speculative-algorithm is EAGLE"):
        mod.OnlineC128DsparkController(_backend(dspark=False)[0])


@pytest.mark.parametrize(
    "launch,words",
    [({"enable_two_batch_overlap": True}, "--enable-two-batch-overlap"), ({"enable_pdmux": True}, "--enable-pdmux"),
     ({"attn_dp_size": 2}, "DP attention"), ({"dcp_size": 2}, "--dcp-size 2: decode context parallelism"),
     ({"prefill_attention_backend": "fa3"},
      "prefill attention backend fa3 and decode attention backend dsv4 differ: the target's backend becomes a "
      "HybridAttnBackend")],
)
def test_refused_launch_is_refused_at_construction(mod, monkeypatch, launch, words: str) -> None:
    """Each of TBO's micro-batch backends (and any other) constructs a controller: the
    controller itself refuses what the rules refuse, from the live config."""
    from series3_sim import install_runtime_context

    _enable(monkeypatch)
    install_runtime_context(**launch)
    with pytest.raises(ValueError, match=f"refuses this configuration:\n  - {words}"):
        mod.OnlineC128DsparkController(_backend()[0])


@pytest.mark.parametrize("mode", ["cap-accept", "dynamic"])
def test_ragged_verify_mode_not_shown_is_refused_at_construction(mod, monkeypatch, mode: str) -> None:
    """The controller reads SGLANG_RAGGED_VERIFY_MODE from the live environment."""
    _enable(monkeypatch)
    monkeypatch.setenv("SGLANG_RAGGED_VERIFY_MODE", mode)
    with pytest.raises(ValueError, match=f"refuses this configuration:\n  - SGLANG_RAGGED_VERIFY_MODE={mode}: "):
        mod.OnlineC128DsparkController(_backend()[0])
    monkeypatch.setenv("SGLANG_RAGGED_VERIFY_MODE", "compact")
    assert mod.OnlineC128DsparkController(_backend()[0]).enabled()


def test_refuses_upstream_mtp_controller_alongside(mod, monkeypatch) -> None:
    _enable(monkeypatch)
    backend, _ = _backend(mtp_enabled=True)
    with pytest.raises(RuntimeError, match="only the DSPARK one"):
        mod.OnlineC128DsparkController(backend)


class TboAttnBackend:
    """What the target runner's backend is under --enable-two-batch-overlap: a wrapper
    without the controller attribute."""


def _commit_after_verify(mod, runner) -> None:
    mod.commit_after_verify(
        runner,
        seq_lens=torch.ones(1, dtype=torch.int64),
        new_seq_lens=torch.ones(1, dtype=torch.int64),
        req_pool_indices=torch.ones(1, dtype=torch.int64),
        layout=None,
    )


def test_commit_after_verify_without_controller_raises(mod) -> None:
    runner = SimpleNamespace(attn_backend=TboAttnBackend())
    with pytest.raises(RuntimeError, match=r"backend \(TboAttnBackend\) has no online c128 DSPARK controller"):
        _commit_after_verify(mod, runner)


def test_commit_after_verify_with_a_disabled_controller_raises(mod) -> None:
    backend, _ = _backend()
    backend.online_c128_dspark = mod.OnlineC128DsparkController(backend)  # gate unset: disabled
    with pytest.raises(RuntimeError, match="has a disabled online c128 DSPARK controller"):
        _commit_after_verify(mod, backend.model_runner)


# -- the plan's arguments --------------------------------------------------------------


def _plan_call(ops: ReferenceOps) -> dict:
    name, args = ops.calls[-1]
    assert name == "plan"
    return args


def test_static_plan_from_device_lens(mod, ops, monkeypatch) -> None:
    _enable(monkeypatch)
    backend, _ = _backend()
    controller = mod.OnlineC128DsparkController(backend)
    controller.prepare_verify(_fb(), bs=4, verify_bs=3, ragged_layout=None)
    raw = _raw([5, 127, 300, 1], [3, 1, 2, 0])
    plan = controller.build_verify_plan(raw, num_q_tokens=4 * W)
    args = _plan_call(ops)
    assert args["seq_lens"].dtype == torch.int64
    assert args["seq_lens"].tolist() == [5, 127, 300, 1]
    assert args["req_pool_indices"].tolist() == [3, 1, 2, 0]
    assert args["verify_lens"].tolist() == [W, W, W, 0]  # the padding row is empty
    assert args["extend_start_loc"].tolist() == [0, W, 2 * W, 3 * W]
    assert (args["num_q_tokens"], args["num_banks"], args["state_slot_offset"]) == (4 * W, W, SLOTS + 2)
    assert args["max_num_reqs"] == SLOTS  # the commit's bound too (the pool's request slots), not the stride
    assert plan.compress_ratio == 128
    assert controller.owned_plan(plan) is not None


def test_compact_plan_real_rows_and_zero_rows(mod, ops, monkeypatch) -> None:
    _enable(monkeypatch)
    backend, _ = _backend()
    controller = mod.OnlineC128DsparkController(backend)
    # 3 real rows [2, 5, 1] padded to 5 slots and 12 tokens: padding rows share 4 tokens.
    live = SimpleNamespace(bs=3, verify_lens=_i32(2, 5, 1))
    padded = SimpleNamespace(verify_lens=_i32(2, 5, 1, 2, 2), extend_start_loc=_i32(0, 2, 7, 8, 10))
    controller.prepare_verify(_fb(live), bs=5, verify_bs=0, ragged_layout=padded)
    raw = _raw([10, 20, 30, 1, 1], [1, 2, 3, 0, 0], padded.verify_lens, padded.extend_start_loc)
    controller.build_verify_plan(raw, num_q_tokens=12)
    args = _plan_call(ops)
    assert args["verify_lens"].tolist() == [2, 5, 1, 0, 0]
    assert args["extend_start_loc"].tolist() == [0, 2, 7, 8, 10]
    assert args["num_q_tokens"] == 12
    # No padding rows: the last real row carries the bucket's leftover; the plan does not.
    live = SimpleNamespace(bs=2, verify_lens=_i32(3, 1))
    padded = SimpleNamespace(verify_lens=_i32(3, 6), extend_start_loc=_i32(0, 3))
    controller.prepare_verify(_fb(live), bs=2, verify_bs=1, ragged_layout=padded)
    controller.build_verify_plan(_raw([4, 4], [4, 5], padded.verify_lens, padded.extend_start_loc), num_q_tokens=9)
    assert _plan_call(ops)["verify_lens"].tolist() == [3, 1]


def test_prepare_verify_raises_with_the_values(mod, ops, monkeypatch) -> None:
    """A row count past the metadata's rows is an error naming both, never clamped."""
    _enable(monkeypatch)
    controller = mod.OnlineC128DsparkController(_backend()[0])
    with pytest.raises(RuntimeError, match="uniform verify of 5 rows, but the verify metadata has 4 rows"):
        controller.prepare_verify(_fb(), bs=4, verify_bs=5, ragged_layout=None)
    with pytest.raises(RuntimeError, match="uniform verify of -1 rows, but the verify metadata has 4 rows"):
        controller.prepare_verify(_fb(), bs=4, verify_bs=-1, ragged_layout=None)
    live = SimpleNamespace(bs=4, verify_lens=_i32(1, 2, 3, 4))
    padded = SimpleNamespace(verify_lens=_i32(1, 2, 3), extend_start_loc=_i32(0, 1, 3))
    with pytest.raises(RuntimeError, match="ragged layout has 4 real rows, but the verify metadata has 3 rows"):
        controller.prepare_verify(_fb(live), bs=3, verify_bs=0, ragged_layout=padded)
    assert controller._prepared_bs is None  # nothing prepared: the plan refuses as well
    with pytest.raises(RuntimeError, match="skipped prepare_verify"):
        controller.build_verify_plan(_raw([9] * 3, [1, 2, 3]), num_q_tokens=3 * W)


@pytest.mark.parametrize("forward_batch", [_fb(None), SimpleNamespace(spec_info=None), SimpleNamespace()],
                         ids=["layout-none", "no-spec-info", "no-spec-info-attr"])
def test_compact_verify_without_the_batchs_ragged_layout_raises(mod, ops, monkeypatch, forward_batch) -> None:
    _enable(monkeypatch)
    controller = mod.OnlineC128DsparkController(_backend()[0])
    padded = SimpleNamespace(verify_lens=_i32(2, 2), extend_start_loc=_i32(0, 2))
    with pytest.raises(RuntimeError, match="compact verify without the batch's ragged layout"):
        controller.prepare_verify(forward_batch, bs=2, verify_bs=0, ragged_layout=padded)
    assert ops.calls == []


def test_captured_plans_keep_one_per_graph_shape(mod, ops, monkeypatch) -> None:
    """A recapture of a graph shape replaces its plan (the dict stays bounded by the live
    buckets); the replaced plan is no longer held, so a layer handed it raises."""
    _enable(monkeypatch)
    controller = mod.OnlineC128DsparkController(_backend()[0])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)

    def capture(bs: int):
        controller.prepare_verify(_fb(), bs=bs, verify_bs=bs, ragged_layout=None)
        return controller.build_verify_plan(_raw([9] * bs, list(range(1, bs + 1))), num_q_tokens=bs * W)

    first, other = capture(2), capture(3)
    for _ in range(5):
        again = capture(2)
    assert len(controller._captured_plans) == len(controller._captured_by_shape) == 2
    assert controller.owned_plan(first) is None
    assert controller.owned_plan(again) is not None and controller.owned_plan(other) is not None
    with pytest.raises(RuntimeError, match="does not hold"):
        controller.compress_fn(first, lambda **kw: None)


def test_verify_compress_contract_is_a_runtime_error(mod, ops, monkeypatch) -> None:
    """Not an assert: the check holds under python -O too."""
    with pytest.raises(RuntimeError, match="another plan than the one it was routed for"):
        mod._verify_compress(object(), object(), kv_score_buffer=None, kv_score_input=None, ape=None,
                             plan=object(), compress_ratio=128, head_dim=512)
    owned = object()
    with pytest.raises(RuntimeError, match="ratio=4"):
        mod._verify_compress(object(), owned, kv_score_buffer=None, kv_score_input=None, ape=None,
                             plan=owned, compress_ratio=4, head_dim=512)


def test_empty_bucket_builds_a_fresh_empty_plan(mod, ops, monkeypatch) -> None:
    _enable(monkeypatch)
    backend, _ = _backend()
    controller = mod.OnlineC128DsparkController(backend)
    controller.prepare_verify(_fb(), bs=4, verify_bs=4, ragged_layout=None)
    controller.build_verify_plan(_raw([9] * 4, [1, 2, 3, 4]), num_q_tokens=4 * W)
    assert _plan_call(ops)["verify_lens"].tolist() == [W] * 4
    # The same bucket with no real row (DP idle / verify_bs == 0): nothing of the last
    # step survives.
    controller.prepare_verify(_fb(), bs=4, verify_bs=0, ragged_layout=None)
    controller.build_verify_plan(_raw([1] * 4, [0] * 4), num_q_tokens=4 * W)
    args = _plan_call(ops)
    assert args["verify_lens"].tolist() == [0] * 4
    assert args["req_pool_indices"].tolist() == [0] * 4


def test_plan_needs_its_prepare(mod, ops, monkeypatch) -> None:
    _enable(monkeypatch)
    controller = mod.OnlineC128DsparkController(_backend()[0])
    with pytest.raises(RuntimeError, match="skipped prepare_verify"):
        controller.build_verify_plan(_raw([9] * 2, [1, 2]), num_q_tokens=2 * W)
    controller.prepare_verify(_fb(), bs=3, verify_bs=3, ragged_layout=None)
    with pytest.raises(RuntimeError, match="skipped prepare_verify"):
        controller.build_verify_plan(_raw([9] * 2, [1, 2]), num_q_tokens=2 * W)
    with pytest.raises(RuntimeError, match="exceed the request rows"):
        controller.prepare_verify(_fb(), bs=SLOTS + 9, verify_bs=1, ragged_layout=None)


def test_no_online_c128_state_pools_is_refused_at_construction(mod, ops, monkeypatch) -> None:
    _enable(monkeypatch)
    with pytest.raises(RuntimeError, match="has no online c128 state pool, so there is nothing to bank"):
        mod.OnlineC128DsparkController(_backend(layers=0)[0])
    backend, _ = _backend()
    backend.token_to_kv_pool = SimpleNamespace(get_online_c128_mtp_max_draft_tokens=lambda: W)
    with pytest.raises(RuntimeError, match="has no compress_state_pools: not a DeepSeek-V4 pool"):
        mod.OnlineC128DsparkController(backend)
    assert ops.calls == []


def test_a_plan_that_cannot_be_built_is_an_error(mod, ops, monkeypatch) -> None:
    """Never None (which would hand the verify to upstream's host planner) while enabled."""
    _enable(monkeypatch)
    controller = mod.OnlineC128DsparkController(_backend()[0])
    controller.prepare_verify(_fb(), bs=2, verify_bs=2, ragged_layout=None)
    controller._states = []  # the pools vanished after construction
    with pytest.raises(RuntimeError, match="verify plan without online c128 state pools"):
        controller.build_verify_plan(_raw([9] * 2, [1, 2]), num_q_tokens=2 * W)
    with pytest.raises(RuntimeError, match="commit without online c128 state pools"):
        controller.commit(seq_lens=torch.ones(1, dtype=torch.int64), new_seq_lens=torch.ones(1, dtype=torch.int64),
                          req_pool_indices=torch.ones(1, dtype=torch.int64))


# -- per layer ----------------------------------------------------------------------------


def test_compress_fn_routes_only_its_own_plans(mod, ops, monkeypatch) -> None:
    _enable(monkeypatch)
    backend, states = _backend()
    controller = mod.OnlineC128DsparkController(backend)

    def build(capturing: bool):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: capturing)
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing)
        controller.prepare_verify(_fb(), bs=2, verify_bs=2, ragged_layout=None)
        return controller.build_verify_plan(_raw([9, 9], [1, 2]), num_q_tokens=2 * W)

    captured, eager = build(True), build(False)
    newer = build(False)
    assert controller.owned_plan(captured) is not None  # a graph's plan stays owned
    assert controller.owned_plan(eager) is None  # only the latest eager one
    sentinel = object()
    assert controller.compress_fn(object(), sentinel) is sentinel  # not a DSPARK plan
    with pytest.raises(RuntimeError, match="a DSPARK verify plan this backend's controller does not hold"):
        controller.compress_fn(eager, sentinel)

    fn = controller.compress_fn(newer, sentinel)
    assert fn is not sentinel
    kv_score_input = torch.randn(2 * W, 2 * HEAD_DIM)
    ape = torch.randn(128, HEAD_DIM)
    fn(
        kv_score_buffer=states[1].view(-1, 1, STATE_DIM),
        kv_score_input=kv_score_input,
        ape=ape,
        plan=newer,
        compress_ratio=128,
        head_dim=HEAD_DIM,
        out=None,
        is_online=True,
    )
    name, args = ops.calls[-1]
    assert name == "verify"
    assert args["state"].shape == states[1].shape and args["state"].data_ptr() == states[1].data_ptr()
    assert args["kv_score_input"] is kv_score_input and args["ape"].shape == (128, HEAD_DIM)
    assert args["plan"] is controller.owned_plan(newer)
    assert args["plan"].prefill_plan.plan_c is newer.plan_c  # the same tensors upstream reads


def test_dspark_plan_is_upstreams_type_with_copy_refused(mod, ops, monkeypatch) -> None:
    _enable(monkeypatch)
    controller = mod.OnlineC128DsparkController(_backend()[0])
    controller.prepare_verify(_fb(), bs=2, verify_bs=2, ragged_layout=None)
    plan = controller.build_verify_plan(_raw([9, 9], [1, 2]), num_q_tokens=2 * W)
    base = controller.owned_plan(plan).prefill_plan
    assert isinstance(plan, type(base)) and tuple(plan) == tuple(base) and mod.is_dspark_plan(plan)
    assert not mod.is_dspark_plan(base)
    with pytest.raises(RuntimeError, match="an in-place copy of a DSPARK verify plan"):
        plan.copy_(plan)


# -- after accept -------------------------------------------------------------------------


def test_commit_once_per_step_all_layers(mod, ops, ragged, monkeypatch) -> None:
    _enable(monkeypatch)
    sim = Simulation(SimConfig(num_slots=SLOTS, width=W, num_layers=3), mod.OnlineC128DsparkController,
                     mod.commit_after_verify, ops, ragged)
    for slot in range(1, SLOTS):
        sim.admit(slot, 100 + slot)
    sim.step_compact([2, 4, 1], padded_bs=5, extra_tokens=3)
    sim.step_static([3, 5], padded_bs=3)
    commits = [args for name, args in ops.calls if name == "commit"]
    ptrs = [args for name, args in ops.calls if name == "ptrs"]
    assert len(commits) == 2 and len(ptrs) == 1  # one launch per step, table built once
    assert len(ptrs[0]["states"]) == 3
    assert all(a is b for a, b in zip(ptrs[0]["states"], sim.states))
    compact, static = commits
    assert compact["req_pool_indices"].tolist() == [2, 4, 1]
    assert static["verify_lens"].tolist() == [W, W]
    assert (compact["num_banks"], compact["state_slot_stride"], compact["max_num_reqs"]) == (W, SLOTS + 2, SLOTS)
    assert compact["state_dtype"] == torch.float32
    assert all(1 <= n <= W for n in compact["verify_lens"].tolist())
    delta = (compact["new_seq_lens"] - compact["seq_lens"]).tolist()
    assert all(1 <= d <= n for d, n in zip(delta, compact["verify_lens"].tolist()))


@pytest.mark.parametrize("seed", [0, 1])
def test_simulated_decode(mod, ops, ragged, monkeypatch, seed: int) -> None:
    """Compact (zero rows, last-row inflation), static (padded), empty buckets and slot
    reuse over many steps: emitted rows, banks and committed state match float64."""
    _enable(monkeypatch)
    sim = Simulation(SimConfig(seed=seed, num_slots=7), mod.OnlineC128DsparkController, mod.commit_after_verify,
                     ops, ragged)
    reports = run_decode(sim, steps=10)
    kinds = {r.kind for r in reports}
    assert kinds == {"compact", "static"}
    assert any(r.real_rows == 0 for r in reports)
    assert sum(r.emitted for r in reports) > 0
    assert sum(r.banks_checked for r in reports) > 0
    assert sum(r.committed for r in reports) > 0


@pytest.mark.parametrize("seed", [0, 1])
def test_simulated_decode_through_the_backend(mod, ops, ragged, patched, monkeypatch, seed: int) -> None:
    """The same decode with each step through the release's own backend verify path (the
    eager prep `_build_forward_metadata`, then `make_forward_metadata_from_raw_verify`):
    compact steps padded by the backend's `_resolve_verify_layout`, the controller seeing
    what upstream hands it (verify_bs from `_get_target_verify_bs`)."""
    from series3_backend import VerifyBackend

    _enable(monkeypatch)
    monkeypatch.setenv("SGLANG_RAGGED_VERIFY_MODE", "compact")
    sim = Simulation(SimConfig(seed=seed, num_slots=7), mod.OnlineC128DsparkController, mod.commit_after_verify,
                     ops, ragged, backend=functools.partial(VerifyBackend, patched))
    reports = run_decode(sim, steps=10)
    assert {r.kind for r in reports} == {"compact", "static"} and any(r.real_rows == 0 for r in reports)
    assert sum(r.emitted for r in reports) > 0 and sum(r.committed for r in reports) > 0
    plans = [args for name, args in ops.calls if name == "plan"]
    assert len(plans) == len(reports)
    assert 128 not in sim.backend.created  # no host-lens c128 planner on the verify path


def test_graph_buckets_through_the_backend(mod, ops, ragged, patched, monkeypatch) -> None:
    """The GPU tier's CUDA-graph flow through the release's preps, with graphs replaced by
    `EagerReplays`: each bucket's capture prep once, then per step the replay prep must
    refresh the captured raw metadata in place (the replayed body reads only that) — a
    compact token bucket, a static batch bucket, and that static bucket with no real row."""
    from series3_backend import VerifyBackend
    from series3_sim import EagerReplays, run_graph_decode

    _enable(monkeypatch)
    monkeypatch.setenv("SGLANG_RAGGED_VERIFY_MODE", "compact")
    sim = Simulation(SimConfig(seed=3, num_slots=8, width=W, cuda_graphs=True), mod.OnlineC128DsparkController,
                     mod.commit_after_verify, ops, ragged, backend=functools.partial(VerifyBackend, patched))
    sim.graph_runner = EagerReplays()
    reports = run_graph_decode(sim, steps=9)
    assert len(sim.graphs) == 2 and sim.replays == len(reports) == 9
    assert any(r.real_rows == 0 for r in reports) and sum(r.emitted for r in reports) > 0
    bucket_raws = sim.backend.cuda_graph_metadata_of_bucket_and_bs[sim.backend.GraphBucket.TARGET_VERIFY]
    assert len(bucket_raws) == 2  # one captured raw metadata per bucket, reused


class _CommitOneShort(ReferenceOps):
    """A wrong commit: copies the bank one token before the accepted length."""

    def dspark_commit(self, state_ptrs, seq_lens, new_seq_lens, *args, **kwargs) -> None:
        super().dspark_commit(state_ptrs, seq_lens, new_seq_lens - 1, *args, **kwargs)


class _VerifyWithoutApe(ReferenceOps):
    """A wrong verify compress: drops the positional bias (ape) from the scores."""

    def dspark_verify_compress(self, state, kv_score_input, ape, plan, out=None):
        return super().dspark_verify_compress(state, kv_score_input, torch.zeros_like(ape), plan, out)


@pytest.mark.parametrize("mutant,what", [(_CommitOneShort, "commit"), (_VerifyWithoutApe, "bank|emit")])
def test_simulated_decode_catches_a_wrong_kernel(mod, ragged, monkeypatch, mutant, what: str) -> None:
    """The float64 checks of the simulated decode fail when the kernel model is wrong."""
    _enable(monkeypatch)
    ops = mutant()
    monkeypatch.setattr(mod, "_ops", lambda: ops)
    sim = Simulation(SimConfig(seed=0, num_slots=7), mod.OnlineC128DsparkController, mod.commit_after_verify,
                     ops, ragged)
    with pytest.raises(AssertionError, match=what):
        run_decode(sim, steps=10)
