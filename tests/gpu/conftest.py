"""Fixtures for the GPU kernel tier (see harness.py). One `python -m pytest tests/gpu` on an H200
runs it all; without a GPU (or without C128PATCH_TREE) every test skips with the reason."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # `import harness` from the tests here

import harness  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU, nvcc and tvm_ffi (tests/gpu/harness.py)")
    config.addinivalue_line("markers", "cuda_graph: captures a CUDA graph (needs torch's caching allocator)")
    config.addinivalue_line("markers", "device_fault: a kernel is made to trap on purpose (in a child process)")


def pytest_runtest_setup(item: pytest.Item) -> None:
    # compute-sanitizer runs with the caching allocator off, and then every allocation inside a
    # capture is a cudaMalloc, which capture forbids. The kernels those tests capture also run
    # eagerly in the other tests, so the sanitizer still sees every one of them.
    if item.get_closest_marker("cuda_graph") and os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1":
        pytest.skip("CUDA-graph capture needs torch's caching allocator, which is off under compute-sanitizer "
                    "(PYTORCH_NO_CUDA_MEMORY_CACHING=1); the captured kernels run eagerly in other tests")
    # A deliberate device trap is what these tests check; under compute-sanitizer it would be
    # counted as the tool's error. The plain suite runs them.
    if item.get_closest_marker("device_fault") and os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1":
        pytest.skip("a deliberate device trap would count as a sanitizer error; the plain suite runs it")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.gpu)


def _tree_from_env(env: str) -> Path:
    reason = harness.gpu_skip_reason()
    if reason is not None:
        pytest.skip(f"GPU tier: {reason}")
    value = os.environ.get(env)
    if not value:
        pytest.skip(f"GPU tier: {env} is not set (a folder holding sglang/)")
    tree = Path(value).resolve()
    if not (tree / "sglang").is_dir():
        pytest.fail(f"{env}={value} does not hold sglang/")
    return tree


@pytest.fixture(scope="session")
def patched_tree() -> Path:
    """The patched tree, installed in this process (``import sglang...`` works after this)."""
    tree = _tree_from_env(harness.TREE_ENV)
    missing = harness.missing_standin_names(tree)
    if missing:
        pytest.fail(f"upstream imports names the harness stand-ins lack: {missing}")
    harness.install_sglang(tree)
    return tree


@pytest.fixture(scope="session")
def upstream_tree() -> Path:
    """The unpatched tree; NOT installed here (one tree per process): run it through
    ``harness.run_with_tree(upstream_tree, code)``."""
    return _tree_from_env(harness.UPSTREAM_TREE_ENV)


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """A per-test seed: C128PATCH_GPU_SEED (default 0) mixed with the test's name."""
    base = int(os.environ.get("C128PATCH_GPU_SEED", "0"))
    return (base * 1_000_003 + sum(map(ord, request.node.nodeid))) % (2**31)


@pytest.fixture
def rng(seed: int) -> random.Random:
    return random.Random(seed)


@pytest.fixture
def torch_gen(seed: int):
    """A seeded torch.Generator on the CPU (draw there, then move: same numbers on any GPU)."""
    import torch

    return torch.Generator().manual_seed(seed)
