"""The one-entry test series and the cheap clone that test_hostile and test_trust_git share."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import make_test_series, small_clone

CUH = "python/sglang/kernels/jit/csrc/deepseek_v4/c128_online_v2.cuh"
LINE = "    const uint32_t prefix_len = seq_len - extend_len;\n"
EDIT = {CUH: (LINE, LINE.rstrip("\n") + "  // c128patch test\n")}


@pytest.fixture
def series(tmp_path: Path, sglang_release_repo: Path) -> Path:
    return make_test_series(tmp_path / "series", sglang_release_repo, EDIT)


@pytest.fixture
def tree(sglang_release_repo: Path, tmp_path: Path) -> Path:
    return small_clone(sglang_release_repo, tmp_path / "t").worktree  # type: ignore[return-value]
