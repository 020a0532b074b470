"""The DSPARK worker's accept -> commit path, run out of each release's real (patched and
unpatched) `DSparkWorkerV2._forward_decode` with stand-ins around it: with the gate on, the
real controller commits right after accept, from the pre-verify lengths, the accepted
lengths, the batch's request slots and the step's layout; with no controller to commit
(two-batch overlap's wrapper backend) the step raises; with the gate unset the function makes
upstream's calls and never imports the overlay."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest

torch = pytest.importorskip("torch")

from series3_sim import STATE_DIM, FakeKVPool, ReferenceOps, fake_backend
from series3_tree import ENV, load_with_globals, pretend_cuda_build, required_globals, sglang_imports
from support import RELEASES

WORKER = "sglang/srt/speculative/dspark_components/dspark_worker_v2.py"
OVERLAY = "sglang.srt.layers.attention.dsv4.online_c128_dspark"
ONLINE_ENV = "SGLANG_OPT_USE_ONLINE_COMPRESS"
W, SLOTS = 4, 6


@pytest.fixture(params=RELEASES)
def trees(request, series_trees, monkeypatch: pytest.MonkeyPatch):
    for name in (ENV, ONLINE_ENV, "SGLANG_EXPERIMENTAL_ONLINE_C128_MTP", "SGLANG_RAGGED_VERIFY_MODE"):
        monkeypatch.delenv(name, raising=False)
    pretend_cuda_build(monkeypatch)
    return series_trees[request.param]


class _Lens(torch.Tensor):
    """batch.seq_lens on the CPU: `record_stream` (upstream's one unconditional call) is a
    CUDA-only op."""

    def record_stream(self, stream) -> None:
        pass


class DFlashDraftInputV2:
    """Stand-in type of the running batch's draft input (upstream checks isinstance)."""


class Step:
    """One verify step's stand-ins: the worker (`self`), the batch, the accept, the layout."""

    def __init__(self, *, compact: bool, attn_backend) -> None:
        self.events: list = []
        self.prefix_lens = torch.tensor([130, 7, 255], dtype=torch.int64).as_subclass(_Lens)
        self.req_pool_indices = torch.tensor([3, 1, 5], dtype=torch.int64)
        self.new_seq_lens = torch.tensor([132, 8, 257], dtype=torch.int64)
        self.layout = None
        if compact:  # the planner's compact layout (the release's own type): real rows, a token bucket
            from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout

            self.layout = RaggedVerifyLayout.from_verify_lens_device(
                verify_lens=torch.tensor([3, 1, 4], dtype=torch.int32), graph_num_tokens=12)
        self.accept = SimpleNamespace(new_seq_lens=self.new_seq_lens, commit_lens=torch.tensor([2, 1, 2]),
                                      out_tokens=torch.zeros(3, W, dtype=torch.int64), correct_len=None,
                                      cap_trim_lens=torch.zeros(3, dtype=torch.int64),
                                      bonus=torch.zeros(3, dtype=torch.int64))
        worker = mock.MagicMock(name="worker")
        worker.device = "cpu"
        worker.verify_num_draft_tokens = W
        for flag in ("_prepare_inputs_once", "_sim_draw_ahead", "_simulate_acc_greedy", "_draft_is_moe"):
            setattr(worker, flag, False)
        worker._verify_inputs_ready = None
        worker._proposer.propose.return_value = SimpleNamespace(
            draft_block_ids=torch.zeros((3, 1), dtype=torch.int64), verify_ids=None, folded=False,
            draft_block=SimpleNamespace(draft_tokens=torch.zeros((3, W - 1), dtype=torch.int64), greedy_mask=None),
            confidence=None, confidence_raw=None, draft_hidden=None, confidence_tap=None,
        )
        worker._verify_planner.schedule_layout.return_value = self.layout
        worker._verify_planner.should_run_compact.return_value = compact
        worker._verify_planner.mode_value = "compact" if compact else "static"
        worker._verify_executor.verify_epilogue = None  # no in-graph (folded) accept
        verified = SimpleNamespace(logits_output=mock.MagicMock(name="logits_output"), can_run_cuda_graph=True)
        worker._verify_executor.run_compact.return_value = (verified, None)
        worker._verify_executor.run_non_compact.return_value = verified
        worker._sampling_graph_eligible.return_value = False
        worker._future_relay_in_graph.return_value = None
        worker._verify_executor.accept_and_finalize.side_effect = self._accept
        worker._verify_executor.commit_hidden.side_effect = lambda **kw: self.events.append("commit_hidden")
        worker.target_worker.model_runner.attn_backend = attn_backend
        self.worker = worker
        self.batch = mock.MagicMock(name="batch", seq_lens=self.prefix_lens, req_pool_indices=self.req_pool_indices,
                                    has_grammar=False, return_logprob=False,
                                    spec_info=mock.MagicMock(spec=DFlashDraftInputV2))
        self.batch.forward_mode.is_idle.return_value = False

    def _accept(self, **kwargs):
        self.events.append("accept")
        return self.accept

    def namespace(self, path: Path) -> dict:
        """The module globals `_forward_decode` reads: MagicMocks but for the real envs and
        torch and the stand-ins the flow branches on."""
        from sglang.srt.environ import envs

        ns = {name: mock.MagicMock(name=name) for name in required_globals(path, "DSparkWorkerV2._forward_decode")}
        ns.update(envs=envs, torch=torch, DFlashDraftInputV2=DFlashDraftInputV2,
                  get_parallel=lambda: mock.MagicMock(attn_dp_enabled=False, enable_dp_attention=False),
                  GenerationBatchResult=lambda **kw: kw)
        return ns

    def run(self, tree: Path) -> dict:
        path = tree / WORKER
        fn = load_with_globals(path, "DSparkWorkerV2._forward_decode", self.namespace(path))
        return fn(self.worker, self.batch, None)


def _target(ops: ReferenceOps, monkeypatch, *, enabled: bool):
    """A DSPARK target backend with the real controller (its kernels: the torch model)."""
    if enabled:
        monkeypatch.setenv(ONLINE_ENV, "1")
        monkeypatch.setenv(ENV, "1")
    from sglang.srt.layers.attention.dsv4 import online_c128_dspark as mod

    monkeypatch.setattr(mod, "_ops", lambda: ops)
    states = [torch.zeros(((1 + W) * (SLOTS + 2), STATE_DIM)) for _ in range(2)]
    backend = fake_backend(FakeKVPool(states, SLOTS, W), width=W, device="cpu")
    backend.online_c128_dspark = mod.OnlineC128DsparkController(backend)
    return backend


@pytest.mark.parametrize("compact", [True, False], ids=["compact", "static"])
def test_commit_runs_right_after_accept_from_device_lengths(trees, monkeypatch, compact: bool) -> None:
    patched, _ = trees
    with sglang_imports(patched):
        ops = ReferenceOps()
        step = Step(compact=compact, attn_backend=_target(ops, monkeypatch, enabled=True))
        original = ops.dspark_commit
        ops.dspark_commit = lambda *a, **k: (step.events.append("commit"), original(*a, **k))[1]
        result = step.run(patched)
        (name, args), = [c for c in ops.calls if c[0] == "commit"]
        assert args["seq_lens"].tolist() == [130, 7, 255]  # before verify
        assert args["new_seq_lens"].tolist() == [132, 8, 257]  # accept.new_seq_lens
        assert args["req_pool_indices"].tolist() == [3, 1, 5]
        assert args["verify_lens"].tolist() == ([3, 1, 4] if compact else [W] * 3)
        assert args["extend_start_loc"].tolist() == ([0, 3, 4] if compact else [0, W, 2 * W])
        assert args["num_q_tokens"] == (12 if compact else 3 * W)
        assert step.events.index("accept") < step.events.index("commit")
        assert "commit_hidden" not in step.events or step.events.index("commit") < step.events.index("commit_hidden")
        assert result["new_seq_lens"] is step.new_seq_lens


def test_a_target_backend_without_controller_fails_the_step(trees, monkeypatch) -> None:
    """Under two-batch overlap the target's backend is a wrapper without the controller:
    the step raises instead of leaving bank 0 uncommitted."""
    patched, _ = trees
    with sglang_imports(patched):
        monkeypatch.setenv(ONLINE_ENV, "1")
        monkeypatch.setenv(ENV, "1")
        tbo = type("TboAttnBackend", (), {})()
        step = Step(compact=True, attn_backend=tbo)
        with pytest.raises(RuntimeError, match=r"backend \(TboAttnBackend\) has no online c128 DSPARK controller"):
            step.run(patched)


def test_gate_unset_is_upstream_and_never_imports_the_overlay(trees, monkeypatch) -> None:
    patched, upstream = trees
    calls = {}
    for name, tree in (("upstream", upstream), ("patched", patched)):
        with sglang_imports(tree):
            ops = ReferenceOps()
            if name == "patched":
                backend = _target(ops, monkeypatch, enabled=False)
                sys.modules.pop(OVERLAY)
            else:
                backend = None
            step = Step(compact=True, attn_backend=backend)
            result = step.run(tree)
            assert OVERLAY not in sys.modules
            assert not [c for c in ops.calls if c[0] == "commit"]
            calls[name] = ([c[0] for c in step.worker.mock_calls], step.events, sorted(result))
    assert calls["patched"] == calls["upstream"]
