"""``c128patch.capacity`` against upstream's own ``DSV4PoolConfigurator``.

Each release's real ``pool_configurator.py`` runs through ``upstream_dsv4_probe`` (no
torch, no GPU; see its docstring for what is stood in). The sources come from the cached
release history (the ``sglang_release_repo`` fixture), unpacked once per session.
"""

from __future__ import annotations

import random
import re
from dataclasses import replace
from pathlib import Path

import pytest

import upstream_dsv4_probe as probe  # noqa: E402
from c128patch.capacity import model as cap  # noqa: E402
from c128patch.capacity import pr as capacity_pr  # noqa: E402
from support import unpack_release  # noqa: E402

FORMULA_OF = {v: v[1:] for v in probe.VERSIONS}


@pytest.fixture(scope="module", autouse=True)
def _unpacked_releases(sglang_release_repo: Path, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("releases")
    for version in probe.VERSIONS:
        unpack_release(sglang_release_repo, version, root / version, ["python/sglang/srt", "python/sglang/kernels/ops"])
    old, probe.SGL_RELEASES = probe.SGL_RELEASES, root
    yield
    probe.SGL_RELEASES = old


def _need(version: str) -> None:
    assert probe.available(version), f"sglang {version} sources missing under {probe.SGL_RELEASES}"


def _probe_cfg(inp: cap.CapacityInputs, online: bool) -> probe.ProbeConfig:
    return probe.ProbeConfig(
        compress_ratios=inp.layout.compress_ratios,
        budget_bytes=inp.budget_bytes,
        swa_full_tokens_ratio=inp.swa_full_tokens_ratio,
        max_running_requests=inp.max_running_requests,
        speculative=inp.speculative,
        num_draft_tokens=inp.num_draft_tokens,
        online=online,
        state_dtype={"fp32": "float32", "bf16": "bfloat16"}[inp.state_dtype],
        page_size=inp.page_size,
        kv_layout=inp.kv_layout,
        attn_dp_size=inp.attn_dp_size,
        context_len=inp.layout.context_len,
    )


def _agree(version: str, inp: cap.CapacityInputs) -> None:
    ours = cap.compute(replace(inp, formula=FORMULA_OF[version]))
    for mode in (ours.off, ours.on):
        up = probe.run_upstream(version, _probe_cfg(inp, mode.online))
        where = f"{version} online={mode.online} {inp}"
        assert up["bytes_per_full_token"] == ours.bytes_per_full_token, where
        assert up["max_running_requests_per_worker"] == ours.max_running_requests_per_worker, where
        assert up["c128_fixed_bytes"] == mode.c128_fixed_bytes, where
        if up["refused"] is not None:
            assert mode.refusal is not None, f"upstream refused ({up['refused']}) but we did not: {where}"
            continue
        assert mode.refusal is None, where
        assert up["full_tokens"] == mode.full_tokens, where
        assert up["swa_tokens"] == mode.swa_tokens, where


def _sampled_inputs(n: int, seed: int) -> list[cap.CapacityInputs]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        layout = rng.choice([cap.FLASH, cap.PRO])
        speculative = rng.random() < 0.8
        out.append(
            cap.CapacityInputs(
                budget_bytes=rng.randrange(12 << 30, 90 << 30),
                layout=layout,
                swa_full_tokens_ratio=rng.choice([0.05, 0.1, 0.25, 0.5]),
                max_running_requests=rng.choice([1, 8, 48, 128, 200, 256, 512, 1024]),
                attn_dp_size=rng.choice([1, 1, 2, 4]),
                speculative=speculative,
                num_draft_tokens=rng.randint(2, 10),
                state_dtype=rng.choice(["fp32", "bf16"]),
                page_size=rng.choice([128, 256, 256, 512]),
            )
        )
    return out


CURATED = [
    # The study's worked example (Pro, W=8, ratio 0.1, fp32) at R = 48 / 128 / 256.
    *(cap.CapacityInputs(budget_bytes=40 << 30, layout=cap.PRO, max_running_requests=r) for r in (48, 128, 256)),
    cap.CapacityInputs(budget_bytes=40 << 30, layout=cap.FLASH, max_running_requests=256),
    cap.CapacityInputs(budget_bytes=40 << 30, layout=cap.PRO, speculative=False, max_running_requests=256),
    cap.CapacityInputs(budget_bytes=40 << 30, layout=cap.PRO, state_dtype="bf16", max_running_requests=48),
    # Estimate path (no R): clamp(full/context*512, 2048, 4096), capped at full/2.
    cap.CapacityInputs(budget_bytes=300 << 30, layout=cap.FLASH, max_running_requests=None),
    cap.CapacityInputs(budget_bytes=300 << 30, layout=replace(cap.FLASH, context_len=65536),
                       max_running_requests=None),
    # Too little memory: upstream refuses, and so must we.
    cap.CapacityInputs(budget_bytes=3 << 30, layout=cap.PRO, max_running_requests=1024),
]


@pytest.mark.parametrize("version", probe.VERSIONS)
@pytest.mark.parametrize("inp", CURATED, ids=lambda i: f"{i.layout.name}-R{i.max_running_requests}-"
                         f"{i.state_dtype}-{'spec' if i.speculative else 'nospec'}-{i.budget_bytes >> 30}G")
def test_curated_configs_match_upstream(version: str, inp: cap.CapacityInputs) -> None:
    _need(version)
    _agree(version, inp)


@pytest.mark.parametrize("version", probe.VERSIONS)
def test_sampled_configs_match_upstream(version: str) -> None:
    _need(version)
    for inp in _sampled_inputs(60, seed=32035):
        _agree(version, inp)


def test_v41_layout_matches_upstream_when_the_probe_can_reach_it() -> None:
    # select_dsv4_kv_layout asserts an SM100 GPU for v41 (deepseek_v4_memory_pool.py:198-240),
    # so upstream cannot be asked on CPU; check that the probe reports exactly that.
    _need("v0.5.23")
    inp = cap.CapacityInputs(budget_bytes=40 << 30, layout=cap.PRO, kv_layout="v41")
    with pytest.raises(AssertionError, match="SM100"):
        probe.run_upstream("v0.5.23", _probe_cfg(inp, False))


def test_pr_numbers_from_upstream_0_5_20_configurator() -> None:
    """The July-family configurator (0.5.20) yields both PR numbers at one budget."""
    _need("v0.5.20")
    fit = capacity_pr.fit(capacity_pr.PR_HYPOTHESIS)
    assert fit.exact
    lo, hi = fit.both_interval
    for budget in (lo, fit.example_budget(), hi - 1):
        inp = capacity_pr.pr_inputs(budget)
        off = probe.run_upstream("v0.5.20", _probe_cfg(inp, False))
        on = probe.run_upstream("v0.5.20", _probe_cfg(inp, True))
        assert (off["full_tokens"], on["full_tokens"]) == (
            capacity_pr.PR_FULL_TOKENS_OFF,
            capacity_pr.PR_FULL_TOKENS_ON,
        )
    # Just outside the interval one of the two numbers moves.
    for budget in (lo - 1, hi):
        inp = capacity_pr.pr_inputs(budget)
        got = (
            probe.run_upstream("v0.5.20", _probe_cfg(inp, False))["full_tokens"],
            probe.run_upstream("v0.5.20", _probe_cfg(inp, True))["full_tokens"],
        )
        assert got != (capacity_pr.PR_FULL_TOKENS_OFF, capacity_pr.PR_FULL_TOKENS_ON)


def test_pr_numbers_are_not_reachable_with_the_0_5_23_configurator() -> None:
    _need("v0.5.23")
    inp = replace(capacity_pr.pr_inputs(1), formula="0.5.23")
    off_lo, off_hi = cap.budget_interval(inp, capacity_pr.PR_FULL_TOKENS_OFF, online=False)
    for budget in (off_lo, (off_lo + off_hi) // 2, off_hi - 1):
        got = probe.run_upstream("v0.5.23", _probe_cfg(replace(inp, budget_bytes=budget), False))
        assert got["full_tokens"] == capacity_pr.PR_FULL_TOKENS_OFF
        on = probe.run_upstream("v0.5.23", _probe_cfg(replace(inp, budget_bytes=budget), True))
        assert on["full_tokens"] != capacity_pr.PR_FULL_TOKENS_ON


@pytest.mark.parametrize("version", probe.VERSIONS)
def test_dsv4_default_r_wins_over_dspark_default(version: str) -> None:
    """Upstream's resolution order: the DSV4 hook (R=256) runs before DSPARK's hook (R=48,
    only if still unset), so a DSV4 target without --max-running-requests gets 256."""
    _need(version)
    srt = probe.release_root(version) / "srt/arg_groups"
    dsv4 = (srt / "deepseek_v4_hook.py").read_text()
    assert re.search(r"max_running_requests is None:\s*\n(?:.*\n){0,4}?.*max_running_requests\s*=\s*256", dsv4)
    spec = (srt / "speculative_hook.py").read_text()
    dspark = spec[spec.index("def _handle_dspark"):]
    dspark = dspark[: dspark.index("\ndef ", 1)]
    assert re.search(r"max_running_requests is None:\s*\n(?:.*\n){0,4}?.*max_running_requests\s*=\s*48", dspark)
    pipeline = (srt / "pipeline.py").read_text()
    assert pipeline.index("run_hook(handle_model_specific_adjustments") < pipeline.index(
        "run_hook(handle_speculative_decoding"
    )
    model_hook = (srt / "model_hook.py").read_text()
    body = model_hook[model_hook.index("def handle_model_specific_adjustments"):]
    assert "apply_deepseek_v4_defaults(server_args, model_arch)" in body
    assert cap.DSV4_DEFAULT_MAX_RUNNING_REQUESTS == 256
    assert cap.DSPARK_DEFAULT_MAX_RUNNING_REQUESTS == 48
