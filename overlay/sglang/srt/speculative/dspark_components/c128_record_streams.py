"""Opt-in extra ``record_stream`` calls for DSPARK decode/verify.

Upstream DSPARK records only ``batch.seq_lens`` on the forward stream. PR #32035 also
recorded the verify inputs, as EAGLE does; in review that shifted the caching
allocator's block reuse enough to expose an illegal memory access elsewhere (its bug 2).
So the extra records are opt-in: every caller guards them with
``if envs.SGLANG_DSPARK_RECORD_VERIFY_STREAMS.get():`` (default off), and with the gate
off this module is not even imported.
"""

from __future__ import annotations

import torch

from sglang.srt.speculative.spec_utils import (
    record_stream_each,
    record_stream_for_v2_verify,
)


def _current_stream(batch) -> torch.Stream:
    return torch.get_device_module(batch.seq_lens.device).current_stream()


def record_decode_inputs(batch) -> None:
    """``_forward_decode``: the batch tensors verify reads besides ``seq_lens``
    (which upstream already records)."""
    record_stream_each(
        (batch.req_pool_indices, batch.input_ids, batch.out_cache_loc),
        _current_stream(batch),
    )


def record_verify_inputs(batch, verify_input) -> None:
    """``_forward_prepared_verify``, before ``prepare_for_verify`` rebinds
    ``batch.input_ids``: EAGLE's set (seq_lens, req_pool_indices, input_ids,
    out_cache_loc, and the verify input's draft_token / positions / custom_mask ...).
    The rebind target (``draft_token``) is in the set, so nothing needs recording after."""
    record_stream_for_v2_verify(batch, verify_input, _current_stream(batch))
