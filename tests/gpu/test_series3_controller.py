"""GPU: OnlineC128DsparkController driving the series II kernels through a simulated
multi-step DSPARK decode, checked against float64; the `_through_the_backend` tests run every
step through the tree's own DSV4 backend verify path (series3_backend.VerifyBackend: the eager
prep, or the capture/replay preps around real CUDA graphs, then the raw -> full upgrade), with
upstream's triton padding of the compact layout.

Each step: compact ragged verify padded to a token bucket (padding rows with zero
length, or the last real row inflated), static uniform verify padded to a batch bucket, or
an empty bucket (verify_bs == 0); then accept and the one-launch commit over all c128
layers. Checked every step: the plan's closing chunks, the emitted pooled rows, every
written bank, bank 0 after commit, and that no other state row changed (bit-exact, with the
state and the padding tokens poisoned with NaN). The CUDA-graph variant captures plan +
compress once per bucket and replays it, the empty bucket included.

Needs a CUDA GPU with nvcc (tests/gpu/harness.py) and $C128PATCH_TREE: the tree subset
(tests/gpu/tree_subset.py) of a tree patched with series II (kernels) and III (the env in
srt/environ.py, this controller and its rules). Layouts are upstream's own
(`RaggedVerifyLayout.padded_to_bucket` of the tree); the live config the controller checks
at construction is a default single-GPU launch (series3_sim's runtime_context stand-in).
"""

from __future__ import annotations

import functools
import importlib
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # series3_sim

import harness  # noqa: E402  (tests/gpu/conftest.py puts it on the path)
from series3_backend import VerifyBackend  # noqa: E402
from series3_sim import (  # noqa: E402
    SimConfig,
    Simulation,
    install_runtime_context,
    install_triton_standin,
    real_triton,
    run_decode,
    run_graph_decode,
)

ENVS = ("SGLANG_OPT_USE_ONLINE_COMPRESS", "SGLANG_EXPERIMENTAL_ONLINE_C128_DSPARK")
CONTROLLER = "sglang.srt.layers.attention.dsv4.online_c128_dspark"
# fp32 state: fast-math folds vs float64 (upstream's MTP test uses 2e-4). bf16 state: each
# committed step rounds (max, sum, kv) to 8 mantissa bits, and a rounded max skews the next
# fold's old/new weights by up to ~2%: a wiring check (a wrong bank or row is off by O(1)).
TOLERANCE = {torch.float32: 5e-4, torch.bfloat16: 1e-1}


@pytest.fixture(scope="module")
def mod(patched_tree: Path):
    """The controller module of the patched tree (its tree subset: tests/gpu/tree_subset.py)."""
    install_runtime_context()
    return importlib.import_module(CONTROLLER)


@pytest.fixture(scope="module")
def ragged(patched_tree: Path):
    """The tree's own ragged verify layouts (srt/speculative/ragged_verify.py)."""
    install_triton_standin()  # only where triton is missing; the layouts run on CPU tensors
    return importlib.import_module("sglang.srt.speculative.ragged_verify")


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENVS:
        monkeypatch.setenv(name, "1")
    monkeypatch.delenv("SGLANG_EXPERIMENTAL_ONLINE_C128_MTP", raising=False)


def _sim(mod, ragged, backend=None, **kwargs) -> Simulation:
    dtype = kwargs.pop("state_dtype", torch.float32)
    tol = TOLERANCE[dtype]
    cfg = SimConfig(device="cuda", state_dtype=dtype, atol=tol, rtol=tol, **kwargs)
    return Simulation(cfg, mod.OnlineC128DsparkController, mod.commit_after_verify, mod._ops(), ragged, backend)


@pytest.fixture
def backend(patched_tree: Path, monkeypatch: pytest.MonkeyPatch):
    """A factory of the tree's own backend verify path, in compact ragged mode."""
    if not real_triton():
        pytest.skip("triton is not installed: the backend pads compact layouts with upstream's triton kernel")
    monkeypatch.setenv("SGLANG_RAGGED_VERIFY_MODE", "compact")
    return functools.partial(VerifyBackend, patched_tree)


def _record(name: str, sim: Simulation) -> None:
    harness.write_result(
        f"series3_controller_{name}",
        {
            "width": sim.cfg.width,
            "layers": sim.cfg.num_layers,
            "state_dtype": str(sim.cfg.state_dtype),
            "steps": len(sim.reports),
            "emitted_rows": sum(r.emitted for r in sim.reports),
            "banks_checked": sum(r.banks_checked for r in sim.reports),
            "commits_checked": sum(r.committed for r in sim.reports),
            "graph_replays": sim.replays,
            "max_abs_err": sim.max_abs_err,
            "tolerance": sim.cfg.atol,
        },
    )


@pytest.mark.gpu
@pytest.mark.parametrize("width", [4, 8, 10])  # 10: the widest a DSV4 launch runs (the c4 ring), over MTP's 8
def test_decode_fp32(mod, ragged, width: int) -> None:
    sim = _sim(mod, ragged, width=width, num_slots=12, num_layers=3, seed=width)
    reports = run_decode(sim, steps=harness.scaled(30, minimum=5))
    assert any(r.real_rows == 0 for r in reports)
    assert sum(r.emitted for r in reports) > 0 and sum(r.committed for r in reports) > 0
    assert mod._ops().__name__.endswith("online_c128_dspark")  # the real kernels ran
    _record(f"decode_fp32_w{width}", sim)


@pytest.mark.gpu
def test_decode_bf16_state(mod, ragged) -> None:
    sim = _sim(mod, ragged, width=8, num_slots=8, num_layers=2, seed=7, state_dtype=torch.bfloat16)
    reports = run_decode(sim, steps=harness.scaled(15, minimum=5))
    assert sum(r.banks_checked for r in reports) > 0
    _record("decode_bf16", sim)


@pytest.mark.gpu
@pytest.mark.cuda_graph
@pytest.mark.parametrize("width", [8, 10])
def test_decode_cuda_graphs(mod, ragged, width: int) -> None:
    sim = _sim(mod, ragged, width=width, num_slots=8, num_layers=3, seed=100 + width, cuda_graphs=True)
    reports = run_graph_decode(sim, steps=harness.scaled(24, minimum=3))
    assert len(sim.graphs) == 2  # one compact and one static bucket ...
    assert sim.replays == len(reports)  # ... replayed for every step, empty bucket included
    assert any(r.real_rows == 0 for r in reports)
    assert sum(r.emitted for r in reports) > 0
    _record(f"cuda_graphs_w{width}", sim)


@pytest.mark.gpu
def test_decode_through_the_backend(mod, ragged, backend) -> None:
    """Eager: each step's metadata from the tree's `_build_forward_metadata` and
    `make_forward_metadata_from_raw_verify` (compact padding by `_resolve_verify_layout`)."""
    sim = _sim(mod, ragged, backend, width=8, num_slots=12, num_layers=3, seed=300)
    reports = run_decode(sim, steps=harness.scaled(30, minimum=5))
    assert {r.kind for r in reports} == {"compact", "static"} and any(r.real_rows == 0 for r in reports)
    assert sum(r.emitted for r in reports) > 0 and sum(r.committed for r in reports) > 0
    assert 128 not in sim.backend.created  # no host-lens c128 planner
    _record("backend_decode_w8", sim)


@pytest.mark.gpu
@pytest.mark.cuda_graph
@pytest.mark.parametrize("width", [8, 10])
def test_cuda_graph_buckets_through_the_backend(mod, ragged, backend, width: int) -> None:
    """As the decode graph runner does: per bucket, the tree's capture prep, a captured
    upgrade + per-layer fused compress, then every step its replay prep (refreshing the
    captured raw metadata in place) and a replay: a compact token bucket, a static batch
    bucket, and that static bucket replayed with no real row."""
    sim = _sim(mod, ragged, backend, width=width, num_slots=8, num_layers=3, seed=400 + width, cuda_graphs=True)
    reports = run_graph_decode(sim, steps=harness.scaled(24, minimum=3))
    assert len(sim.graphs) == 2 and sim.replays == len(reports)
    assert any(r.real_rows == 0 for r in reports) and sum(r.emitted for r in reports) > 0
    _record(f"backend_cuda_graphs_w{width}", sim)
