"""Float64 reference of DSV4's online C128 compression (prefill + running state), for GPU tests.

For each 128-token chunk and channel d: ``out[d] = Σ_p softmax_p(score[p,d] + ape[p mod 128, d]) · kv[p,d]``.
An open chunk's state is ``[max | Σ exp(s − max) | normalized weighted mean]`` (3 × head_dim), the
row layout of the online state pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class OpenChunk:
    """The tokens of a request's open (not yet closed) chunk: biased scores and kv, float64."""

    score: torch.Tensor  # [t, head_dim], score + ape
    kv: torch.Tensor  # [t, head_dim]


def pooled(score: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    return (torch.softmax(score, dim=0) * kv).sum(0)


def state_row(chunk: OpenChunk) -> torch.Tensor:
    """``[max | sum | kv]`` of an open chunk, float64."""
    m = chunk.score.max(0).values
    s = torch.exp(chunk.score - m).sum(0)
    return torch.cat([m, s, pooled(chunk.score, chunk.kv)])


@dataclass
class OnlineC128Reference:
    """Per-request open chunks across extend rounds (requests keyed by any hashable id)."""

    ape: torch.Tensor  # [128, head_dim], float64
    open: dict[object, OpenChunk] = field(default_factory=dict)

    def extend(self, req: object, prefix_len: int, kv: torch.Tensor, score: torch.Tensor) -> list[torch.Tensor]:
        """Fold ``kv``/``score`` ([e, head_dim], positions prefix_len ...) into ``req``; returns the
        compressed rows of the chunks this closes, in position order."""
        kv = kv.double()
        empty = OpenChunk(kv.new_empty((0, kv.shape[1])), kv.new_empty((0, kv.shape[1])))
        chunk = self.open.get(req, empty)
        if chunk.score.shape[0] != prefix_len % 128:
            raise ValueError(f"request {req}: open chunk has {chunk.score.shape[0]} tokens, prefix {prefix_len}")
        pos = torch.arange(prefix_len, prefix_len + kv.shape[0], device=kv.device) % 128
        score = score.double() + self.ape[pos]
        out: list[torch.Tensor] = []
        start = 0
        while start < kv.shape[0]:
            take = min(128 - chunk.score.shape[0], kv.shape[0] - start)
            chunk = OpenChunk(
                torch.cat([chunk.score, score[start : start + take]]),
                torch.cat([chunk.kv, kv[start : start + take]]),
            )
            start += take
            if chunk.score.shape[0] == 128:
                out.append(pooled(chunk.score, chunk.kv))
                chunk = empty
        self.open[req] = chunk
        return out

    def state(self, req: object) -> torch.Tensor | None:
        """The expected state row of ``req``, or None when no chunk is open."""
        chunk = self.open.get(req)
        return None if chunk is None or chunk.score.shape[0] == 0 else state_row(chunk)
