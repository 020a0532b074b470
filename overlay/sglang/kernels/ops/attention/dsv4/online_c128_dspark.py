"""Online C128 compressor kernels for DSPARK's ragged target verify (c128patch).

Upstream's MTP online-c128 kernels need W <= 8 uniform verify tokens per request and
commit lazily at the next forward. DSPARK verifies per-row lengths, packed ragged and
padded with zero-length rows, and knows the accepted lengths on the device right after
accept. This module wraps `csrc/deepseek_v4/online_c128_dspark.cuh`:

* `dspark_verify_plan`     device-only verify plan (CUDA-graph capturable);
* `dspark_verify_compress` fused verify: banks 1..n plus the pooled kv of closing chunks;
* `dspark_write_prefix`    banks only (standalone ragged write-prefix);
* `dspark_commit`          bank[accept] -> bank 0 for every c128 layer in one launch.

State rows follow upstream's online layout `[max | sum | kv]` (3 * 512 elements); row
`rid + k * state_slot_stride` is bank k of request slot `rid`, bank 0 the committed state.

Every kernel clamps each row to the same window: `len = min(clamp(verify_len, 0, num_banks),
num_q_tokens - start)`, 0 when the request slot is outside `[0, max_num_reqs)` or the start
or the seq len is out of range. All four take the same `max_num_reqs` (the pool's request
slots, as upstream passes one max_num_reqs per entry point), the write prefix and the commit
the verify's `num_q_tokens` (and the commit its start offsets): a row cut at the end of the
packed input commits only banks its verify wrote, and a slot the verify wrote is committed.
A bad entry of the commit's layer pointer table traps on the device (a CUDA error at the
next synchronization), never a silently skipped layer.

Request slots must be distinct among rows with a non-empty window. Rows that share a slot are
memory safe but race: their emitted rows stay exact, a bank row both write holds one writer's
value per vector, and the slot's commit copies each 16-byte vector from one of its candidates.

With PDL on, the verify kernels read the per-row metadata (seq lens, verify lens, start
offsets, request slots) and `ape` before waiting on the previous kernel, as upstream's
c4/c128 kernels read their plans: produce those tensors before the kernel launched right
before the verify (the plan's own outputs are read after the wait).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Optional, Sequence

import torch

from sglang.kernels.jit.utils import (
    cache_once,
    is_arch_support_pdl,
    load_jit,
    make_cpp_args,
)
from sglang.kernels.ops.attention.dsv4.compress import CompressorPrefillPlan
from sglang.kernels.ops.attention.dsv4.utils import make_name

if TYPE_CHECKING:
    from tvm_ffi.module import Module

HEAD_DIM = 512
STATE_ROW_ELEMS = 3 * HEAD_DIM
_PLAN_BYTES = 16  # sizeof(CompressPlan)
_STATE_DTYPES = (torch.float32, torch.bfloat16)


@cache_once
def _jit_online_c128_dspark_module(
    head_dim: int, dtype_buffer: torch.dtype = torch.float32
) -> Module:
    if head_dim != HEAD_DIM:
        raise ValueError(f"online c128 DSPARK kernels only support head_dim={HEAD_DIM}, got {head_dim}")
    args = make_cpp_args(head_dim, dtype_buffer, is_arch_support_pdl())
    kernel_class = f"DsparkC128Kernel<{args}>"
    return load_jit(
        make_name("online_c128_dspark"),
        *args,
        cuda_files=["deepseek_v4/online_c128_dspark.cuh"],
        cuda_wrappers=[
            ("plan", f"{kernel_class}::run_plan"),
            ("verify_compress", f"{kernel_class}::run_verify"),
            ("write_prefix", f"{kernel_class}::run_write_prefix"),
            ("commit", f"{kernel_class}::run_commit"),
        ],
        extra_cuda_cflags=["-use_fast_math"],
    )


def _module(state_dtype: torch.dtype) -> Module:
    if state_dtype not in _STATE_DTYPES:
        raise TypeError(
            f"online c128 state dtype must be float32 or bfloat16, got {state_dtype}"
        )
    return _jit_online_c128_dspark_module(HEAD_DIM, state_dtype)


def _state_2d(state: torch.Tensor) -> torch.Tensor:
    """Accept the pool's `[rows, 1536]` buffer or the compressor's `[rows, 1, 1536]` view."""
    if state.dim() == 3 and state.shape[1] == 1:
        return state.view(state.shape[0], state.shape[2])
    return state


def _ape_2d(ape: torch.Tensor) -> torch.Tensor:
    if ape.dtype != torch.float32:
        raise TypeError(f"ape must be float32, got {ape.dtype}")
    return ape.reshape(128, HEAD_DIM)


class DsparkVerifyPlan(NamedTuple):
    """Everything the verify kernels and upstream's `compress_norm_rope_store` need.

    `prefill_plan.plan_c` holds one CompressPlan per 128-chunk that closes inside a
    row's clamped verify window (row order), then invalid padding; `plan_w` is all
    invalid (the verify kernel writes the banks itself). `row_emit[b]` is the index of
    row b's first plan_c entry, `row_len[b]` its clamped verify length (0 = skipped).
    """

    prefill_plan: CompressorPrefillPlan
    row_emit: torch.Tensor  # int32 [B]
    row_len: torch.Tensor  # int32 [B]
    seq_lens: torch.Tensor  # int64 [B], before verify
    verify_lens: torch.Tensor  # int32 [B], as given (unclamped)
    extend_start_loc: torch.Tensor  # int32 [B]
    req_pool_indices: torch.Tensor  # int64 [B]
    num_banks: int
    state_slot_offset: int
    max_num_reqs: int

    @property
    def plan_c(self) -> torch.Tensor:
        return self.prefill_plan.plan_c

    @property
    def plan_w(self) -> torch.Tensor:
        return self.prefill_plan.plan_w

    @property
    def num_q_tokens(self) -> int:
        return int(self.prefill_plan.plan_c.shape[0])

    @property
    def batch_size(self) -> int:
        return int(self.row_emit.shape[0])

    def copy_(self, other: DsparkVerifyPlan) -> None:
        """Refresh a captured plan's outputs in place (shapes must match)."""
        if not isinstance(other, DsparkVerifyPlan):
            raise TypeError(f"DsparkVerifyPlan.copy_ needs a DsparkVerifyPlan, got {type(other).__name__}")
        mine = (self.num_banks, self.state_slot_offset, self.max_num_reqs)
        theirs = (other.num_banks, other.state_slot_offset, other.max_num_reqs)
        if mine != theirs:
            raise ValueError(
                f"DsparkVerifyPlan.copy_: (num_banks, state_slot_offset, max_num_reqs) {theirs} "
                f"differ from the captured plan's {mine}"
            )
        self.prefill_plan.copy_(other.prefill_plan)
        self.row_emit.copy_(other.row_emit)
        self.row_len.copy_(other.row_len)


def _one_empty_row(*rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """An empty batch as one zero-length row (no plans, no writes): tvm-ffi rejects the
    zero-size tensors DLPack hands it as non-contiguous."""
    if rows[0].shape[0]:
        return rows
    return tuple(torch.zeros((1,), dtype=r.dtype, device=r.device) for r in rows)


def dspark_verify_plan(
    seq_lens: torch.Tensor,
    verify_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    req_pool_indices: torch.Tensor,
    *,
    num_q_tokens: int,
    num_banks: int,
    state_slot_offset: int,
    max_num_reqs: int,
    state_dtype: torch.dtype = torch.float32,
) -> DsparkVerifyPlan:
    """Build the verify plan on the device (no host sync; CUDA-graph capturable).

    `seq_lens` int64 [B] are lengths before verify; `verify_lens` int32 [B] (0 for
    padding rows, longer rows are clamped to `num_banks`); `extend_start_loc` int32 [B]
    is each row's start in the packed input of `num_q_tokens` rows; request slots outside
    `[0, max_num_reqs)` are skipped (the bound the verify and the commit take too).
    `state_dtype` only picks which compiled module runs the plan (the plan is dtype-free).
    """
    seq_lens, verify_lens, extend_start_loc, req_pool_indices = _one_empty_row(
        seq_lens, verify_lens, extend_start_loc, req_pool_indices
    )
    device = req_pool_indices.device
    batch_size = int(req_pool_indices.shape[0])
    plan_c = torch.empty((num_q_tokens, _PLAN_BYTES), dtype=torch.uint8, device=device)
    plan_w = torch.empty((num_q_tokens, _PLAN_BYTES), dtype=torch.uint8, device=device)
    row_emit = torch.empty((batch_size,), dtype=torch.int32, device=device)
    row_len = torch.empty((batch_size,), dtype=torch.int32, device=device)
    _module(state_dtype).plan(
        seq_lens,
        verify_lens,
        extend_start_loc,
        req_pool_indices,
        plan_c,
        plan_w,
        row_emit,
        row_len,
        int(num_banks),
        int(state_slot_offset),
        int(max_num_reqs),
    )
    return DsparkVerifyPlan(
        prefill_plan=CompressorPrefillPlan(128, plan_c, plan_w, None),
        row_emit=row_emit,
        row_len=row_len,
        seq_lens=seq_lens,
        verify_lens=verify_lens,
        extend_start_loc=extend_start_loc,
        req_pool_indices=req_pool_indices,
        num_banks=int(num_banks),
        state_slot_offset=int(state_slot_offset),
        max_num_reqs=int(max_num_reqs),
    )


def dspark_verify_compress(
    state: torch.Tensor,
    kv_score_input: torch.Tensor,
    ape: torch.Tensor,
    plan: DsparkVerifyPlan,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Fused verify for one c128 layer; returns `out` (fp32 `[num_q_tokens, 512]`).

    Per row: fold its clamped verify tokens from the committed state (bank 0, read
    only), write bank k = state after k tokens (k = 1..n, skipping a closing
    position), and write the pooled kv of every chunk closing in the window to
    `out[row_emit[b] + j]`, the rows `plan.plan_c` describes. Other rows of `out`
    are left untouched.
    """
    state = _state_2d(state)
    if out is None:
        out = kv_score_input.new_empty((plan.num_q_tokens, HEAD_DIM))
    _module(state.dtype).verify_compress(
        state,
        kv_score_input,
        _ape_2d(ape),
        out,
        plan.plan_c,
        plan.seq_lens,
        plan.extend_start_loc,
        plan.req_pool_indices,
        plan.verify_lens,
        plan.row_emit,
        plan.num_banks,
        plan.state_slot_offset,
        plan.max_num_reqs,
    )
    return out


def dspark_write_prefix(
    state: torch.Tensor,
    kv_score_input: torch.Tensor,
    ape: torch.Tensor,
    seq_lens: torch.Tensor,
    verify_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    req_pool_indices: torch.Tensor,
    *,
    num_banks: int,
    state_slot_stride: int,
    num_q_tokens: int,
    max_num_reqs: int,
) -> None:
    """Ragged write-prefix: banks 1..len of each row's window, no emit.

    `num_q_tokens` is the packed input the windows are clamped to, as the plan and the
    fused verify clamp them (`kv_score_input` may have more rows).
    """
    if not req_pool_indices.shape[0]:
        return
    state = _state_2d(state)
    _module(state.dtype).write_prefix(
        state,
        kv_score_input,
        _ape_2d(ape),
        seq_lens,
        verify_lens,
        extend_start_loc,
        req_pool_indices,
        int(num_banks),
        int(state_slot_stride),
        int(num_q_tokens),
        int(max_num_reqs),
    )


@dataclass(frozen=True)
class _StateTableInfo:
    states: tuple  # strong refs: the table holds raw pointers into these
    num_rows: int
    row_elems: int
    dtype: torch.dtype


# Keyed by id(table), with a weak ref to tell a recycled id apart (tensors cannot key a
# WeakKeyDictionary: their __eq__ is elementwise).
_STATE_TABLES: dict[int, tuple[weakref.ref, _StateTableInfo]] = {}


def _table_info(table: torch.Tensor) -> Optional[_StateTableInfo]:
    entry = _STATE_TABLES.get(id(table))
    if entry is None or entry[0]() is not table:
        return None
    return entry[1]


def make_state_ptr_table(states: Sequence[torch.Tensor]) -> torch.Tensor:
    """int64 device tensor of each layer's state base pointer, for `dspark_commit`.

    All layers must share shape, dtype, device and (contiguous) strides. Build it once
    (it copies to the device); it keeps the states alive while it lives.
    """
    states = tuple(_state_2d(s) for s in states)
    if not states:
        raise ValueError("make_state_ptr_table needs at least one state tensor")
    first = states[0]
    if first.dim() != 2 or not first.is_cuda:
        raise ValueError(
            f"state must be a 2-D CUDA tensor [rows, row_elems], got {tuple(first.shape)} on {first.device}"
        )
    for i, s in enumerate(states):
        if (s.shape, s.dtype, s.device, s.stride()) != (
            first.shape,
            first.dtype,
            first.device,
            first.stride(),
        ):
            raise ValueError(
                f"state {i} differs from state 0: shape {tuple(s.shape)} vs {tuple(first.shape)}, "
                f"dtype {s.dtype} vs {first.dtype}, device {s.device} vs {first.device}, "
                f"stride {s.stride()} vs {first.stride()}"
            )
        if not s.is_contiguous():
            raise ValueError(f"state {i} is not contiguous")
        if s.data_ptr() % 16 != 0:
            raise ValueError(f"state {i} is not 16-byte aligned")
    table = torch.tensor(
        [s.data_ptr() for s in states], dtype=torch.int64, device=first.device
    )
    info = _StateTableInfo(
        states=states,
        num_rows=int(first.shape[0]),
        row_elems=int(first.shape[1]),
        dtype=first.dtype,
    )
    _STATE_TABLES[id(table)] = (weakref.ref(table), info)
    weakref.finalize(table, _STATE_TABLES.pop, id(table), None)
    return table


def dspark_commit(
    state_ptrs: torch.Tensor,
    seq_lens: torch.Tensor,
    new_seq_lens: torch.Tensor,
    verify_lens: torch.Tensor,
    req_pool_indices: torch.Tensor,
    *,
    extend_start_loc: torch.Tensor,
    num_q_tokens: int,
    num_banks: int,
    state_slot_stride: int,
    max_num_reqs: int,
    state_dtype: torch.dtype,
    row_elems: int = STATE_ROW_ELEMS,
    num_state_rows: Optional[int] = None,
) -> None:
    """Commit after accept for every layer of `state_ptrs` in one launch (no host sync).

    Takes the verify's row inputs (`seq_lens` before verify, `verify_lens`,
    `extend_start_loc`, `req_pool_indices`, `num_q_tokens`), so each row's window is the
    one its verify folded. Per row: `accept = clamp(new_seq - seq_before, 0, window len)`;
    skipped when 0, when `(seq_before + accept) % 128 == 0`, or when the request slot is
    outside `[0, max_num_reqs)` (the plan's bound); else bank[accept] -> bank 0 in every
    layer. A zero or misaligned entry of `state_ptrs` traps the launch.
    `num_state_rows` defaults to what `make_state_ptr_table` recorded.
    """
    info = _table_info(state_ptrs)
    if info is not None:
        if info.dtype != state_dtype or info.row_elems != row_elems:
            raise ValueError(
                f"state table holds {info.dtype} rows of {info.row_elems} elements, "
                f"commit asked for {state_dtype} rows of {row_elems}"
            )
        if num_state_rows is None:
            num_state_rows = info.num_rows
        elif num_state_rows > info.num_rows:
            raise ValueError(
                f"num_state_rows={num_state_rows} exceeds the table's {info.num_rows} rows"
            )
    if num_state_rows is None:
        raise ValueError(
            "dspark_commit: pass num_state_rows for a table not built by make_state_ptr_table"
        )
    if not req_pool_indices.shape[0]:
        return
    _module(state_dtype).commit(
        state_ptrs,
        seq_lens,
        new_seq_lens,
        verify_lens,
        extend_start_loc,
        req_pool_indices,
        int(num_q_tokens),
        int(num_banks),
        int(state_slot_stride),
        int(max_num_reqs),
        int(num_state_rows),
        int(row_elems),
    )


__all__ = [
    "DsparkVerifyPlan",
    "dspark_commit",
    "dspark_verify_compress",
    "dspark_verify_plan",
    "dspark_write_prefix",
    "make_state_ptr_table",
]
