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

Loud, never silent, once the gate is on: startup (`check_online_c128_dspark_startup`, from
the pool configurator) and the target's controller refuse, one line per reason, every
configuration `online_c128_dspark_rules.startup_refusals` names; an enabled controller
without online c128 state pools, a plan it cannot build, a DSPARK plan it no longer holds
and a commit with no enabled controller to run it are errors. The plan handed to upstream
code is upstream's `CompressorPrefillPlan` type with `copy_` refused: an in-place metadata
copy (`DSV4Metadata.copy_`) would refresh its `plan_c`/`plan_w` but not the rows the fused
verify reads (`row_emit`/`row_len`, the request rows), so a captured DSPARK plan is never
copied into.

The kernel ops are imported lazily: this module imports with torch alone.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from sglang.srt.environ import envs
from sglang.srt.layers.attention.dsv4.online_c128_dspark_rules import (
    GATE_ENV,
    MAX_BANKS,
    config_from_context,
    startup_refusals,
)

logger = logging.getLogger(__name__)

# Largest bank count the series II kernels accept (the rules module keeps it).
DSPARK_MAX_BANKS = MAX_BANKS

_KERNEL_OPS = "sglang.kernels.ops.attention.dsv4.online_c128_dspark"


def _ops() -> Any:
    return importlib.import_module(_KERNEL_OPS)


def online_c128_dspark_env() -> bool:
    """Both switches of this path are on."""
    return (
        envs.SGLANG_OPT_USE_ONLINE_COMPRESS.get()
        and envs.SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK.get()
    )


def _runtime_namespaces() -> Dict[str, Any]:
    """The live process's resolved config namespaces (what `config_from_context` reads)."""
    from sglang.srt.runtime_context import (
        get_device,
        get_disagg,
        get_exec,
        get_parallel,
    )

    return dict(
        exec_=get_exec(), disagg=get_disagg(), device=get_device(), parallel=get_parallel()
    )


def _platform() -> str:
    if torch.version.hip is not None:
        return "rocm"
    return "cuda" if torch.version.cuda is not None else "cpu"


def live_config(*, spec_algorithm: Any, num_draft_tokens: Optional[int]) -> Dict[str, Any]:
    """The rules' config of this process: resolved ServerArgs, environment, torch build."""
    return config_from_context(
        **_runtime_namespaces(),
        spec_algorithm=spec_algorithm,
        num_draft_tokens=num_draft_tokens,
        environ=os.environ,
        platform=_platform(),
    )


def refuse_unsupported(*, spec_algorithm: Any, num_draft_tokens: Optional[int]) -> None:
    """Raise ValueError, one line per reason, if the gate is on and this configuration is
    one the controller has not been shown to handle (`startup_refusals`)."""
    refusals = startup_refusals(
        live_config(spec_algorithm=spec_algorithm, num_draft_tokens=num_draft_tokens)
    )
    if refusals:
        raise ValueError(
            f"{GATE_ENV}=1 refuses this configuration:\n"
            + "\n".join(f"  - {line}" for line in refusals)
        )


def check_online_c128_dspark_startup(spec_algorithm: Any, num_banks: int) -> bool:
    """Startup gate for the pool configurator (called only with the DSPARK env set).

    Raises (ValueError, one line per reason) on every configuration the online C128
    DSPARK path refuses; otherwise this run takes that path: returns True.
    """
    refuse_unsupported(spec_algorithm=spec_algorithm, num_draft_tokens=num_banks)
    logger.warning(
        "DSV4 compressed attention: experimental online c128 + DSPARK verify enabled "
        "(state banks=%d). Validate correctness carefully.",
        num_banks,
    )
    return True


def _refuse_copy(self: Any, other: Any) -> None:
    raise RuntimeError(
        "online c128 DSPARK: an in-place copy of a DSPARK verify plan (DSV4Metadata.copy_) "
        "would refresh plan_c/plan_w but not the rows the fused verify reads (row_emit, "
        "row_len, request rows), so a captured DSPARK plan is never copied into; the verify "
        "metadata paths that copy (metadata glue, early verify metadata) are refused with "
        f"{GATE_ENV}=1"
    )


# The plan types handed to upstream code: upstream's plan type, with copy_ refused.
_PLAN_TYPES: Dict[type, type] = {}


def _dspark_plan_type(base: type) -> type:
    plan_type = _PLAN_TYPES.get(base)
    if plan_type is None:
        plan_type = type(
            "DsparkVerifyPrefillPlan",
            (base,),
            {
                "__slots__": (),
                "__doc__": f"{base.__name__} of a DSPARK verify plan (copy_ refused).",
                "copy_": _refuse_copy,
            },
        )
        _PLAN_TYPES[base] = plan_type
    return plan_type


def is_dspark_plan(plan: Any) -> bool:
    """Whether `plan` is the upstream-typed plan of a DSPARK verify plan."""
    return type(plan) in _PLAN_TYPES.values()


class OnlineC128DsparkController:
    """The backend's online C128 DSPARK verify state (see the module docstring)."""

    def __init__(self, backend: Any):
        self.backend = backend
        target = _is_dspark_target(backend)
        if envs.SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK.get() and not _is_draft(backend):
            # Raises for every configuration the rules refuse (TBO, pdmux, DP, ...).
            refuse_unsupported(
                spec_algorithm=backend.model_runner.spec_algorithm,
                num_draft_tokens=int(
                    backend.token_to_kv_pool.get_online_c128_mtp_max_draft_tokens()
                ),
            )
        self._enabled = online_c128_dspark_env() and target
        # Plans this controller built, keyed by id of the plan upstream code holds (the
        # refusing-copy type): (that plan, the DSPARK verify plan). The ones recorded in
        # CUDA graphs, one per graph shape (rows, packed tokens): a recapture of a shape
        # replaces its plan, so the dict holds at most one per live graph bucket; and the
        # latest eager one.
        self._captured_plans: Dict[int, Tuple[Any, Any]] = {}
        self._captured_by_shape: Dict[Tuple[int, int], int] = {}
        self._eager_plan: Optional[Tuple[Any, Any]] = None
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
        if self._enabled and not self._layer_states():
            raise RuntimeError(
                "online c128 DSPARK: this DSPARK target's KV pool "
                f"({type(backend.token_to_kv_pool).__name__}) has no online c128 state "
                f"pool, so there is nothing to bank; {GATE_ENV}=1 needs a DeepSeek-V4 "
                "model with c128 layers and SGLANG_OPT_USE_ONLINE_COMPRESS=1"
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
            real = int(verify_bs)
            if not 0 <= real <= bs:
                raise RuntimeError(
                    f"online c128 DSPARK: uniform verify of {real} rows, but the verify "
                    f"metadata has {bs} rows"
                )
            lens[:real].fill_(self._verify_width())
            self._uniform_start_loc_buffer()  # allocated here, outside any graph
        else:
            live = _live_ragged_layout(forward_batch)
            if live is None:
                raise RuntimeError(
                    "online c128 DSPARK: compact verify without the batch's ragged layout"
                )
            real = int(live.bs)
            if not 0 <= real <= bs:
                raise RuntimeError(
                    f"online c128 DSPARK: the batch's ragged layout has {real} real rows, "
                    f"but the verify metadata has {bs} rows"
                )
            lens[:real].copy_(live.verify_lens[:real])
        lens[real:].zero_()
        self._prepared_bs = bs

    # -- plan (inside the verify graph, or eager) --------------------------------------

    def build_verify_plan(self, raw_metadata: Any, *, num_q_tokens: int) -> Optional[Any]:
        """The c128 verify plan (an upstream `CompressorPrefillPlan`) from device tensors.

        Reads only tensors whose storage outlives a captured graph: the raw metadata's
        seq lens / request slots / start offsets and this controller's buffers.
        """
        if not self._enabled:
            return None
        states = self._layer_states()
        if not states:  # __init__ refuses this; a plan cannot be built without them
            raise RuntimeError("online c128 DSPARK: verify plan without online c128 state pools")
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
            max_num_reqs=int(pool.get_online_c128_state_num_req_slots()),
            state_dtype=states[0].dtype,  # the JIT module the layers use
        )
        base = verify_plan.prefill_plan
        plan = _dspark_plan_type(type(base))(*base)  # same tensors, copy_ refused
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            shape = (bs, int(num_q_tokens))
            replaced = self._captured_by_shape.pop(shape, None)
            if replaced is not None:
                self._captured_plans.pop(replaced, None)
            self._captured_by_shape[shape] = id(plan)
            self._captured_plans[id(plan)] = (plan, verify_plan)
        else:
            self._eager_plan = (plan, verify_plan)
        return plan

    def owned_plan(self, plan: Any) -> Optional[Any]:
        """The DSPARK verify plan whose upstream-typed plan is `plan`, if this controller
        built it (a graph's, or the latest eager one)."""
        if not self._enabled:
            return None
        for held in (self._eager_plan, self._captured_plans.get(id(plan))):
            if held is not None and held[0] is plan:
                return held[1]
        return None

    # -- per c128 layer ----------------------------------------------------------------

    def compress_fn(self, plan: Any, default: Callable[..., torch.Tensor]) -> Callable:
        """The compress step for a c128 layer: `default` (upstream's `compress_forward`)
        unless `plan` is this controller's verify plan. A DSPARK plan it does not hold (a
        stale eager one, another backend's) is an error: upstream's compress would misread
        its bank slots."""
        if not self._enabled:
            return default
        verify_plan = self.owned_plan(plan)
        if verify_plan is not None:
            return functools.partial(_verify_compress, verify_plan, plan)
        if is_dspark_plan(plan):
            raise RuntimeError(
                "online c128 DSPARK: a c128 layer got a DSPARK verify plan this backend's "
                "controller does not hold (not its latest eager plan nor a captured one)"
            )
        return default

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
        if rows == 0:
            return
        states = self._layer_states()
        if not states:  # __init__ refuses this
            raise RuntimeError("online c128 DSPARK: commit without online c128 state pools")
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
            kv_pool = self.backend.token_to_kv_pool
            pools = getattr(kv_pool, "compress_state_pools", None)
            if pools is None:
                raise RuntimeError(
                    f"online c128 DSPARK: the KV pool ({type(kv_pool).__name__}) has no "
                    "compress_state_pools: not a DeepSeek-V4 pool"
                )
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
    """DSPARK worker hook, right after accept (called with the gate on): commit the target's
    c128 banks. Raises when the target's attention backend has no enabled controller: the
    verify then wrote banks 1..n that nothing would ever commit to bank 0.

    `layout` is the step's ragged verify layout (its real rows' verify lengths), or None for
    uniform verify."""
    backend = model_runner.attn_backend
    controller = getattr(backend, "online_c128_dspark", None)
    if controller is None or not controller.enabled():
        what = "no" if controller is None else "a disabled"
        raise RuntimeError(
            f"online c128 DSPARK: {GATE_ENV}=1 but the target's attention backend "
            f"({type(backend).__name__}) has {what} online c128 DSPARK controller, so the "
            "accepted tokens would never be committed to bank 0; see the startup refusals "
            "(online_c128_dspark_rules.py)"
        )
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
    owned: Any,
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
    if plan is not owned or not is_online or compress_ratio != 128:
        raise RuntimeError(
            "online c128 DSPARK: the fused verify compress got another plan than the one "
            f"it was routed for, or a layer that is not online c128 (online={is_online}, "
            f"ratio={compress_ratio})"
        )
    state = kv_score_buffer.view(-1, 3 * head_dim)
    return _ops().dspark_verify_compress(
        state, kv_score_input, ape.view(-1, head_dim), verify_plan, out=out
    )


def _is_draft(backend: Any) -> bool:
    return bool(getattr(backend.model_runner, "is_draft_worker", False))


def _is_dspark_target(backend: Any) -> bool:
    """The DSPARK target runner (the draft's pool has no c128 state: its controller is
    inert). ROCm and the other refused configurations never get here with the gate on."""
    if _is_draft(backend):
        return False
    return bool(backend.model_runner.spec_algorithm.is_dspark())


def _live_ragged_layout(forward_batch: Any) -> Optional[Any]:
    spec_info = getattr(forward_batch, "spec_info", None)
    return getattr(spec_info, "ragged_verify_layout", None)
