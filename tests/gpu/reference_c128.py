"""Float64 CPU reference for C128 compression (no GPU, no sglang), for the GPU tests.

For each 128-token chunk and channel d: `out[d] = sum_p softmax_p(score[p, d] + ape[p mod 128, d]) * kv[p, d]`.
An open chunk's online state is `[max | sum of exp(x - max) | normalized weighted mean]`
(3 x head_dim), the row layout of the online state pool.

* `offline_pool`: exact softmax pooling of one 128-token chunk (what the offline ring
  path computes).
* `exact_state`: the online state `[max | sum | kv]` of a partial chunk, computed in
  one shot.
* `OnlineC128Reference`: per-request open chunks across extend rounds (prefill + running
  state): the rows the chunks close and the state rows left open.
* `fold_rows`: the sequential online fold over a verify window, vectorized over rows,
  with upstream's bank semantics (bank k = state after k tokens, no bank at a closing
  position, the pooled kv emitted there, restart at chunk position 0).
* `plan_rows`: an independent planner for the DSPARK verify plan (segment walk as in
  upstream's online prefill stage 0 + stage 1, plus the device-side clamps).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

CHUNK = 128
HEAD_DIM = 512
STATE_DIM = 3 * HEAD_DIM
INT32_MAX = 2**31 - 1
MAX_BANKS = 1024  # kMaxBanks in online_c128_dspark.cuh

PLAN_DTYPE = np.dtype(
    [
        ("seq_len", "<u4"),
        ("ragged_id", "<u2"),
        ("buffer_len", "<u2"),
        ("read_page_0", "<i4"),
        ("read_page_1", "<i4"),
    ]
)
assert PLAN_DTYPE.itemsize == 16
INVALID_PLAN = (0xFFFFFFFF, 0, 0, -1, -1)


def pooled(x: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """Softmax pooling over positions of biased scores `x` (score + ape) and values `kv`, `[t, D]`."""
    return (torch.softmax(x, dim=0) * kv).sum(dim=0)


def offline_pool(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor) -> torch.Tensor:
    """Pool one full chunk: kv/score `[128, D]` (chunk positions 0..127), ape `[128, D]`."""
    assert kv.shape[0] == CHUNK and score.shape[0] == CHUNK
    return pooled(score.double() + ape.double(), kv.double())


def online_state(x: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """`[3, D]` float64 (max, sum, kv) of biased scores `x` and values `kv`, `[t, D]`."""
    x, kv = x.double(), kv.double()
    m = x.max(dim=0).values
    e = torch.exp(x - m)
    s = e.sum(dim=0)
    return torch.stack([m, s, (e * kv).sum(dim=0) / s])


def exact_state(
    kv: torch.Tensor, score: torch.Tensor, ape_rows: torch.Tensor
) -> torch.Tensor:
    """Online state of the tokens of one partial chunk, `[3, D]` float64 (max, sum, kv).

    `ape_rows` are the ape rows of the tokens' chunk positions.
    """
    return online_state(score.double() + ape_rows.double(), kv)


@dataclass
class OpenChunk:
    """The tokens of a request's open (not yet closed) chunk: biased scores and kv, float64."""

    score: torch.Tensor  # [t, head_dim], score + ape
    kv: torch.Tensor  # [t, head_dim]


def state_row(chunk: OpenChunk) -> torch.Tensor:
    """`[max | sum | kv]` of an open chunk as one row (3 * head_dim), float64."""
    return online_state(chunk.score, chunk.kv).reshape(-1)


@dataclass
class OnlineC128Reference:
    """Per-request open chunks across extend rounds (requests keyed by any hashable id)."""

    ape: torch.Tensor  # [128, head_dim], float64
    open: dict[object, OpenChunk] = field(default_factory=dict)

    def extend(self, req: object, prefix_len: int, kv: torch.Tensor, score: torch.Tensor) -> list[torch.Tensor]:
        """Fold `kv`/`score` ([e, head_dim], positions prefix_len ...) into `req`; returns the
        compressed rows of the chunks this closes, in position order."""
        kv = kv.double()
        empty = OpenChunk(kv.new_empty((0, kv.shape[1])), kv.new_empty((0, kv.shape[1])))
        chunk = self.open.get(req, empty)
        if chunk.score.shape[0] != prefix_len % CHUNK:
            raise ValueError(f"request {req}: open chunk has {chunk.score.shape[0]} tokens, prefix {prefix_len}")
        pos = torch.arange(prefix_len, prefix_len + kv.shape[0], device=kv.device) % CHUNK
        score = score.double() + self.ape[pos]
        out: list[torch.Tensor] = []
        start = 0
        while start < kv.shape[0]:
            take = min(CHUNK - chunk.score.shape[0], kv.shape[0] - start)
            chunk = OpenChunk(
                torch.cat([chunk.score, score[start : start + take]]),
                torch.cat([chunk.kv, kv[start : start + take]]),
            )
            start += take
            if chunk.score.shape[0] == CHUNK:
                out.append(pooled(chunk.score, chunk.kv))
                chunk = empty
        self.open[req] = chunk
        return out

    def state(self, req: object) -> torch.Tensor | None:
        """The expected state row of `req`, or None when no chunk is open."""
        chunk = self.open.get(req)
        return None if chunk is None or chunk.score.shape[0] == 0 else state_row(chunk)


def merge_token(
    state: torch.Tensor, x: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    """Fold one token (score+ape `x`, value `v`) into states `[..., 3, D]`."""
    m, s, k = state.unbind(dim=-2)
    new_m = torch.maximum(m, x)
    old = s * torch.exp(m - new_m)
    new = torch.exp(x - new_m)
    new_s = old + new
    new_k = (k * old + v * new) / new_s
    return torch.stack([new_m, new_s, new_k], dim=-2)


@dataclass
class FoldResult:
    """Per row b and step k < lens[b]: `states[b, k]` is the state after k+1 tokens,
    `closes[b, k]` whether position seq_before+k closes a chunk (then `states[b, k, 2]`
    is the pooled kv emitted and no bank is written)."""

    states: torch.Tensor  # float64 [B, S, 3, D]
    closes: torch.Tensor  # bool [B, S]
    lens: torch.Tensor  # int64 [B]


def fold_rows(
    init: torch.Tensor,
    seq_before: torch.Tensor,
    lens: torch.Tensor,
    x: torch.Tensor,
    v: torch.Tensor,
) -> FoldResult:
    """Sequential online fold, float64, vectorized over rows.

    init `[B, 3, D]` (bank 0, used only when seq_before % 128 != 0), seq_before/lens
    int64 `[B]`, x/v `[B, S, D]` (score+ape and kv of each row's verify tokens).
    """
    B, S = x.shape[0], x.shape[1]
    D = x.shape[2]
    states = torch.zeros((B, S, 3, D), dtype=torch.float64)
    closes = torch.zeros((B, S), dtype=torch.bool)
    run = init.double().clone()
    for k in range(S):
        pos = (seq_before + k) % CHUNK
        restart = pos == 0
        folded = merge_token(run, x[:, k].double(), v[:, k].double())
        fresh = torch.stack(
            [x[:, k].double(), torch.ones_like(x[:, k], dtype=torch.float64), v[:, k].double()],
            dim=-2,
        )
        new = torch.where(restart[:, None, None], fresh, folded)
        active = k < lens
        run = torch.where(active[:, None, None], new, run)
        states[:, k] = run
        closes[:, k] = active & (pos == CHUNK - 1)
    return FoldResult(states=states, closes=closes, lens=lens.clone())


@dataclass
class RowWindow:
    seq_before: int
    rid: int
    start: int
    len: int


def clamp_row(
    seq_before: int,
    verify_len: int,
    start: int,
    rid: int,
    *,
    num_banks: int,
    num_tokens: int,
    num_slots: int,
) -> RowWindow:
    """The device-side clamps, spelled out: a row is skipped (len 0) when its seq len,
    slot or start is out of range; else len = min(clamp(verify_len, 0, num_banks),
    num_tokens - start)."""
    n = min(max(verify_len, 0), num_banks)
    valid = (
        0 <= seq_before <= INT32_MAX - MAX_BANKS
        and 0 <= rid < num_slots
        and 0 <= start < num_tokens
    )
    n = min(n, num_tokens - start) if valid else 0
    return RowWindow(seq_before=seq_before, rid=rid, start=start, len=n)


@dataclass
class PlanRef:
    plan_c: np.ndarray  # PLAN_DTYPE [num_q_tokens]
    row_emit: np.ndarray  # int32 [B]
    row_len: np.ndarray  # int32 [B]
    windows: list  # RowWindow per row
    total: int  # plan_c entries before truncation to num_q_tokens


def plan_rows(
    seq_lens: np.ndarray,
    verify_lens: np.ndarray,
    extend_start_loc: np.ndarray,
    req_pool_indices: np.ndarray,
    *,
    num_q_tokens: int,
    num_banks: int,
    state_slot_offset: int,
    max_num_reqs: Optional[int] = None,
) -> PlanRef:
    """Independent planner: walk each clamped window's chunk segments like upstream's
    online prefill stage 0, keep the closing ones, then apply stage 1's slot ids. Slots
    outside [0, max_num_reqs) (default: the offset) are skipped."""
    plan_c = np.empty(num_q_tokens, dtype=PLAN_DTYPE)
    plan_c[:] = INVALID_PLAN
    B = len(seq_lens)
    row_emit = np.zeros(B, dtype=np.int32)
    row_len = np.zeros(B, dtype=np.int32)
    windows = []
    count = 0
    for b in range(B):
        w = clamp_row(
            int(seq_lens[b]),
            int(verify_lens[b]),
            int(extend_start_loc[b]),
            int(req_pool_indices[b]),
            num_banks=num_banks,
            num_tokens=num_q_tokens,
            num_slots=state_slot_offset if max_num_reqs is None else max_num_reqs,
        )
        windows.append(w)
        row_emit[b] = count
        row_len[b] = w.len
        pos, end = w.seq_before, w.seq_before + w.len
        while pos < end:
            chunk_start = pos // CHUNK * CHUNK
            seg_end = min(end, chunk_start + CHUNK)
            if seg_end == chunk_start + CHUNK:  # the segment closes its chunk
                last = seg_end - 1
                if count < num_q_tokens:
                    plan_c[count] = (
                        last + 1,
                        w.start + (last - w.seq_before),
                        seg_end - pos,
                        w.rid + state_slot_offset,
                        w.rid,
                    )
                count += 1
            pos = seg_end
    return PlanRef(plan_c=plan_c, row_emit=row_emit, row_len=row_len, windows=windows, total=count)


def decode_plan(plan_bytes: np.ndarray) -> np.ndarray:
    """uint8 `[N, 16]` CompressPlans -> PLAN_DTYPE `[N]`."""
    return np.ascontiguousarray(plan_bytes).view(PLAN_DTYPE).reshape(-1)


def random_state(n: int, gen: torch.Generator) -> torch.Tensor:
    """Valid online states `[n, 3, D]`: any (max, sum > 0, kv) is a reachable state."""
    m = torch.randn((n, HEAD_DIM), generator=gen, dtype=torch.float64) + 2.0
    s = torch.rand((n, HEAD_DIM), generator=gen, dtype=torch.float64) * 60.0 + 1.0
    k = torch.randn((n, HEAD_DIM), generator=gen, dtype=torch.float64)
    return torch.stack([m, s, k], dim=1)
