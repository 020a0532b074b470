"""CPU checks of tests/gpu/reference_c128.py (the float64 reference the GPU tier compares to)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))

from reference_c128 import OnlineC128Reference, OpenChunk, state_row  # noqa: E402

D = 8


def merge(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The kernels' fold of two ``[max | sum | kv]`` rows (c128_online_v2.cuh, stage 4)."""
    m1, s1, k1 = a.split(D)
    m2, s2, k2 = b.split(D)
    m = torch.maximum(m1, m2)
    s1, s2 = s1 * torch.exp(m1 - m), s2 * torch.exp(m2 - m)
    return torch.cat([m, s1 + s2, (k1 * s1 + k2 * s2) / (s1 + s2)])


def test_chunks_and_state_match_direct_softmax():
    g = torch.Generator().manual_seed(0)
    ape = torch.randn((128, D), generator=g, dtype=torch.float64)
    kv = torch.randn((300, D), generator=g, dtype=torch.float64)
    score = torch.randn((300, D), generator=g, dtype=torch.float64)
    ref = OnlineC128Reference(ape)
    out = ref.extend("r", 128, kv, score)  # positions 128..427: closes [128,256) and [256,384)
    assert len(out) == 2
    s = score + ape[torch.arange(128, 428) % 128]
    for j, row in enumerate(out):
        sl = slice(128 * j, 128 * (j + 1))
        assert torch.allclose(row, (torch.softmax(s[sl], 0) * kv[sl]).sum(0))
    st = ref.state("r")
    tail = slice(256, 300)
    assert torch.allclose(st[:D], s[tail].max(0).values)
    assert torch.allclose(st[D : 2 * D], torch.exp(s[tail] - s[tail].max(0).values).sum(0))


def test_rounds_fold_like_the_kernel_merge():
    g = torch.Generator().manual_seed(1)
    ape = torch.randn((128, D), generator=g, dtype=torch.float64)
    kv = torch.randn((100, D), generator=g, dtype=torch.float64)
    score = torch.randn((100, D), generator=g, dtype=torch.float64)
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
