"""CPU checks of tests/gpu/reference_c128.py (the float64 reference the GPU tier compares to)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))

from reference_c128 import OnlineC128Reference, OpenChunk, exact_state, offline_pool, state_row  # noqa: E402

D = 8


def merge(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The kernels' fold of two ``[max | sum | kv]`` rows (c128_online_v2.cuh, stage 4)."""
    m1, s1, k1 = a.split(D)
    m2, s2, k2 = b.split(D)
    m = torch.maximum(m1, m2)
    s1, s2 = s1 * torch.exp(m1 - m), s2 * torch.exp(m2 - m)
    return torch.cat([m, s1 + s2, (k1 * s1 + k2 * s2) / (s1 + s2)])


def _inputs(seed: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ape [128, D], kv and score [tokens, D], float64."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn((rows, D), generator=g, dtype=torch.float64) for rows in (128, tokens, tokens))


def test_chunks_and_state_match_direct_softmax():
    ape, kv, score = _inputs(0, 300)
    ref = OnlineC128Reference(ape)
    out = ref.extend("r", 128, kv, score)  # positions 128..427: closes [128,256) and [256,384)
    assert len(out) == 2
    s = score + ape[torch.arange(128, 428) % 128]
    for j, row in enumerate(out):
        sl = slice(128 * j, 128 * (j + 1))
        assert torch.allclose(row, (torch.softmax(s[sl], 0) * kv[sl]).sum(0))
        assert torch.allclose(row, offline_pool(kv[sl], score[sl], ape))  # chunk positions 0..127
    st = ref.state("r")
    tail = slice(256, 300)
    assert torch.allclose(st[:D], s[tail].max(0).values)
    assert torch.allclose(st[D : 2 * D], torch.exp(s[tail] - s[tail].max(0).values).sum(0))
    assert torch.allclose(st[2 * D :], (torch.softmax(s[tail], 0) * kv[tail]).sum(0))
    pos = torch.arange(384, 428) % 128
    assert torch.allclose(st, exact_state(kv[tail], score[tail], ape[pos]).reshape(-1))


def test_rounds_fold_like_the_kernel_merge():
    ape, kv, score = _inputs(1, 100)
    ref = OnlineC128Reference(ape)
    ref.extend("r", 0, kv[:30], score[:30])
    first = ref.state("r")
    ref.extend("r", 30, kv[30:], score[30:])
    s = score + ape[:100]
    second_alone = state_row(OpenChunk(s[30:], kv[30:]))
    assert torch.allclose(merge(first, second_alone), ref.state("r"))
    with pytest.raises(ValueError):
        ref.extend("r", 64, kv[:1], score[:1])  # prefix does not match the open chunk
    ref.extend("r", 100, kv[:28], score[:28])
    assert ref.state("r") is None  # closed exactly on the boundary
