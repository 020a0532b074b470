"""Online C128 compression through DSPARK target verify (c128patch).

Carries sgl-project/sglang#32035. Active only with SGLANG_OPT_USE_ONLINE_COMPRESS=1 and
SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK=1 on a DSPARK target runner; otherwise every entry
returns before touching anything, and the backend runs upstream's path.

State banks are upstream's MTP layout: the c128 `CompressStatePool` holds `(1+N)·L` rows,
bank 0 (row `rid`) is the committed state, bank k (row `rid + k·L`) the state after k verify
tokens. Per verify step:

* `prepare_verify` (replay prep or eager prep, outside any graph): writes this step's
  per-row verify lengths into a persistent buffer, 0 for padding rows. The real row count
  comes from the live ragged layout (compact) or the verify batch (static), never from
  `len(draft_token) / W`.
* `build_verify_plan` (inside the verify graph, or eagerly): the c128 plan, built on the
  device from that buffer, the layout's start offsets and the device seq lens. No host lens.
* `compress_fn` (each c128 layer): the fused verify compress, which emits the pooled rows of
  chunks closing in the window and writes banks 1..n, never bank 0.
* `commit` (DSPARK worker, right after accept): bank[accept] -> bank 0 for every c128 layer
  in one launch, from device lengths. Nothing is left pending across forwards.

The kernel ops are imported lazily: this module imports with torch alone.
"""

from __future__ import annotations

import functools
import importlib
import logging
from typing import Any, Callable, Dict, List, Optional

import torch

from sglang.srt.environ import envs

logger = logging.getLogger(__name__)

# Largest bank count the series II kernels accept (`kMaxBanks` in
# csrc/deepseek_v4/online_c128_dspark.cuh); a test keeps the two equal.
DSPARK_MAX_BANKS = 1024

_KERNEL_OPS = "sglang.kernels.ops.attention.dsv4.online_c128_dspark"


def _ops() -> Any:
    return importlib.import_module(_KERNEL_OPS)


def online_c128_dspark_env() -> bool:
    """Both switches of this path are on."""
    return (
        envs.SGLANG_OPT_USE_ONLINE_COMPRESS.get()
        and envs.SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK.get()
    )


def check_online_c128_dspark_startup(spec_algorithm: Any, num_banks: int) -> bool:
    """Startup gate for the pool configurator (called only with the DSPARK env set).

    True when this run takes the online C128 DSPARK path; False for any other speculative
    algorithm (upstream's own checks then apply unchanged). Raises on a configuration the
    path cannot run.
    """
    if not spec_algorithm.is_dspark():
        return False
    if envs.SGLANG_EXPERIMENTAL_ONLINE_C128_MTP.get():
        raise ValueError(
            "SGLANG_EXPERIMENTAL_ONLINE_C128_MTP is the EAGLE/MTP online-c128 path; with "
            "--speculative-algorithm DSPARK set SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK=1 "
            "alone (the two would both write the c128 state banks)."
        )
    if not 0 < num_banks <= DSPARK_MAX_BANKS:
        raise ValueError(
            "SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK keeps one c128 state bank per verify "
            f"token; the DSPARK verify width is {num_banks} (gamma + 1 = "
            f"speculative_num_draft_tokens) but the online c128 DSPARK kernels hold "
            f"1..{DSPARK_MAX_BANKS} banks. Change --speculative-dspark-block-size (gamma)."
        )
    logger.warning(
        "DSV4 compressed attention: experimental online c128 + DSPARK verify enabled "
        "(state banks=%d). Validate correctness carefully.",
        num_banks,
    )
    return True


class OnlineC128DsparkController:
    """The backend's online C128 DSPARK verify state (see the module docstring)."""

    def __init__(self, backend: Any):
        self.backend = backend
        self._enabled = online_c128_dspark_env() and _is_dspark_target(backend)
        # Plans this controller built, by id of their CompressorPrefillPlan: the ones
        # recorded in CUDA graphs (kept while the graphs live) and the latest eager one.
        self._captured_plans: Dict[int, Any] = {}
        self._eager_plan: Optional[Any] = None
        self._verify_lens: Optional[torch.Tensor] = None
        self._uniform_start_loc: Optional[torch.Tensor] = None
        self._uniform_lens: Optional[torch.Tensor] = None
        self._prepared_bs: Optional[int] = None
        self._states: Optional[List[torch.Tensor]] = None
        self._state_ptrs: Optional[torch.Tensor] = None
        if self._enabled and backend.online_c128_mtp.enabled():
            raise RuntimeError(
                "online c128: SGLANG_EXPERIMENTAL_ONLINE_C128_MTP and "
                "SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK are both set for a DSPARK target; "
                "set only the DSPARK one."
            )

    def enabled(self) -> bool:
        return self._enabled

    # -- prepare (host, outside any graph) -------------------------------------------

    def prepare_verify(
        self,
        forward_batch: Any,
        *,
        bs: int,
        verify_bs: int,
        ragged_layout: Optional[Any],
    ) -> None:
        """Per-row verify lengths of this step for `build_verify_plan`.

        `bs` is the (padded) row count of the verify metadata, `verify_bs` the batch's
        uniform-verify row count, `ragged_layout` the backend's padded compact layout
        (None for uniform verify). Rows past the real batch get 0: the plan skips them.
        """
        if not self._enabled:
            return
        lens = self._verify_lens_buffer()[:bs]
        if lens.shape[0] != bs:
            raise RuntimeError(f"online c128 DSPARK: {bs} verify rows exceed the request rows")
        if ragged_layout is None:
            real = min(max(int(verify_bs), 0), bs)
            lens[:real].fill_(self._verify_width())
            self._uniform_start_loc_buffer()  # allocated here, outside any graph
        else:
            live = _live_ragged_layout(forward_batch)
            if live is None:
                raise RuntimeError(
                    "online c128 DSPARK: compact verify without the batch's ragged layout"
                )
            real = min(live.bs, bs)
            lens[:real].copy_(live.verify_lens[:real])
        lens[real:].zero_()
        self._prepared_bs = bs

    # -- plan (inside the verify graph, or eager) --------------------------------------

    def build_verify_plan(self, raw_metadata: Any, *, num_q_tokens: int) -> Optional[Any]:
        """The c128 verify plan (an upstream `CompressorPrefillPlan`) from device tensors.

        Reads only tensors whose storage outlives a captured graph: the raw metadata's
        seq lens / request slots / start offsets and this controller's buffers.
        """
        if not self._enabled or not self._layer_states():
            return None
        bs = int(raw_metadata.seq_lens.shape[0])
        if self._prepared_bs != bs:
            raise RuntimeError(
                f"online c128 DSPARK: verify plan for {bs} rows, but prepare_verify "
                f"saw {self._prepared_bs}; a verify metadata path skipped prepare_verify"
            )
        if raw_metadata.verify_lens is not None:
            extend_start_loc = raw_metadata.extend_start_loc
        else:
            extend_start_loc = self._uniform_start_loc_buffer()[:bs]
        pool = self.backend.token_to_kv_pool
        verify_plan = _ops().dspark_verify_plan(
            raw_metadata.seq_lens.to(torch.int64),
            self._verify_lens_buffer()[:bs],
            extend_start_loc.to(torch.int32),
            raw_metadata.req_pool_indices.to(torch.int64),
            num_q_tokens=int(num_q_tokens),
            num_banks=int(pool.get_online_c128_mtp_max_draft_tokens()),
            state_slot_offset=int(pool.get_online_c128_mtp_state_slot_offset()),
            state_dtype=self._layer_states()[0].dtype,  # the JIT module the layers use
        )
        key = id(verify_plan.prefill_plan)
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            self._captured_plans[key] = verify_plan
        else:
            self._eager_plan = verify_plan
        return verify_plan.prefill_plan

    def owned_plan(self, plan: Any) -> Optional[Any]:
        """The DSPARK verify plan whose upstream plan (`prefill_plan`) is `plan`, if this
        controller built it."""
        if not self._enabled:
            return None
        eager = self._eager_plan
        if eager is not None and eager.prefill_plan is plan:
            return eager
        captured = self._captured_plans.get(id(plan))
        if captured is not None and captured.prefill_plan is plan:
            return captured
        return None

    # -- per c128 layer ----------------------------------------------------------------

    def compress_fn(self, plan: Any, default: Callable[..., torch.Tensor]) -> Callable:
        """The compress step for a c128 layer: `default` (upstream's `compress_forward`)
        unless `plan` is this controller's verify plan."""
        verify_plan = self.owned_plan(plan)
        if verify_plan is None:
            return default
        return functools.partial(_verify_compress, verify_plan)

    # -- after accept ------------------------------------------------------------------

    def commit(
        self,
        *,
        seq_lens: torch.Tensor,
        new_seq_lens: torch.Tensor,
        req_pool_indices: torch.Tensor,
        verify_lens: Optional[torch.Tensor] = None,
        extend_start_loc: Optional[torch.Tensor] = None,
        num_q_tokens: Optional[int] = None,
    ) -> None:
        """bank[accept] -> bank 0 for every row of the verified batch, all c128 layers in
        one launch. `seq_lens` are the lengths before verify, `new_seq_lens` after accept;
        `verify_lens`, `extend_start_loc` and `num_q_tokens` the verify's ragged layout
        (all None: uniform width), so each row accepts at most its verified window."""
        if not self._enabled:
            return
        rows = int(req_pool_indices.shape[0])
        states = self._layer_states()
        if rows == 0 or not states:
            return
        if verify_lens is None:
            verify_lens = self._uniform_lens_buffer()[:rows]
            extend_start_loc = self._uniform_start_loc_buffer()[:rows]
            num_q_tokens = rows * self._verify_width()
        pool = self.backend.token_to_kv_pool
        _ops().dspark_commit(
            self._state_ptr_table(),
            seq_lens[:rows].to(torch.int64),
            new_seq_lens[:rows].to(torch.int64),
            verify_lens[:rows].to(torch.int32),
            req_pool_indices.to(torch.int64),
            extend_start_loc=extend_start_loc[:rows].to(torch.int32),
            num_q_tokens=int(num_q_tokens),
            num_banks=int(pool.get_online_c128_mtp_max_draft_tokens()),
            state_slot_stride=int(pool.get_online_c128_mtp_state_slot_offset()),
            max_num_reqs=int(pool.get_online_c128_state_num_req_slots()),
            state_dtype=states[0].dtype,
        )

    # -- buffers -----------------------------------------------------------------------

    def _verify_width(self) -> int:
        return int(self.backend.speculative_num_draft_tokens)

    def _max_rows(self) -> int:
        return int(self.backend.req_to_token.shape[0])

    def _verify_lens_buffer(self) -> torch.Tensor:
        if self._verify_lens is None:
            self._verify_lens = torch.zeros(
                self._max_rows(), dtype=torch.int32, device=self.backend.device
            )
        return self._verify_lens

    def _uniform_start_loc_buffer(self) -> torch.Tensor:
        if self._uniform_start_loc is None:
            rows = torch.arange(
                self._max_rows(), dtype=torch.int32, device=self.backend.device
            )
            self._uniform_start_loc = rows * self._verify_width()
        return self._uniform_start_loc

    def _uniform_lens_buffer(self) -> torch.Tensor:
        if self._uniform_lens is None:
            self._uniform_lens = torch.full(
                (self._max_rows(),),
                self._verify_width(),
                dtype=torch.int32,
                device=self.backend.device,
            )
        return self._uniform_lens

    def _layer_states(self) -> List[torch.Tensor]:
        """Every online c128 layer's state tensor of this runner's pool (this PP stage)."""
        if self._states is None:
            pools = getattr(self.backend.token_to_kv_pool, "compress_state_pools", [])
            self._states = [
                p.kv_score_buffer.kv_score
                for p in pools
                if p is not None and p.ratio == 128 and p.online
            ]
        return self._states

    def _state_ptr_table(self) -> torch.Tensor:
        if self._state_ptrs is None:
            self._state_ptrs = _ops().make_state_ptr_table(self._layer_states())
        return self._state_ptrs


def commit_after_verify(
    model_runner: Any,
    *,
    seq_lens: torch.Tensor,
    new_seq_lens: torch.Tensor,
    req_pool_indices: torch.Tensor,
    layout: Optional[Any],
) -> None:
    """DSPARK worker hook, right after accept: commit the target's c128 banks.

    `layout` is the step's ragged verify layout (its real rows' verify lengths), or None for
    uniform verify."""
    controller = getattr(model_runner.attn_backend, "online_c128_dspark", None)
    if controller is None:
        return
    controller.commit(
        seq_lens=seq_lens,
        new_seq_lens=new_seq_lens,
        req_pool_indices=req_pool_indices,
        verify_lens=None if layout is None else layout.verify_lens,
        extend_start_loc=None if layout is None else layout.extend_start_loc,
        num_q_tokens=None if layout is None else layout.graph_num_tokens,
    )


def _verify_compress(
    verify_plan: Any,
    *,
    kv_score_buffer: torch.Tensor,
    kv_score_input: torch.Tensor,
    ape: torch.Tensor,
    plan: Any,
    compress_ratio: int,
    head_dim: int,
    out: Optional[torch.Tensor] = None,
    is_online: bool = True,
) -> torch.Tensor:
    """`compress_forward`'s signature, running the fused DSPARK verify compress."""
    assert plan is verify_plan.prefill_plan and is_online and compress_ratio == 128
    state = kv_score_buffer.view(-1, 3 * head_dim)
    return _ops().dspark_verify_compress(
        state, kv_score_input, ape.view(-1, head_dim), verify_plan, out=out
    )


def _is_dspark_target(backend: Any) -> bool:
    model_runner = backend.model_runner
    if getattr(model_runner, "is_draft_worker", False):
        return False
    if torch.version.hip is not None:
        return False  # upstream's online c128 is CUDA-only
    return bool(model_runner.spec_algorithm.is_dspark())


def _live_ragged_layout(forward_batch: Any) -> Optional[Any]:
    spec_info = getattr(forward_batch, "spec_info", None)
    return getattr(spec_info, "ragged_verify_layout", None)
