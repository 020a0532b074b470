"""Upstream's MTP online-c128 kernels called with 0.5.23's signatures on every release.

0.5.23 wraps the three kernels of ``online_c128_mtp.cuh`` in module functions
(``online_c128_mtp_write_prefix_states``, ``_mark_pending``, ``_commit_pending``); 0.5.20-0.5.22
have the same header and JIT module but call it from their controller only
(``_jit_online_c128_mtp_module(head_dim, seq dtype, req dtype, state dtype).<kernel>(...)``).
``resolve`` returns upstream's functions where the release has them, else the same calls its
controller makes, so the benchmark times the same kernels on every release.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

FUNCTIONS = ("online_c128_mtp_write_prefix_states", "online_c128_mtp_mark_pending", "online_c128_mtp_commit_pending")
JIT_MODULE = "_jit_online_c128_mtp_module"


@dataclass(frozen=True)
class UpstreamMTP:
    path: str  # "functions": upstream's own wrappers; "jit module": its controller's calls
    write_prefix_states: Callable[..., None]
    mark_pending: Callable[..., None]
    commit_pending: Callable[..., None]


def resolve(mtp: ModuleType) -> UpstreamMTP:
    """The three calls for ``mtp`` (upstream's ``sglang.kernels.ops.attention.dsv4.online_c128_mtp``)."""
    if all(hasattr(mtp, name) for name in FUNCTIONS):
        return UpstreamMTP("functions", *(getattr(mtp, name) for name in FUNCTIONS))
    if not hasattr(mtp, JIT_MODULE):
        raise RuntimeError(f"{mtp.__name__} has neither {', '.join(FUNCTIONS)} nor {JIT_MODULE}: "
                           "upstream changed its MTP kernels; update ci/bench/upstream_mtp.py")

    def module(head_dim: int, seq_lens: Any, req_pool_indices: Any, state_dtype: Any) -> Any:
        return getattr(mtp, JIT_MODULE)(head_dim, seq_lens.dtype, req_pool_indices.dtype, state_dtype)

    def write_prefix_states(kv_score_input, seq_lens, req_pool_indices, req_to_token, ape, state, batch_size,
                            num_verify_tokens, state_slot_stride, *, head_dim: int) -> None:
        module(head_dim, seq_lens, req_pool_indices, state.dtype).write_prefix_states(
            kv_score_input, seq_lens, req_pool_indices, req_to_token, ape, state, batch_size, num_verify_tokens,
            state_slot_stride)

    def mark_pending(seq_lens, req_pool_indices, pending_seq_lens, batch_size, num_req_slots, *, head_dim: int,
                     state_dtype) -> None:
        module(head_dim, seq_lens, req_pool_indices, state_dtype).mark_pending(
            seq_lens, req_pool_indices, pending_seq_lens, batch_size, num_req_slots)

    def commit_pending(seq_lens, req_pool_indices, req_to_token, pending_seq_lens, state, batch_size,
                       num_verify_tokens, state_slot_stride, num_req_slots, *, head_dim: int) -> None:
        module(head_dim, seq_lens, req_pool_indices, state.dtype).commit_pending(
            seq_lens, req_pool_indices, req_to_token, pending_seq_lens, state, batch_size, num_verify_tokens,
            state_slot_stride, num_req_slots)

    return UpstreamMTP("jit module", write_prefix_states, mark_pending, commit_pending)
