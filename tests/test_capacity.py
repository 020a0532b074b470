"""``c128patch capacity``: formula terms, presets, PR #32035, CLI.

Expected values are derived independently here (by hand from the formulas and from
the study's worked example, upstream-study.md §5.3), not read back from the module.
The cross-check against upstream's own configurator is in test_capacity_upstream.py.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from c128patch.capacity import model as cap  # noqa: E402
from c128patch.capacity import pr as capacity_pr  # noqa: E402
from support import invoke  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30


def pro(**kw) -> cap.CapacityInputs:
    base = dict(budget_bytes=40 * GIB, layout=cap.PRO)
    base.update(kw)
    return cap.CapacityInputs(**base)


# ---- presets ----------------------------------------------------------------------


def test_flash_preset_is_43_layers_21_c4_20_c128() -> None:
    f = cap.FLASH
    assert (f.num_layers, f.num_c4, f.num_c128, f.compress_ratios.count(0)) == (43, 21, 20, 2)
    assert f.compress_ratios[:4] == (0, 0, 4, 128) and f.compress_ratios[-1] == 4


def test_pro_preset_is_61_layers_31_c128_30_c4_and_says_unverified() -> None:
    p = cap.PRO
    assert (p.num_layers, p.num_c4, p.num_c128) == (61, 30, 31)
    assert p.compress_ratios[:3] == (128, 128, 4)
    assert "model cards" in p.source and "unverified" in p.source


def test_custom_layout_rejects_unmodelled_ratios() -> None:
    assert cap.custom_layout([0, 4, 128, 4]).num_c4 == 2
    with pytest.raises(ValueError, match="unsupported"):
        cap.custom_layout([0, 2, 4])


# ---- per-token terms ---------------------------------------------------------------


def test_v4_layout_bytes_per_token() -> None:
    # 584 B/token rows, pages padded to 576 B (kv_layout.py): 256 and 64 slots -> 585,
    # a c128 page of 2 slots -> 3 * 576 / 2 = 864.
    inp = pro()
    assert cap.kv_bytes_per_token(inp) == 585.0
    assert cap.kv_bytes_per_token(inp, 4) == 585.0
    assert cap.kv_bytes_per_token(inp, 128) == 864.0
    assert cap.kv_bytes_per_token(replace(inp, formula="0.5.20"), 128) == 584.0
    # v41 rows are 528 B padded to 512: 256 slots -> ceil(528*256/512)*512/256 = 528.
    assert cap.kv_bytes_per_token(replace(inp, kv_layout="v41")) == 528.0


def test_worked_example_bytes_per_token_0523() -> None:
    # study §5.3: 585*61 + (16/256)*10240*30 = 54,885; b = (0.1*54,885 + 5,586.75)*62/61.
    inp = pro()
    assert cap.bytes_per_swa_token(inp) == pytest.approx(54_885.0)
    compressed = 30 * (585 / 4 + 132 / 4) + 31 * (864 / 128)
    assert compressed == pytest.approx(5_586.75)
    assert cap.bytes_per_full_token(inp) == pytest.approx((5_488.5 + 5_586.75) * 62 / 61)
    assert round(cap.bytes_per_full_token(inp), 1) == 11_256.8


def test_bytes_per_token_0520_family() -> None:
    # 0.1*584*61 + 584/4*30 + 584/128*31 + 132/4*30 + 0.1*(16/128)*(8192+2048)*30.
    expect = (3_562.4 + 4_380 + 141.4375 + 990 + 3_840) * 62 / 61
    assert cap.bytes_per_full_token(pro(formula="0.5.20")) == pytest.approx(expect)


def test_speculation_inflates_by_one_draft_layer_and_widens_rings() -> None:
    spec, plain = pro(), pro(speculative=False)
    assert cap.spec_inflation(spec) == 62 / 61 and cap.spec_inflation(plain) == 1.0
    assert (cap.ring_size(spec, 4, False), cap.ring_size(spec, 128, False)) == (16, 256)
    assert (cap.ring_size(plain, 4, False), cap.ring_size(plain, 128, False)) == (8, 128)
    assert cap.ring_size(spec, 128, True) == 1
    # c4 state per SWA token halves with the ring: 8/256 vs 16/256 of 10,240 B per c4 layer.
    assert cap.bytes_per_swa_token(spec) - cap.bytes_per_swa_token(plain) == pytest.approx(
        (16 - 8) / 256 * 10_240 * 30
    )


def test_ring_refuses_more_draft_tokens_than_the_c4_ring_serves() -> None:
    # c4 ring 16 serves 16 - 8 + 2 = 10 draft tokens (get_compress_state_write_pad).
    cap.compute(pro(num_draft_tokens=10))
    with pytest.raises(ValueError, match="c4 ring"):
        cap.compute(pro(num_draft_tokens=11))


# ---- fixed c128 state --------------------------------------------------------------


@pytest.mark.parametrize(
    "r, off_gib, on_gib",
    [(48, 1.529, 0.081), (128, 3.951, 0.209), (256, 7.826, 0.414)],  # study §5.3 table
)
def test_c128_fixed_bytes_match_the_worked_example(r: int, off_gib: float, on_gib: float) -> None:
    inp = pro(max_running_requests=r)
    off = cap.c128_state_fixed_bytes(inp, r, online=False)
    on = cap.c128_state_fixed_bytes(inp, r, online=True)
    # offline: ceil128((R+1)*256 + 257) rows x 2*512 x fp32 x 31; online: (R+3)*(1+8) x 3*512 x 4 x 31.
    assert off == math.ceil(((r + 1) * 256 + 257) / 128) * 128 * 1024 * 4 * 31
    assert on == (r + 3) * 9 * 1536 * 4 * 31
    assert cap.gib(off) == pytest.approx(off_gib, abs=5e-4)
    assert cap.gib(on) == pytest.approx(on_gib, abs=1e-3)  # the study rounds 0.4135 up to 0.414


def test_bf16_state_halves_fixed_bytes_and_no_speculation_has_no_banks() -> None:
    r = 100
    fp32, bf16 = pro(), pro(state_dtype="bf16")
    for online in (False, True):
        assert 2 * cap.c128_state_fixed_bytes(bf16, r, online) == cap.c128_state_fixed_bytes(fp32, r, online)
    plain = pro(speculative=False)
    assert cap.c128_state_rows(plain, r, online=True) == r + 3  # slots + ring(1) + 1, one bank
    assert cap.c128_state_rows(plain, r, online=False) == math.ceil((101 * 128 + 129) / 128) * 128


def test_no_c128_layers_means_no_gain() -> None:
    only_c4 = cap.custom_layout([0, 4, 4, 4])
    res = cap.compute(cap.CapacityInputs(budget_bytes=10 * GIB, layout=only_c4))
    assert res.off.c128_fixed_bytes == res.on.c128_fixed_bytes == 0
    assert res.delta_tokens == 0


# ---- full tokens -------------------------------------------------------------------


def test_full_tokens_are_the_page_floor_of_budget_minus_fixed_over_b() -> None:
    res = cap.compute(pro(budget_bytes=40 * GIB, max_running_requests=48))
    b = res.bytes_per_full_token
    for mode in (res.off, res.on):
        raw = (40 * GIB - mode.c128_fixed_bytes) / b
        assert mode.full_tokens == int(raw) // 256 * 256
        assert mode.full_tokens % 256 == 0
        assert mode.swa_tokens == int(mode.full_tokens * 0.1) // 256 * 256
    # The gain is the fixed-byte saving over b, up to one page of flooring.
    assert abs(res.delta_tokens - res.delta_fixed_bytes / b) < 256
    assert res.delta_tokens == 137_984  # ~138k, study §5.3


def test_gain_grows_with_r_and_more_budget_never_loses_tokens() -> None:
    deltas = [cap.compute(pro(max_running_requests=r)).delta_tokens for r in (48, 128, 256)]
    assert deltas == sorted(deltas) and deltas[0] > 0
    prev = 0
    for gib in (20, 30, 40, 60):
        tokens = cap.compute(pro(budget_bytes=gib * GIB)).off.full_tokens
        assert tokens >= prev
        prev = tokens


def test_dp_divides_r_per_worker() -> None:
    assert cap.compute(pro(max_running_requests=256, attn_dp_size=4)).max_running_requests_per_worker == 64
    assert cap.compute(pro(max_running_requests=2, attn_dp_size=4)).max_running_requests_per_worker == 1
    assert cap.compute(pro(max_running_requests=2, attn_dp_size=4,
                           formula="0.5.22")).max_running_requests_per_worker == 0


def test_estimate_path_clamps_between_2048_and_4096_and_half_the_tokens() -> None:
    res = cap.compute(pro(max_running_requests=None, budget_bytes=40 * GIB))
    b = res.bytes_per_full_token
    full = int(40 * GIB / b)
    assert res.max_running_requests_per_worker == min(max(min(int(full / 1_048_576 * 512), 4096), 2048), full // 2)
    assert res.max_running_requests_per_worker == 2048
    # At 2048 slots the offline ring (~62 GiB) exceeds the budget: upstream refuses.
    assert res.off.refusal and res.off.full_tokens == 0
    short_ctx = cap.compute(pro(max_running_requests=None, budget_bytes=300 * GIB,
                                layout=replace(cap.PRO, context_len=4096)))
    assert short_ctx.max_running_requests_per_worker == 4096


def test_too_small_an_swa_pool_is_reported_as_a_refusal() -> None:
    res = cap.compute(pro(budget_bytes=1 * GIB, max_running_requests=48))
    assert res.off.refusal and "refuses" in res.off.refusal
    ok = cap.compute(pro(budget_bytes=40 * GIB, max_running_requests=48))
    assert ok.off.refusal is None and ok.on.refusal is None


def test_inputs_are_validated() -> None:
    with pytest.raises(ValueError, match="page_size must be a multiple of 128"):
        pro(page_size=200)
    with pytest.raises(ValueError, match=r"swa_full_tokens_ratio must be in \(0, 1\]"):
        pro(swa_full_tokens_ratio=0)
    with pytest.raises(ValueError, match="formula must be one of .*got '0.5.19'"):
        pro(formula="0.5.19")
    with pytest.raises(ValueError, match="the 0.5.20 formula has no KV layout choice"):
        pro(formula="0.5.20", kv_layout="v41")


def test_budget_interval_edges_are_exact() -> None:
    inp = pro(max_running_requests=48)
    target = cap.compute(inp).off.full_tokens
    lo, hi = cap.budget_interval(inp, target, online=False)
    assert cap.compute(replace(inp, budget_bytes=lo)).off.full_tokens == target
    assert cap.compute(replace(inp, budget_bytes=hi - 1)).off.full_tokens == target
    assert cap.compute(replace(inp, budget_bytes=lo - 1)).off.full_tokens == target - 256
    assert cap.compute(replace(inp, budget_bytes=hi)).off.full_tokens == target + 256


# ---- defaults: DSPARK's 48 vs the DSV4 target's 256 --------------------------------


def test_dspark_default_r_48_is_reported_and_dsv4_default_256_is_used() -> None:
    assert cap.DSPARK_DEFAULT_MAX_RUNNING_REQUESTS == 48
    assert cap.DSV4_DEFAULT_MAX_RUNNING_REQUESTS == 256
    assert cap.DSPARK_DEFAULT_DRAFT_TOKENS == 8  # gamma 7 + 1
    default = cap.compute(pro())
    assert default.max_running_requests_per_worker == 256
    d = default.to_dict()
    assert d["dspark_default_max_running_requests"] == 48
    assert d["dsv4_default_max_running_requests"] == 256


# ---- PR #32035 ---------------------------------------------------------------------


def test_pr_numbers_come_out_exactly_at_a_solved_budget() -> None:
    fit = capacity_pr.fit(capacity_pr.PR_HYPOTHESIS)
    assert fit.exact
    inp = capacity_pr.PR_HYPOTHESIS.inputs
    assert (inp.formula, inp.max_running_requests, inp.num_draft_tokens, inp.layout.num_c128) == ("0.5.20", 256, 6, 31)
    lo, hi = fit.both_interval
    for budget in (lo, fit.example_budget(), hi - 1):
        res = cap.compute(capacity_pr.pr_inputs(budget))
        assert res.off.full_tokens == 2_553_344
        assert res.on.full_tokens == 3_167_232
    # The budget is a plausible B200-class KV budget (~39 GiB per GPU).
    assert 38.9 < cap.gib(fit.example_budget()) < 39.2


def test_pr_off_number_predicts_the_on_number() -> None:
    """Solve the budget from 2,553,344 alone; the prediction for online is 3,167,232
    over ~95% of that budget range (the rest is one page short)."""
    fit = capacity_pr.fit(capacity_pr.PR_HYPOTHESIS)
    assert capacity_pr.PR_FULL_TOKENS_ON in fit.predicted_on_from_off
    assert set(fit.predicted_on_from_off) <= {capacity_pr.PR_FULL_TOKENS_ON - 256, capacity_pr.PR_FULL_TOKENS_ON}
    assert fit.off_share_predicting_on > 0.9
    assert capacity_pr.PR_FULL_TOKENS_OFF in fit.predicted_off_from_on
    # Unfloored gain (F_off - F_on)/b lands within a page of the reported 613,888.
    assert abs(fit.unfloored_delta - 613_888) < 256


def test_neighbouring_hypotheses_miss_the_pr_numbers() -> None:
    fits = {h.label: capacity_pr.fit(h) for h in capacity_pr.alternatives()}
    exact = {label for label, f in fits.items() if f.exact}
    # Only the study's ad-hoc R=222 also fits (nothing in upstream yields 222).
    assert exact == {"0.5.23 formula, R=222, W=8"}
    assert fits["0.5.23 formula, R=48 (DSPARK default), W=8"].unfloored_delta < 140_000


# ---- CLI ---------------------------------------------------------------------------


def _run(*args: str):
    return invoke("capacity", *args, as_json=False)


def test_cli_json_output() -> None:
    result = _run("--budget-gib", "40", "--json")
    assert result.code == 0, result.text
    data = json.loads(result.text)
    assert data["budget_bytes"] == 40 * GIB
    assert data["dspark_default_max_running_requests"] == 48
    assert data["max_running_requests_mode"] == "auto"
    by_name = {r["inputs"]["layout"]["name"]: r for r in data["results"]}
    assert set(by_name) == {"flash", "pro"}
    p = by_name["pro"]
    expect = cap.compute(pro(budget_bytes=40 * GIB))
    assert p["off"]["full_tokens"] == expect.off.full_tokens
    assert p["on"]["full_tokens"] == expect.on.full_tokens
    assert p["delta_tokens"] == expect.on.full_tokens - expect.off.full_tokens > 0
    assert p["max_running_requests_per_worker"] == 256


def test_cli_dspark_keyword_and_derived_budget() -> None:
    result = _run("--preset", "pro", "--gpu-gib", "100", "--mem-fraction-static", "0.5",
                  "--non-kv-gib", "10", "--max-running-requests", "dspark", "--json")
    data = json.loads(result.text)
    (p,) = data["results"]
    assert data["budget_bytes"] == 40 * GIB
    assert p["max_running_requests_per_worker"] == 48
    assert cap.gib(p["off"]["c128_fixed_bytes"]) == pytest.approx(1.529, abs=5e-4)
    assert p["delta_tokens"] == 137_984


def test_cli_explain_pr_json() -> None:
    data = json.loads(_run("--preset", "pro", "--budget-gib", "39", "--explain-pr", "--json").text)
    pr = data["pr_32035"]
    assert pr["reported"] == {"off": 2_553_344, "on": 3_167_232, "delta": 613_888}
    assert pr["explanation"]["exact"] is True


def test_cli_table_and_errors() -> None:
    result = _run("--preset", "flash", "--budget-gib", "40", "--max-running-requests", "128")
    assert result.code == 0
    expect = cap.compute(cap.CapacityInputs(budget_bytes=40 * GIB, layout=cap.FLASH, max_running_requests=128))
    assert f"{expect.off.full_tokens:,}" in result.text
    assert f"{expect.on.full_tokens:,}" in result.text
    assert f"{expect.delta_tokens:+,}" in result.text
    _refused(_run("--json"), "give the KV budget one way")  # no budget
    _refused(_run("--budget-gib", "1", "--budget-bytes", "5"), "give the KV budget one way")
    _refused(_run("--budget-gib", "40", "--max-running-requests", "lots"),
             "expected an integer, auto, dspark or estimate; got 'lots'")
    _refused(_run("--budget-gib", "40", "--compress-ratios", "0,2,4"), "unsupported compress ratios [2]")


@pytest.mark.parametrize("value, said", [("0", "must be >= 1"), ("lots", "expected an integer")])
def test_a_bad_max_running_requests_names_the_option(value: str, said: str) -> None:
    """`--max-running-requests 0` said only `Invalid value: must be >= 1`: which value, of the many options?"""
    _refused(_run("--budget-gib", "40", "--max-running-requests", value),
             f"Invalid value for --max-running-requests: {said}")


@pytest.mark.parametrize("option, value, said", [
    ("--dp", "0", "Invalid value for '--dp': 0 is not in the range x>=1."),
    ("--tp", "0", "Invalid value for '--tp': 0 is not in the range x>=1."),
    ("--draft-tokens", "0", "Invalid value for '--draft-tokens': 0 is not in the range x>=1."),
    ("--swa-full-tokens-ratio", "-1", "Invalid value for '--swa-full-tokens-ratio': -1.0 is not in the range 0<x<=1."),
    ("--context-len", "0", "Invalid value for '--context-len': 0 is not in the range x>=1."),
    ("--compress-ratios", "4,x", "Invalid value for --compress-ratios: 'x' is not a ratio"),
])
def test_a_value_out_of_range_names_its_option(option: str, value: str, said: str) -> None:
    """Helper 132: `--dp 0` said `attn_dp_size and tp_size must be >= 1`, the model's field names, not the options;
    `--compress-ratios x` said `invalid literal for int() with base 10`; `--context-len 0` was taken."""
    _refused(_run("--budget-gib", "40", option, value), said)


@pytest.mark.parametrize("args", [["--budget-gib", "39.04"], ["--budget-gib", "39.04", "--explain-pr"],
                                  ["--preset", "pro", "--formula", "0.5.20", "--draft-tokens", "6", "--budget-gib",
                                   "39.04"]])
def test_cli_tables_fit_100_columns_piped(args) -> None:
    """Issue 37: output a person reads. README's capacity command printed a 129-column table piped (233 with its
    notes on one line each); it fits 100, as matrix's does, every number whole (the rows: --markdown, --json)."""
    result = invoke("capacity", *args, as_json=False, env={"COLUMNS": "400"})
    assert result.code == 0, result.err
    assert max(len(line.rstrip()) for line in result.text.splitlines()) <= 100
    for r in json.loads(invoke("capacity", *args).text)["results"]:
        assert f"{r['off']['full_tokens']:,}" in result.text and f"{r['on']['full_tokens']:,}" in result.text


def _refused(result, message: str) -> None:
    """A usage error: exit 2, one line on stderr naming the problem and pointing to --help."""
    assert result.code == 2, result.text
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("c128patch: error: "), result.err
    assert message in lines[0] and "c128patch capacity --help" in lines[0], lines[0]


def test_ci_capacity_table_writes_json(tmp_path: Path) -> None:
    import subprocess

    out = tmp_path / "capacity.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "ci/bench/capacity_table.py"), "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    rows = {(r["inputs"]["layout"]["name"], r["max_running_requests_per_worker"]): r for r in data["rows"]}
    assert set(rows) == {(m, r) for m in ("flash", "pro") for r in (48, 128, 256)}
    for (model, r), row in rows.items():
        expect = cap.compute(cap.CapacityInputs(budget_bytes=data["budget_bytes"], layout=cap.PRESETS[model],
                                                max_running_requests=r))
        assert (row["off"]["full_tokens"], row["on"]["full_tokens"]) == (expect.off.full_tokens, expect.on.full_tokens)
    assert (data["pr_row"]["off"]["full_tokens"], data["pr_row"]["on"]["full_tokens"]) == (2_553_344, 3_167_232)
    assert "2,553,344" in proc.stdout
    # docs/capacity.md's command, piped: within 100 columns as `c128patch capacity`'s tables (it printed 115)
    assert max(len(line.rstrip()) for line in proc.stdout.splitlines()) <= 100, proc.stdout


@pytest.mark.parametrize("args, says", [
    (["--budget-gib", "inf"], "--budget-gib inf: give a finite number"),
    (["--budget-gib", "nan"], "--budget-gib nan: give a finite number"),
    (["--gpu-gib", "inf", "--mem-fraction-static", "0.85", "--non-kv-gib", "1"], "--gpu-gib inf: give a finite"),
    (["--budget-gib", "1e21"], "GiB on one GPU: not one this models"),
    (["--budget-bytes", str(10**24)], "GiB on one GPU: not one this models"),
])
def test_a_budget_not_finite_or_past_any_gpu_is_one_line(args, says) -> None:
    """An outside first-day walk: `inf` was a traceback (OverflowError), 1e21 GiB ran for minutes (the search is
    linear in the tokens it fits)."""
    result = _run(*args)
    assert result.code == 2 and says in result.err and "Traceback" not in result.err, result.err
    assert len(result.err.strip().splitlines()) == 1
